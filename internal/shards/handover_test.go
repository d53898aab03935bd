package shards_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
)

// timedHandler records when each shard was acquired and the epoch its
// hold carries.
type timedHandler struct {
	owner    func() *shards.Owner
	mu       sync.Mutex
	acquired map[int]time.Time
	epoch    map[int]uint64
}

func (h *timedHandler) Acquired(ctx context.Context, i int) error {
	hctx, release := h.owner().Hold(context.Background(), i)
	defer release()
	e, _ := shards.HoldEpoch(hctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acquired[i], h.epoch[i] = time.Now(), e
	return nil
}
func (h *timedHandler) Release(int) {}
func (h *timedHandler) Lost(int)    {}

// A shard its holder gave back is taken at once, but with sinks that do
// not fence at their destination (WaitOutCutSends) its new owner starts
// delivering only once the bound on a cut send's late landing has passed
// (LeaseDuration-RenewDeadline, the gap an expired Lease has too); each
// holding raises the shard's epoch, the fencing token's.
func TestReleasedShardWaitsOutCutSends(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := "shard-handover"
	testenv.EnsureNamespace(t, cp, ns)
	leases := cp.Clientset(t).CoordinationV1().Leases(ns)
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			group := fmt.Sprintf("h%d", time.Now().UnixNano()%1e6)
			opts := shards.Options{Leases: leases, Group: group, Shards: 1, WaitOutCutSends: func() bool { return wait },
				LeaseDuration: 3 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}
			start := func(id string) (*shards.Owner, *timedHandler) {
				h := &timedHandler{acquired: map[int]time.Time{}, epoch: map[int]uint64{}}
				o := opts
				o.Identity = id
				owner, err := shards.New(o, h)
				if err != nil {
					t.Fatal(err)
				}
				h.owner = func() *shards.Owner { return owner }
				owner.Run()
				return owner, h
			}
			a, ha := start("a")
			if !testenv.Poll(10*time.Second, 20*time.Millisecond, func() bool { ha.mu.Lock(); defer ha.mu.Unlock(); return !ha.acquired[0].IsZero() }) {
				t.Fatal("a never took the shard")
			}
			b, hb := start("b")
			defer func() { b.Halt(); b.Release() }()
			a.Halt()
			released := time.Now()
			a.Release()
			if !testenv.Poll(15*time.Second, 10*time.Millisecond, func() bool { hb.mu.Lock(); defer hb.mu.Unlock(); return !hb.acquired[0].IsZero() }) {
				t.Fatal("b never took the shard a released")
			}
			hb.mu.Lock()
			after, epochB := hb.acquired[0].Sub(released), hb.epoch[0]
			hb.mu.Unlock()
			gap := opts.LeaseDuration - opts.RenewDeadline
			if wait && after < gap {
				t.Errorf("b delivered %s after a released the shard, want at least %s (cut sends may still land)", after, gap)
			}
			if !wait && after >= gap {
				t.Errorf("b delivered %s after a released the shard: every sink fences, no wait is needed", after)
			}
			if epochB <= ha.epoch[0] {
				t.Errorf("epoch: a held %d, b holds %d; every holding must raise it", ha.epoch[0], epochB)
			}
		})
	}
}

package shards_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// recorder is a Handler that records which shards it delivers.
// Each call takes a while, as a real start (loading the checkpoint) and
// stop (draining) do; calls for one shard must never overlap.
type recorder struct {
	t          *testing.T
	mu         sync.Mutex
	delivering map[int]bool
	inCall     map[int]bool
	calls      []string
}

func (r *recorder) enter(shard int, what string) {
	r.mu.Lock()
	if r.inCall[shard] {
		r.t.Errorf("%s of shard %d while another call for it runs", what, shard)
	}
	r.inCall[shard] = true
	r.calls = append(r.calls, fmt.Sprintf("%s %d", what, shard))
	r.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
}

func (r *recorder) leave(shard int, delivering bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inCall[shard] = false
	if delivering {
		r.delivering[shard] = true
	} else {
		delete(r.delivering, shard)
	}
}

func (r *recorder) Acquired(_ context.Context, shard int) error {
	r.enter(shard, "acquired")
	r.leave(shard, true)
	return nil
}

func (r *recorder) Release(shard int) {
	r.enter(shard, "release")
	r.leave(shard, false)
}

func (r *recorder) Lost(shard int) {
	r.enter(shard, "lost")
	r.leave(shard, false)
}

type replica struct {
	id    string
	owner *shards.Owner
	rec   *recorder
	gone  bool
}

const testShards = 8

// Replicas share the shards evenly, take over the shards of one that
// stops renewing (killed or frozen) once its leases expire, rebalance when
// one joins or leaves, and at no instant do two of them pass the fence of
// one shard, frozen ones included.
func TestOwnersShareShardsAndNeverOverlap(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := "shard-owner"
	testenv.EnsureNamespace(t, cp, ns)
	leases := cp.Clientset(t).CoordinationV1().Leases(ns)
	group := fmt.Sprintf("g%d", time.Now().UnixNano()%1e6)

	var mu sync.Mutex
	var replicas []*replica
	start := func(id string) *replica {
		r := &replica{id: id}
		r.owner, r.rec = startOwner(t, shards.Options{Leases: leases, Group: group, Identity: id, Shards: testShards,
			LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
		mu.Lock()
		replicas = append(replicas, r)
		mu.Unlock()
		return r
	}
	live := func() []*replica {
		mu.Lock()
		defer mu.Unlock()
		return slices.DeleteFunc(slices.Clone(replicas), func(r *replica) bool { return r.gone })
	}

	// The fence watch: every millisecond, no shard passes two fences.
	defer watchFences(t, func() map[string]*shards.Owner {
		mu.Lock()
		defer mu.Unlock()
		owners := map[string]*shards.Owner{}
		for i, r := range replicas {
			owners[fmt.Sprintf("%s#%d", r.id, i)] = r.owner
		}
		return owners
	})()

	// balanced waits until the live replicas deliver every shard once,
	// each between floor and ceil of its share.
	balanced := func(what string) {
		t.Helper()
		var last string
		ok := testenv.Poll(30*time.Second, 50*time.Millisecond, func() bool {
			rs := live()
			counts := map[int]int{}
			var per []int
			last = ""
			for _, r := range rs {
				r.rec.mu.Lock()
				for i := range r.rec.delivering {
					counts[i]++
				}
				per = append(per, len(r.rec.delivering))
				last += fmt.Sprintf("%s=%v ", r.id, r.rec.delivering)
				r.rec.mu.Unlock()
			}
			if len(counts) != testShards {
				return false
			}
			for _, c := range counts {
				if c != 1 {
					return false
				}
			}
			lo, hi := testShards/len(rs), (testShards+len(rs)-1)/len(rs)
			for _, n := range per {
				if n < lo || n > hi {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("%s: not balanced: %s", what, last)
		}
		t.Logf("%s: %s", what, last)
	}

	a, b, _ := start("replica-a"), start("replica-b"), start("replica-c")
	balanced("three replicas")

	// A joins: the others give shards back.
	start("replica-d")
	balanced("four replicas")

	// One leaves gracefully: its shards are released at once.
	a.owner.Halt()
	a.rec.mu.Lock()
	held := len(a.rec.delivering)
	for i := range a.rec.delivering {
		delete(a.rec.delivering, i) // as the bridge stops delivering them before Release
	}
	a.rec.mu.Unlock()
	t0 := time.Now()
	a.owner.Release()
	a.gone = true
	balanced("after a graceful leave")
	t.Logf("a released %d shards; taken over within %s", held, time.Since(t0).Round(time.Millisecond))

	// One is frozen (its loop stops, as under SIGSTOP or SIGKILL): its
	// shards are taken after its leases expire, and its fence closes
	// before anyone else's opens (the watch above).
	b.owner.Freeze()
	b.gone = true
	balanced("after a replica froze")
	for i := range testShards {
		if b.owner.Fence(i) == nil {
			t.Errorf("the frozen replica still passes the fence of shard %d", i)
		}
	}
	for _, r := range live() {
		r.owner.Halt()
		r.owner.Release()
		r.gone = true
	}
	list, err := leases.List(context.Background(), metav1ListGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		if h := l.Spec.HolderIdentity; h != nil && *h != "" && *h != "replica-b" {
			t.Errorf("lease %s still held by %s after every live replica released", l.Name, *h)
		}
	}
}

// startOwner runs an owner with opts, and a recorder of its calls.
func startOwner(t *testing.T, opts shards.Options) (*shards.Owner, *recorder) {
	t.Helper()
	rec := &recorder{t: t, delivering: map[int]bool{}, inCall: map[int]bool{}}
	o, err := shards.New(opts, rec)
	if err != nil {
		t.Fatal(err)
	}
	o.Run()
	return o, rec
}

// watchFences checks, every millisecond until the returned stop is
// called, that no shard passes the fence of two of the owners (named, an
// impostor under a reused identity included), and fails t if one did.
func watchFences(t *testing.T, owners func() map[string]*shards.Owner) (stop func()) {
	var overlaps atomic.Int64
	var first atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	var watching sync.WaitGroup
	watching.Add(1)
	go func() {
		defer watching.Done()
		for ctx.Err() == nil {
			all := owners()
			for i := range testShards {
				var holders []string
				for name, o := range all {
					if o.Fence(i) == nil {
						holders = append(holders, name)
					}
				}
				if len(holders) > 1 {
					overlaps.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("shard %d: %v", i, holders))
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return func() {
		cancel()
		watching.Wait()
		if n := overlaps.Load(); n > 0 {
			t.Errorf("two replicas passed one shard's fence at once (%d samples), first: %v", n, first.Load())
		}
	}
}

func metav1ListGroup(group string) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: shards.LabelGroup + "=" + group}
}

// flaky is a Lease client whose every call fails while down: the
// apiserver unreachable from one replica (or from all).
type flaky struct {
	coordclient.LeaseInterface
	down atomic.Bool
	// lie: updates land but report a failure (a write that timed out on
	// the client after the apiserver committed it).
	lie atomic.Bool
}

var errUnreachable = errors.New("test: apiserver unreachable")

func (f *flaky) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if f.down.Load() {
		return nil, errUnreachable
	}
	return f.LeaseInterface.Get(ctx, name, o)
}

func (f *flaky) List(ctx context.Context, o metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if f.down.Load() {
		return nil, errUnreachable
	}
	return f.LeaseInterface.List(ctx, o)
}

func (f *flaky) Create(ctx context.Context, l *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if f.down.Load() {
		return nil, errUnreachable
	}
	return f.LeaseInterface.Create(ctx, l, o)
}

func (f *flaky) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if f.down.Load() {
		return nil, errUnreachable
	}
	got, err := f.LeaseInterface.Update(ctx, l, o)
	if err == nil && f.lie.Load() {
		return nil, context.DeadlineExceeded
	}
	return got, err
}

func (f *flaky) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	if f.down.Load() {
		return errUnreachable
	}
	return f.LeaseInterface.Delete(ctx, name, o)
}

// A hold that lapses because nobody could reach the apiserver, or because
// its renewals landed but were reported failed, is resumed with nothing
// dropped (no Lost, no Release: the queue survives); one that lapses while
// another replica, or another process under the same identity, can take
// the shard over is lost; and no two ever pass one fence at once.
func TestOwnerLapseIsResumedOrLost(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := "shard-lapse"
	testenv.EnsureNamespace(t, cp, ns)
	leases := cp.Clientset(t).CoordinationV1().Leases(ns)
	group := fmt.Sprintf("l%d", time.Now().UnixNano()%1e6)
	const ld, rd = 2 * time.Second, 1500 * time.Millisecond

	type member struct {
		id     string
		client *flaky
		owner  *shards.Owner
		rec    *recorder
	}
	var mu sync.Mutex
	var ms []*member
	start := func(id string) *member {
		m := &member{id: id, client: &flaky{LeaseInterface: leases}}
		m.owner, m.rec = startOwner(t, shards.Options{Leases: m.client, Group: group, Identity: id, Shards: testShards,
			LeaseDuration: ld, RenewDeadline: rd, RetryPeriod: 200 * time.Millisecond})
		mu.Lock()
		ms = append(ms, m)
		mu.Unlock()
		return m
	}
	start("replica-a")
	start("replica-b")
	var frozen *member
	defer func() {
		for _, m := range ms {
			m.client.down.Store(false)
			if m != frozen {
				m.owner.Halt()
				m.owner.Release()
			}
		}
	}()
	defer watchFences(t, func() map[string]*shards.Owner {
		mu.Lock()
		defer mu.Unlock()
		owners := map[string]*shards.Owner{}
		for i, m := range ms {
			owners[fmt.Sprintf("%s#%d", m.id, i)] = m.owner
		}
		return owners
	})()
	owned := func(m *member) []int { return m.owner.Stats().Owned }
	balanced := func(what string) {
		t.Helper()
		if !testenv.Poll(30*time.Second, 50*time.Millisecond, func() bool {
			a, b := owned(ms[0]), owned(ms[1])
			return len(a) == testShards/2 && len(b) == testShards/2 && len(ms[0].owner.Stats().Lapsed)+len(ms[1].owner.Stats().Lapsed) == 0
		}) {
			t.Fatalf("%s: not balanced: a=%v b=%v", what, owned(ms[0]), owned(ms[1]))
		}
	}
	calls := func(m *member) []string {
		m.rec.mu.Lock()
		defer m.rec.mu.Unlock()
		return slices.Clone(m.rec.calls)
	}
	balanced("two replicas")

	// Both cut off past the lease duration: every hold lapses (fences
	// closed, sends cut), and every one is resumed afterwards.
	before := [2][]int{owned(ms[0]), owned(ms[1])}
	callsBefore := [2]int{len(calls(ms[0])), len(calls(ms[1]))}
	shard := before[0][0]
	held, release := ms[0].owner.Hold(context.Background(), shard)
	defer release()
	for _, m := range ms {
		m.client.down.Store(true)
	}
	time.Sleep(ld + time.Second)
	for _, m := range ms {
		st := m.owner.Stats()
		if !slices.Equal(st.Lapsed, st.Owned) || len(st.Owned) != testShards/2 {
			t.Errorf("%s, cut off: owns %v, lapsed %v; want every shard held and lapsed", m.id, st.Owned, st.Lapsed)
		}
		for _, i := range st.Owned {
			if m.owner.Fence(i) == nil {
				t.Errorf("%s, cut off: passes the fence of shard %d", m.id, i)
			}
		}
	}
	if held.Err() == nil {
		t.Errorf("a send under shard %d's hold was not cut when it lapsed", shard)
	}
	for _, m := range ms {
		m.client.down.Store(false)
	}
	balanced("after both were cut off")
	for k, m := range ms {
		if got := owned(m); !slices.Equal(got, before[k]) {
			t.Errorf("%s holds %v after the outage, %v before: a lapse must resume, not move", m.id, got, before[k])
		}
		if extra := calls(m)[callsBefore[k]:]; len(extra) > 0 {
			t.Errorf("%s: handler calls across a lapse nobody took over: %v; want none (nothing dropped)", m.id, extra)
		}
		// At least each shard once: on a loaded machine a renewal can miss
		// its deadline again after the outage, and that lapse resumes too.
		if st := m.owner.Stats(); st.Resumed < uint64(testShards/2) || st.Lost != 0 {
			t.Errorf("%s: resumed %d, lost %d; want at least %d, 0", m.id, st.Resumed, st.Lost, testShards/2)
		}
	}
	if again, release := ms[0].owner.Hold(context.Background(), shard); again.Err() != nil {
		t.Errorf("shard %d's hold after it resumed: %v", shard, again.Err())
	} else {
		release()
	}

	// Renewals land but report failure (a slow apiserver, client-side
	// timeouts): the holds lapse; the Leases changed only by the writes
	// of their holders, so they resume.
	resumedBefore := [2]uint64{ms[0].owner.Stats().Resumed, ms[1].owner.Stats().Resumed}
	callsBefore = [2]int{len(calls(ms[0])), len(calls(ms[1]))}
	for _, m := range ms {
		m.client.lie.Store(true)
	}
	time.Sleep(rd + time.Second)
	for _, m := range ms {
		m.client.lie.Store(false)
	}
	balanced("after renewals that landed but failed")
	for k, m := range ms {
		if extra := calls(m)[callsBefore[k]:]; len(extra) > 0 {
			t.Errorf("%s: handler calls after renewals that landed: %v; want none", m.id, extra)
		}
		if st := m.owner.Stats(); st.Resumed-resumedBefore[k] < uint64(testShards/2) || st.Lost != 0 {
			t.Errorf("%s: resumed %d, lost %d after renewals that landed; want at least %d, 0", m.id, st.Resumed-resumedBefore[k], st.Lost, testShards/2)
		}
	}

	// a is cut off and another process takes its shards under a's own
	// identity (a restarted pod keeps its name), then freezes: a loses
	// them when it is back, though the Leases name "replica-a".
	aShards := owned(ms[0])
	ms[0].client.down.Store(true)
	impostor := start("replica-a")
	if !testenv.Poll(20*time.Second, 50*time.Millisecond, func() bool {
		return len(owned(ms[1]))+len(owned(impostor)) == testShards && len(owned(impostor)) > 0
	}) {
		t.Fatalf("a's shards were not taken while it was cut off: b %v, the impostor %v", owned(ms[1]), owned(impostor))
	}
	impostor.owner.Freeze()
	frozen = impostor
	ms[0].client.down.Store(false)
	if !testenv.Poll(20*time.Second, 50*time.Millisecond, func() bool { return ms[0].owner.Stats().Lost == uint64(len(aShards)) }) {
		t.Fatalf("a, back, lost %d of the %d shards it held; want all: another process wrote their leases", ms[0].owner.Stats().Lost, len(aShards))
	}
	mu.Lock()
	ms = slices.DeleteFunc(ms, func(m *member) bool { return m == impostor })
	mu.Unlock()
	balanced("after the impostor froze")

	// Only a is cut off: b takes its shards once their Leases expire, and
	// a loses them (its queue dropped: b reconciles) when it is back.
	lostBefore := ms[0].owner.Stats().Lost
	ms[0].client.down.Store(true)
	if !testenv.Poll(20*time.Second, 50*time.Millisecond, func() bool { return len(owned(ms[1])) == testShards }) {
		t.Fatalf("b did not take the shards of a replica cut off: b holds %v", owned(ms[1]))
	}
	ms[0].client.down.Store(false)
	balanced("after a was cut off alone")
	if lost := ms[0].owner.Stats().Lost - lostBefore; lost != uint64(testShards/2) {
		t.Errorf("a lost %d shards it held when cut off alone; want %d (b took them over)", lost, testShards/2)
	}
}

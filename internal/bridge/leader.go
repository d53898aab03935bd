package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderElection makes several replicas share one Lease: the holder
// delivers, the others keep their caches warm and take over (reconciling
// from the shared checkpoint) when the holder's lease runs out.
type LeaderElection struct {
	Namespace, Name string
	// Identity names this replica in the Lease. Default: hostname and pid.
	Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod as in client-go. Defaults 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MemberSelector, with sharding, counts another replica only when its
	// identity is a running Pod in Namespace that matches it and whose
	// uid its member Lease carries (shards.MemberPods); PodUID is this
	// replica's. Nil: every member Lease of the group counts.
	MemberSelector labels.Selector
	PodUID         string
}

// ErrLostLeadership is reported on Fatal when this replica stopped leading.
var ErrLostLeadership = errors.New("lost the leader lease; stopped delivering")

// fencedLock is a resource lock that remembers when this replica last
// wrote the Lease successfully. Deliveries check it before every send: a
// leader sends only within RenewDeadline of its last renewal, and another
// replica can take the Lease only LeaseDuration after it, so two leaders
// never deliver at once, even when this process was frozen and resumes
// before its elector notices.
type fencedLock struct {
	resourcelock.Interface
	base    time.Time     // monotonic origin: the fence must not move with the wall clock
	renewed atomic.Int64  // when the last successful Create/Update started, in nanos since base, +1; 0: never
	epoch   atomic.Uint64 // the Lease's transitions as this replica last wrote it: the fencing token's epoch
}

// Create and Update record when a successful write started: the Lease
// may change on the server any time after that, and the others count its
// duration from when they see it change.
func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := time.Now()
	err := l.Interface.Create(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.epoch.Store(uint64(max(r.LeaderTransitions, 0)))
		l.renewed.Store(int64(start.Sub(l.base)) + 1)
	}
	return err
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := time.Now()
	err := l.Interface.Update(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.epoch.Store(uint64(max(r.LeaderTransitions, 0)))
		l.renewed.Store(int64(start.Sub(l.base)) + 1)
	}
	return err
}

// sinceRenewal is how long ago the last successful write started; never
// renewed, longer than any deadline.
func (l *fencedLock) sinceRenewal() time.Duration {
	at := l.renewed.Load()
	if at == 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Since(l.base) - time.Duration(at-1)
}

// leaseOwner is ownership by one Lease: the replica holding it owns every
// object and delivers them; the others wait with warm caches. It drives
// delivery through two callbacks and fences it, so that another kind of
// ownership (a lease per shard of the objects) can take its place.
//
// Stopping is two steps, because the last checkpoint write falls between
// them: halt (no acquired starts any more; one in progress is cut short
// and waited for), then release (the campaign ends and the Lease is
// released).
type leaseOwner struct {
	le     LeaderElection // defaults applied
	lock   *fencedLock
	logger *slog.Logger

	mu        sync.Mutex // held while acquired runs: halt waits for it
	halted    bool
	haltCtx   context.Context // ends at halt: cuts an acquired in progress short
	haltNow   context.CancelFunc
	campaign  context.CancelFunc // ends the campaign: releases the Lease
	campaigns sync.WaitGroup     // the elector's goroutine
}

// withDefaults fills what le leaves unset.
func (le LeaderElection) withDefaults() LeaderElection {
	if le.Identity == "" {
		host, _ := os.Hostname()
		le.Identity = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if le.LeaseDuration == 0 {
		le.LeaseDuration, le.RenewDeadline, le.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	return le
}

// leaseSettings are the Lease settings of this replica: the leader
// election's, or (sharding without it) the defaults in the bridge's
// namespace.
func (b *Bridge) leaseSettings() LeaderElection {
	le := LeaderElection{Namespace: b.opts.Namespace, Name: "kubebridge"}
	if b.opts.LeaderElection != nil {
		le = *b.opts.LeaderElection
	}
	return le.withDefaults()
}

func newLeaseOwner(le LeaderElection, cs kubernetes.Interface, logger *slog.Logger) *leaseOwner {
	le = le.withDefaults()
	lock := &fencedLock{base: time.Now(), Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}}
	o := &leaseOwner{le: le, lock: lock, logger: logger, campaign: func() {}}
	o.haltCtx, o.haltNow = context.WithCancel(context.Background())
	return o
}

// fence fails once this replica may no longer hold the Lease: more than
// RenewDeadline after its last renewal (see fencedLock).
func (o *leaseOwner) fence() error {
	if since := o.lock.sinceRenewal(); since > o.le.RenewDeadline {
		return fmt.Errorf("not the leader: lease last renewed %s ago", since.Round(time.Millisecond))
	}
	return nil
}

// run campaigns until release. acquired runs when this replica comes to
// hold the Lease, with a context that ends when it stops holding it (or at
// halt); lost runs, after halt, when it stops holding it before release.
func (o *leaseOwner) run(acquired func(context.Context), lost func()) error {
	ctx, cancel := context.WithCancel(context.Background())
	le := o.le
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            o.lock,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            le.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadCtx context.Context) {
				leadCtx, cancel := context.WithCancel(leadCtx)
				defer cancel()
				defer context.AfterFunc(o.haltCtx, cancel)()
				o.mu.Lock()
				defer o.mu.Unlock()
				if o.halted {
					return
				}
				o.logger.Info("became the leader; delivering", "lease", le.Namespace+"/"+le.Name, "identity", le.Identity)
				acquired(leadCtx)
			},
			OnStoppedLeading: func() {
				if ctx.Err() == nil { // not released on purpose
					o.halt()
					lost()
				}
			},
			OnNewLeader: func(id string) {
				if id != le.Identity {
					o.logger.Info("following", "leader", id)
				}
			},
		},
	})
	if err != nil {
		cancel()
		return err
	}
	o.campaign = cancel
	o.campaigns.Add(1)
	go func() {
		defer o.campaigns.Done()
		elector.Run(ctx)
	}()
	return nil
}

// halt makes acquired start nothing from now on, cutting one in progress
// short and waiting for it.
func (o *leaseOwner) halt() {
	o.haltNow()
	o.mu.Lock()
	o.halted = true
	o.mu.Unlock()
}

// release ends the campaign, releasing the Lease, and waits for it.
func (o *leaseOwner) release() {
	o.campaign()
	o.campaigns.Wait()
}

// fail reports a condition that ends the bridge; see Fatal.
func (b *Bridge) fail(err error) {
	select {
	case b.fatal <- err:
	default:
	}
}

// Fatal delivers an error that must end the process, such as
// ErrLostLeadership (a replica that lost its lease restarts as a follower).
func (b *Bridge) Fatal() <-chan error { return b.fatal }

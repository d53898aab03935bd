package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kubebridge/kubebridge/internal/shards"
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

// fencedLock is a resource lock that records each successful write of
// the Lease by this replica in its renewal (shards.Renewal, the fence of
// every kind of ownership): deliveries check it before every send.
type fencedLock struct {
	resourcelock.Interface
	renewal *shards.Renewal
}

// Create and Update record when a successful write started: the Lease
// may change on the server any time after that, and the others count its
// duration from when they see it change.
func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := time.Now()
	err := l.Interface.Create(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewal.Renewed(start, uint64(max(r.LeaderTransitions, 0)))
	}
	return err
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := time.Now()
	err := l.Interface.Update(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewal.Renewed(start, uint64(max(r.LeaderTransitions, 0)))
	}
	return err
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
	halting   chan struct{} // closed at halt: cuts an acquired in progress short
	haltOnce  sync.Once
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

// newLeaseOwner campaigns for le's Lease through cs, recording its
// renewals in r.
func newLeaseOwner(le LeaderElection, cs kubernetes.Interface, r *shards.Renewal, logger *slog.Logger) *leaseOwner {
	le = le.withDefaults()
	lock := &fencedLock{renewal: r, Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}}
	return &leaseOwner{le: le, lock: lock, logger: logger, campaign: func() {}, halting: make(chan struct{})}
}

// leaderScope is the one shard a replica under leader election holds
// behind the Lease whose renewal is r: fenced once this replica may no
// longer hold the Lease, more than RenewDeadline after its last renewal
// (see fencedLock).
func leaderScope(r *shards.Renewal) shards.Scope {
	return shards.LeaseScope(r, func() error {
		if err := r.Check(); err != nil {
			return fmt.Errorf("not the leader: %w", err)
		}
		return nil
	})
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
				defer afterClose(o.halting, cancel)()
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
	o.haltOnce.Do(func() { close(o.halting) })
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

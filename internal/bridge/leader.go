package bridge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	renewed atomic.Int64 // unix nanos of the last successful Create/Update
}

func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewed.Store(time.Now().UnixNano())
	}
	return err
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewed.Store(time.Now().UnixNano())
	}
	return err
}

// runElection campaigns until ctx ends; while leading it runs lead.
func (b *Bridge) runElection(ctx context.Context, cs kubernetes.Interface) error {
	le := *b.opts.LeaderElection
	if le.Identity == "" {
		host, _ := os.Hostname()
		le.Identity = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if le.LeaseDuration == 0 {
		le.LeaseDuration, le.RenewDeadline, le.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	lock := &fencedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}}
	b.fence = func() error {
		if since := time.Since(time.Unix(0, lock.renewed.Load())); since > le.RenewDeadline {
			return fmt.Errorf("not the leader: lease last renewed %s ago", since.Round(time.Millisecond))
		}
		return nil
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            le.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadCtx context.Context) {
				b.logger.Info("became the leader; delivering", "lease", le.Namespace+"/"+le.Name, "identity", le.Identity)
				if err := b.lead(leadCtx); err != nil {
					b.fail(fmt.Errorf("starting to deliver as the leader: %w", err))
				}
			},
			OnStoppedLeading: func() {
				if ctx.Err() != nil {
					return // shutting down: the lease was released on purpose
				}
				b.stopDelivering()
				b.fail(ErrLostLeadership)
			},
			OnNewLeader: func(id string) {
				if id != le.Identity {
					b.logger.Info("following", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		elector.Run(ctx)
	}()
	return nil
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

package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// ownership decides which objects this replica delivers, and when: one
// shape in three sizes. Running alone, one shard held forever (alone);
// under leader election, one shard behind the Lease (leading); sharded, N
// shards each behind its own Lease (sharded). Each shard held is one
// deliverer with the shard's scope (shards.Scope). The Bridge drives it
// through this, knowing nothing of the mode.
type ownership interface {
	// start starts the informers (built, not started; syncCtx bounds
	// their sync) and delivering, or campaigning for what to deliver.
	start(ctx, syncCtx context.Context) error
	// notify hands a notification to the deliverers of the objects it
	// concerns; on the informers' goroutines, never blocking.
	notify(n informer.Notification)
	// deliverers are the deliverers of the shards held.
	deliverers() []*deliverer
	// ready reports whether every shard held reconciled.
	ready() bool
	// still holds the shards still for a reload: none is taken or given
	// back until done; reloaded tells of the reload's config and
	// informers, before they start.
	still(ctx context.Context) (done func(), err error)
	reloaded(cfg *config.Config, in *informer.Informers)
	// halt makes nothing start delivering from now on (teardown's first
	// step; idempotent); stop stops the deliverers, draining until ctx
	// ends, and returns how many events were left; release gives up what
	// is held, after their last checkpoint writes.
	halt()
	stop(ctx context.Context) (left int, err error)
	release() error
}

// alone is the ownership of a replica running alone: one shard, held
// forever, delivered from the start.
type alone struct {
	d       *deliverer
	config  func() *config.Config
	watched func() ([]*filters.Rule, *informer.Informers)
	logger  *slog.Logger
}

func (o *alone) start(ctx, syncCtx context.Context) error {
	cfg := o.config()
	if err := o.d.start(ctx, cfg, cfg.Sinks); err != nil {
		return err
	}
	_, in := o.watched()
	if err := in.Start(syncCtx); err != nil {
		return err
	}
	reconciled(o.d, o.watched, o.logger)
	return nil
}

func (o *alone) notify(n informer.Notification)               { o.d.notify(n) }
func (o *alone) deliverers() []*deliverer                     { return []*deliverer{o.d} }
func (o *alone) ready() bool                                  { return true }
func (o *alone) still(context.Context) (func(), error)        { return func() {}, nil }
func (o *alone) reloaded(*config.Config, *informer.Informers) {}
func (o *alone) halt()                                        {}
func (o *alone) stop(ctx context.Context) (int, error)        { return o.d.stop(ctx, false) }
func (o *alone) release() error                               { return nil }

// reconciled reconciles d's views once the caches synced and logs the
// start.
func reconciled(d *deliverer, watched func() ([]*filters.Rule, *informer.Informers), logger *slog.Logger) {
	replayed := d.reconcileAll()
	rules, in := watched()
	logger.Info("bridge started", "informers", in.Specs(), "rules", len(rules), "sinks", len(d.runs()), "replayedFromCheckpoint", replayed)
}

// leading is the ownership of a replica under leader election: one shard
// behind the Lease (leaseOwner), delivered while this replica leads.
type leading struct {
	alone
	le       LeaderElection // defaults applied
	renewal  *shards.Renewal
	newOwner func() (*leaseOwner, error)
	registry *sinks.Registry
	// reload is held by a reload: the leader starts on the config in
	// force, whole (lead).
	reload *sync.Mutex
	fail   func(error)
	owner  *leaseOwner // set by start
}

func (o *leading) start(_, syncCtx context.Context) error {
	owner, err := o.newOwner()
	if err != nil {
		return err
	}
	o.owner = owner
	// Campaign while the caches fill: a replica elected at once streams
	// its initial list too; the others keep warm caches.
	if err := owner.run(o.lead, o.lost); err != nil {
		return err
	}
	rules, in := o.watched()
	if err := in.Start(syncCtx); err != nil {
		return err
	}
	o.logger.Info("bridge started; campaigning for the leader lease", "informers", in.Specs(), "rules", len(rules))
	return nil
}

// lead starts delivering once this replica holds the Lease (leaseOwner's
// acquired, which ctx's end cuts short), reconciling once the caches
// synced.
func (o *leading) lead(ctx context.Context) {
	// Not while a reload swaps the config and the informers: the leader
	// starts on the config in force, whole. (Shutdown halts the Lease's
	// owner, which ends ctx, before it waits for reloads.)
	for !o.reload.TryLock() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	defer o.reload.Unlock()
	cfg := o.config()
	// A Lease held before (a failover, a release, this pod's previous
	// container) may leave its holder's cut sends still landing: with a
	// sink that cannot refuse them at its destination, wait out their
	// bound first (docs/sharding.md, "Fencing where writes land").
	if o.renewal.Epoch() > 0 && !fencedAtDestinations(o.registry, cfg.Sinks) {
		t := time.NewTimer(o.le.LeaseDuration - o.le.RenewDeadline)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return // no longer leading: lost says so
		}
	}
	err := o.d.start(ctx, cfg, cfg.Sinks)
	if err == nil {
		_, in := o.watched()
		err = in.WaitSynced(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // no longer leading (or halted): lost says so
		}
		o.fail(fmt.Errorf("starting to deliver as the leader: %w", err))
		return
	}
	reconciled(o.d, o.watched, o.logger)
}

// lost stops delivering at once (the Lease is lost; leaseOwner's lost):
// queued events are dropped and the checkpoint is not written again, since
// the next leader owns it now. The process then ends (Fatal).
func (o *leading) lost() {
	if _, err := o.d.stop(cancelled(), true); err != nil {
		o.logger.Warn("stopped delivering after the lease was lost", "error", err)
	}
	o.fail(ErrLostLeadership)
}

// halt ends a leader starting (it holds the reload lock) and makes
// nothing start from now on.
func (o *leading) halt() {
	if o.owner != nil {
		o.owner.halt()
	}
}

// release ends the campaign, releasing the Lease: after the last
// checkpoint write.
func (o *leading) release() error {
	if o.owner != nil {
		o.owner.release()
	}
	return nil
}

// newOwnership returns the ownership b's options ask for: sharded, each
// shard held gets a deliverer of its own; alone, the one shard is held
// forever; under leader election, behind the Lease, whose renewals the
// leaseOwner records.
func (b *Bridge) newOwnership(latency *prometheus.HistogramVec) ownership {
	config := func() *config.Config { return b.opts.Config }
	if sc := b.opts.Config.Sharding; sc != nil {
		return newSharded(shardedOptions{Sharding: *sc, Lease: b.leaseSettings(), Clients: b.clients, Registry: b.opts.Sinks, Host: b.host,
			Logger: b.logger, Latency: latency, CheckpointInterval: b.opts.CheckpointInterval, ReloadDrain: b.opts.ReloadDrain,
			SyncTimeout: b.opts.SyncTimeout, Config: config, Watched: b.snapshot, Caches: &b.caches, Fail: b.fail})
	}
	scope, renewal := shards.Forever(), (*shards.Renewal)(nil)
	le := b.opts.LeaderElection
	if le != nil {
		renewal = shards.NewRenewal(le.withDefaults().RenewDeadline)
		scope = leaderScope(renewal)
	}
	one := alone{config: config, watched: b.snapshot, logger: b.logger, d: newDeliverer(delivererOptions{
		Registry:           b.opts.Sinks,
		Host:               b.host,
		Logger:             b.logger,
		Source:             b.source,
		OpenStore:          b.openCheckpoint,
		CheckpointInterval: b.opts.CheckpointInterval,
		Scope:              scope,
		Reading:            b.readingCaches,
		Latency:            latency,
	})}
	if le == nil {
		return &one
	}
	logger := b.logger
	return &leading{alone: one, le: le.withDefaults(), renewal: renewal, registry: b.opts.Sinks, reload: &b.reloadMu, fail: b.fail,
		newOwner: func() (*leaseOwner, error) {
			c, err := b.clients()
			if err != nil {
				return nil, err
			}
			return newLeaseOwner(*le, c.Kube, renewal, logger), nil
		}}
}

// replaying is the ownership of a standalone replay (Replay): one
// deliverer, for one sink, without a checkpoint (a running bridge owns
// it), handed one reading of the view rather than notified.
type replaying struct{ alone }

func (o *replaying) start(_, syncCtx context.Context) error {
	_, in := o.watched()
	return in.Start(syncCtx)
}

func (o *replaying) notify(informer.Notification) {}

func (o *replaying) stop(ctx context.Context) (int, error) { return o.d.stop(ctx, true) }

// afterClose calls f once ch is closed, unless the returned stop is called
// first; stop waits for f if it runs, and may be called again.
func afterClose(ch <-chan struct{}, f func()) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ch:
			f()
		case <-done:
		}
	}()
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

var (
	_ ownership = (*alone)(nil)
	_ ownership = (*leading)(nil)
	_ ownership = (*sharded)(nil)
	_ ownership = (*replaying)(nil)
)

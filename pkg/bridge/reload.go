package bridge

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// reloadDrain bounds how long a removed sink may drain its queue.
const reloadDrain = 30 * time.Second

// Reload applies a new config to the running bridge. It is checked first
// (against the cluster too); a config with problems is refused and the
// running one stays, untouched. Otherwise: sinks whose settings did not
// change keep their queues and workers; new (or changed) sinks start;
// removed ones stop taking events, drain for up to 30s and close. The
// informers are rebuilt for the new rules, and each sink is reconciled with
// its checkpoint, so changes made during the swap are delivered and new
// rules deliver their current view.
//
// The cluster name and the checkpoint cannot change without a restart.
func (b *Bridge) Reload(ctx context.Context, cfg *config.Config) error {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	if !b.started.Load() {
		return errors.New("the bridge is not running")
	}
	if b.opts.LeaderElection != nil {
		return errors.New("live reload with leader election is not supported; roll the pods instead")
	}
	old := b.opts.Config
	if cfg.Cluster != old.Cluster || !reflect.DeepEqual(cfg.Checkpoint, old.Checkpoint) {
		return errors.New("cluster and checkpoint cannot change without a restart")
	}
	info, problems, err := Preflight(ctx, cfg, b.opts.REST)
	if err != nil {
		return fmt.Errorf("checking the new config against the cluster: %w", err)
	}
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}

	oldSinks := map[string]config.Sink{}
	for _, sc := range old.Sinks {
		oldSinks[sc.Name] = sc
	}
	var added []config.Sink
	keep := map[string]bool{}
	for _, sc := range cfg.Sinks {
		if prev, ok := oldSinks[sc.Name]; ok && reflect.DeepEqual(prev, sc) {
			keep[sc.Name] = true
			continue
		}
		added = append(added, sc)
	}
	// Build the new sinks before anything changes: a sink that cannot be
	// built leaves the running config as it is.
	fresh := map[string]sinks.Sink{}
	for _, sc := range added {
		s, err := b.opts.Sinks.Create(ctx, sinks.Settings{Config: sc, Logger: b.logger.With("sink", sc.Name)})
		if err != nil {
			for _, f := range fresh {
				_ = f.Close(ctx)
			}
			return fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		fresh[sc.Name] = s
	}

	// Swap: hold live events, stop the old informers.
	b.mode.Store(modeHold)
	b.informers.Stop()
	recorder := b.recorder.Load()
	built := map[string]sinks.Sink{}
	deliveries := map[string]*sinks.Delivery{}
	var order, removed []*sinks.Delivery
	for _, d := range b.Deliveries() {
		if keep[d.Name] {
			deliveries[d.Name] = d
			built[d.Name] = b.built[d.Name]
		} else {
			removed = append(removed, d)
		}
	}
	for name, s := range fresh {
		built[name] = s
	}
	for _, sc := range cfg.Sinks {
		d := deliveries[sc.Name]
		if d == nil {
			if d, err = b.startDelivery(sc, built, recorder); err != nil {
				b.fail(fmt.Errorf("reload: %w", err))
				return err
			}
			deliveries[sc.Name] = d
			s := fresh[sc.Name]
			b.closers = append(b.closers, func(ctx context.Context) error { return s.Close(ctx) })
		}
		order = append(order, d)
	}
	for _, d := range removed {
		d.Close() // drains, then Run returns
		s := b.built[d.Name]
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			select {
			case <-d.Done():
			case <-time.After(reloadDrain):
				b.logger.Warn("removed sink did not drain in time", "sink", d.Name, "pending", d.Pending())
			}
			_ = s.Close(context.Background())
		}()
	}
	b.gateMu.Lock()
	b.deliveries, b.order, b.built = deliveries, order, built
	b.gateMu.Unlock()

	if err := b.buildInformers(cfg, info); err != nil {
		b.fail(fmt.Errorf("reload: %w", err))
		return err
	}
	syncCtx, cancel := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancel()
	if err := b.informers.Start(syncCtx); err != nil {
		b.fail(fmt.Errorf("reload: %w", err))
		return err
	}
	replayed, err := b.reconcile(ctx)
	if err != nil {
		b.fail(fmt.Errorf("reload: %w", err))
		return err
	}
	b.releaseGate()
	b.opts.Config = cfg
	b.logger.Info("config reloaded", "sinksKept", len(keep), "sinksStarted", len(added), "sinksRemoved", len(removed),
		"rules", len(cfg.Rules), "replayedFromCheckpoint", replayed)
	return nil
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// defaultReloadDrain bounds how long a replaced sink may drain its queue
// (Options.ReloadDrain). What it leaves is not lost: its successor starts
// from the checkpoint, which holds what the old one had acknowledged, and
// the reconciliation sends the rest.
const defaultReloadDrain = 30 * time.Second

// ErrReloadAborted wraps a reload that failed after the swap began: the
// bridge then stops (Fatal), and the next start reconciles from the
// checkpoint.
var ErrReloadAborted = errors.New("reload failed while being applied; the bridge stops")

// Reload applies a new config to the running bridge. It is checked first
// (against the cluster too); a config with problems is refused and the
// running one stays, untouched. Otherwise: sinks whose settings did not
// change keep their queues and workers; new (or changed) sinks start;
// changed and removed ones stop taking events, drain for up to 30s and
// close before their replacement starts from the checkpoint. The informers
// are rebuilt for the new rules, and each sink's view is reconciled, so
// changes made during the swap are delivered, new rules deliver their
// current view, and objects that a changed rule no longer selects are
// deleted (kbreason "unmatched").
//
// The cluster name and the checkpoint cannot change without a restart.
func (b *Bridge) Reload(ctx context.Context, cfg *config.Config) error {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	if !b.started.Load() {
		return errors.New("the bridge is not running")
	}
	if b.sharded != nil {
		return errors.New("live reload with sharding is not supported; roll the pods instead")
	}
	old := b.opts.Config
	if cfg.Cluster != old.Cluster || !reflect.DeepEqual(cfg.Checkpoint, old.Checkpoint) {
		return errors.New("cluster and checkpoint cannot change without a restart")
	}
	if problems := b.gated(cfg); len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	info, problems, err := Preflight(ctx, cfg, b.opts.REST)
	if err != nil {
		return fmt.Errorf("checking the new config against the cluster: %w", err)
	}
	if errs := Errors(problems); len(errs) > 0 {
		return &ConfigError{Problems: errs}
	}
	b.warn(problems)

	// A replica waiting for the leader Lease delivers nothing: it takes
	// the new rules and informers (warm caches for a take-over), and starts
	// its sinks on the new config when it leads.
	prev := b.deliver.currentSet()
	if prev == nil {
		return b.reloadStandby(ctx, cfg, info)
	}
	if !b.deliver.delivering() {
		return errors.New("the bridge is stopping")
	}

	// Build the new sinks before anything changes: a sink that cannot be
	// built leaves the running config as it is.
	cfgs := cfg.Sinks
	next, retired, err := buildSinkSet(ctx, b.opts.Sinks, cfgs, prev, b.logger)
	if err != nil {
		return err
	}

	// Swap. No notification arrives while the informers are stopped.
	_, oldInformers := b.snapshot()
	oldInformers.Stop()
	b.opts.Config = cfg
	if err := b.deliver.swap(ctx, cfg, next, retired, b.opts.ReloadDrain); err != nil {
		return b.abortReload(err)
	}
	if err := b.buildInformers(cfg, info); err != nil {
		return b.abortReload(err)
	}
	syncCtx, cancel := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancel()
	if err := b.informers.Start(syncCtx); err != nil {
		return b.abortReload(err)
	}
	started, replayed, err := b.deliver.adopt(ctx, prev, next)
	if err != nil {
		return b.abortReload(err)
	}
	b.logger.Info("config reloaded", "sinksKept", len(next.order)-started, "sinksStarted", started, "sinksStopped", len(retired),
		"rules", len(cfg.Rules), "replayedFromCheckpoint", replayed)
	return nil
}

// reloadStandby applies cfg on a replica that does not deliver (it waits
// for the leader Lease): the informers are rebuilt for the new rules.
func (b *Bridge) reloadStandby(ctx context.Context, cfg *config.Config, info *ClusterInfo) error {
	_, oldInformers := b.snapshot()
	oldInformers.Stop()
	b.opts.Config = cfg
	if err := b.buildInformers(cfg, info); err != nil {
		return b.abortReload(err)
	}
	syncCtx, cancel := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancel()
	if err := b.informers.Start(syncCtx); err != nil {
		return b.abortReload(err)
	}
	b.logger.Info("config reloaded", "standby", true, "rules", len(cfg.Rules), "sinks", len(cfg.Sinks))
	return nil
}

// abortReload stops the bridge after a reload failed midway.
func (b *Bridge) abortReload(err error) error {
	err = fmt.Errorf("%w: %w", ErrReloadAborted, err)
	b.fail(err)
	return err
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/internal/preflight"
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
// It applies to every deliverer this replica runs: alone the one, under
// leader election the leader's (a replica waiting for the Lease takes the
// new rules and informers, and starts on the new config when it leads),
// sharded one per shard held. A shard is not taken or given back while a
// reload applies (sharded.turn): a shard taken meanwhile starts on the
// new config once it is done.
//
// The cluster name, the checkpoint and the sharding cannot change without
// a restart.
func (b *Bridge) Reload(ctx context.Context, cfg *config.Config) error {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	if !b.started.Load() {
		return errors.New("the bridge is not running")
	}
	old := b.opts.Config
	if cfg.Cluster != old.Cluster || !reflect.DeepEqual(cfg.Checkpoint, old.Checkpoint) {
		return errors.New("cluster and checkpoint cannot change without a restart")
	}
	if !reflect.DeepEqual(cfg.Sharding, old.Sharding) {
		return errors.New("sharding cannot change without a restart (the checkpoint's views are laid out by it)")
	}
	if problems := b.gated(cfg); len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	info, problems, err := b.preflight(ctx, cfg)
	if err != nil {
		return fmt.Errorf("checking the new config against the cluster: %w", err)
	}
	if errs := preflight.Errors(problems); len(errs) > 0 {
		return &ConfigError{Problems: errs}
	}
	b.warn(problems)

	done, err := b.own.still(ctx)
	if err != nil {
		return err
	}
	defer done()
	// The deliverers that deliver now. None: a replica waiting for the
	// leader Lease (or holding no shard) takes the new rules and
	// informers (warm caches for a take-over).
	var swaps []*swapping
	for _, d := range b.deliverers() {
		prev := d.currentSet()
		if prev == nil {
			continue // waiting for the Lease: never started
		}
		if !d.delivering() {
			continue // stopping (a shard or the Lease lost): its stop follows
		}
		swaps = append(swaps, &swapping{d: d, prev: prev})
	}

	// Build the new sinks before anything changes: a sink that cannot be
	// built leaves the running config as it is.
	for k, sw := range swaps {
		sw.next, sw.retired, err = buildSinkSet(ctx, sw.d.opts.Sinks, cfg.Sinks, sw.prev, b.logger)
		if err != nil {
			for _, built := range swaps[:k] {
				built.discard(ctx)
			}
			return err
		}
	}

	// Swap. No notification arrives while the informers are stopped, and
	// no view is reconciled against the caches until the new ones synced
	// and every deliverer adopted its new set.
	_, oldInformers := b.snapshot()
	oldInformers.Stop()
	b.caches.Lock()
	defer b.caches.Unlock()
	b.opts.Config = cfg
	if err := eachSwap(swaps, func(sw *swapping) error {
		return sw.d.swap(ctx, cfg, sw.next, sw.retired, b.opts.ReloadDrain)
	}); err != nil {
		return b.abortReload(err)
	}
	if err := b.buildInformers(cfg, info); err != nil {
		return b.abortReload(err)
	}
	_, in := b.snapshot()
	b.own.reloaded(cfg, in)
	syncCtx, cancel := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancel()
	if err := in.Start(syncCtx); err != nil {
		return b.abortReload(err)
	}
	if err := eachSwap(swaps, func(sw *swapping) (err error) {
		sw.started, sw.replayed, err = sw.d.adopt(ctx, sw.prev, sw.next)
		return err
	}); err != nil {
		return b.abortReload(err)
	}
	if len(swaps) == 0 {
		b.logger.Info("config reloaded", "standby", true, "rules", len(cfg.Rules), "sinks", len(cfg.Sinks))
		return nil
	}
	var started, retired, replayed int
	for _, sw := range swaps {
		started, retired, replayed = started+sw.started, retired+len(sw.retired), replayed+sw.replayed
	}
	b.logger.Info("config reloaded", "sinksKept", len(swaps)*len(cfg.Sinks)-started, "sinksStarted", started, "sinksStopped", retired,
		"rules", len(cfg.Rules), "deliverers", len(swaps), "replayedFromCheckpoint", replayed)
	return nil
}

// swapping is one deliverer's part of a reload: its sink set before and
// after, what the new set retires, and what adopting it did.
type swapping struct {
	d                 *deliverer
	prev, next        *sinkSet
	retired           []*sinkRun
	started, replayed int
}

// discard closes the sinks built for next that prev does not run: the
// reload was refused before the swap.
func (sw *swapping) discard(ctx context.Context) {
	for _, run := range sw.next.runs() {
		if sw.prev.run(run.cfg.Name) != run {
			_ = run.close(ctx)
		}
	}
}

// eachSwap runs fn for every deliverer's part at once (a retired sink's
// drain bounds each, not their sum) and joins their errors.
func eachSwap(swaps []*swapping, fn func(*swapping) error) error {
	errs := make([]error, len(swaps))
	var wg sync.WaitGroup
	for k, sw := range swaps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = fn(sw)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// abortReload stops the bridge after a reload failed midway.
func (b *Bridge) abortReload(err error) error {
	err = fmt.Errorf("%w: %w", ErrReloadAborted, err)
	b.fail(err)
	return err
}

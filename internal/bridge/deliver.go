package bridge

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/view"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// What reaches the sinks: each sink's delivery, and the view reconciler
// (internal/view) that every trigger goes through: live notifications, the
// reconciliation at start and after a reload, and /replay.

// startDelivery runs the delivery of sink s (built already) with its
// dead-letter, checkpoint hooks (none without a recorder: a standalone
// replay), latency metric and leader fence.
func (b *Bridge) startDelivery(ctx context.Context, s *sinkRun, recorder *checkpoint.Recorder) error {
	dl, closeDL, err := b.host.deadLetter(ctx, b.opts.Config, s.cfg.DeadLetter)
	if err != nil {
		return fmt.Errorf("sink %q: deadLetter: %w", s.cfg.Name, err)
	}
	if closeDL != nil {
		s.closers = append(s.closers, closeDL)
	}
	d := sinks.NewDelivery(s.cfg, s.sink, dl, b.logger)
	name := s.cfg.Name
	latency := b.metrics.latency.WithLabelValues(name)
	d.OnAck = func(evs []*event.Event) {
		if recorder != nil {
			recorder.Acked(name, evs)
		}
		now := time.Now()
		for _, e := range evs {
			if !e.Quiet {
				latency.Observe(now.Sub(e.Time).Seconds())
			}
		}
	}
	if recorder != nil {
		d.BeforeSend = func(ctx context.Context, evs []*event.Event) error { return recorder.Intend(ctx, name, evs) }
	}
	d.Fence = b.fence
	s.delivery = d
	s.views = view.NewSink(name, d.Offer)
	dctx, cancel := context.WithCancel(b.deliveryCtx)
	s.cancel = cancel
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		d.Run(dctx)
	}()
	return nil
}

// openCheckpoint opens the checkpoint store the config names: the host's
// KV store (its connection outlives a reload of the sink it names), or a
// bbolt file.
func (b *Bridge) openCheckpoint(ctx context.Context) error {
	if b.opts.CheckpointFile == "" {
		store, ok, err := b.host.checkpointStore(ctx, b.opts.Config)
		if ok {
			b.store = store
			return err
		}
	}
	path := b.opts.Config.Checkpoint.File
	if b.opts.CheckpointFile != "" {
		path = b.opts.CheckpointFile
	}
	store, err := checkpoint.OpenBolt(path, b.opts.ResetCheckpoint)
	if err != nil {
		return err
	}
	b.store, b.closeStore = store, store.Close
	return nil
}

// startViews loads sink s's views (loadViews) and reconciles them with the
// caches (kbreplay "checkpoint"). It returns how many events that sends.
func (b *Bridge) startViews(ctx context.Context, s *sinkRun, recorder *checkpoint.Recorder) (int, error) {
	if err := b.loadViews(ctx, s, recorder); err != nil {
		return 0, err
	}
	return b.reconcile(s, "", event.ReplayCheckpoint), nil
}

// loadViews loads what sink s acknowledged of each of its rules from the
// checkpoint and lets notifications sync its views.
func (b *Bridge) loadViews(ctx context.Context, s *sinkRun, recorder *checkpoint.Recorder) error {
	rules, _ := b.snapshot()
	for _, r := range rules {
		if !slices.Contains(r.Sinks, s.cfg.Name) {
			continue
		}
		stored, err := checkpoint.LoadView(ctx, b.store, s.cfg.Name, r.Name)
		if err != nil {
			return fmt.Errorf("loading the checkpoint of sink %s, rule %s: %w", s.cfg.Name, r.Name, err)
		}
		s.views.Load(r.Name, stored)
		recorder.Known(s.cfg.Name, r.Name, stored)
	}
	s.views.Start()
	return nil
}

// reconcile syncs every object key of sink s's views (of one rule, or all)
// with the caches: the objects in each rule's view and those the sink was
// handed. replay marks what it finds (event.ReplayResync also re-sends
// unchanged objects). It returns how many events that sends.
func (b *Bridge) reconcile(s *sinkRun, ruleName, replay string) int {
	rules, in := b.snapshot()
	now := time.Now()
	n := 0
	for _, r := range rules {
		if !slices.Contains(r.Sinks, s.cfg.Name) || (ruleName != "" && r.Name != ruleName) {
			continue
		}
		t := view.Trigger{Replay: replay, Now: now}
		seen := map[string]bool{}
		for _, obj := range in.View(r) {
			key := checkpoint.ObjectKey(obj.GetNamespace(), obj.GetName())
			seen[key] = true
			if c := in.Cache(r, key); c != nil {
				n += s.views.Sync(r, key, c, t)
			}
		}
		for _, key := range s.views.Keys(r.Name) {
			if seen[key] {
				continue
			}
			var c cache.KeyGetter = none{}
			if got := in.Cache(r, key); got != nil {
				c = got
			} // else no informer of the rule covers the key any more
			n += s.views.Sync(r, key, c, t)
		}
	}
	return n
}

// none is an empty cache.
type none struct{}

func (none) GetByKey(string) (any, bool, error) { return nil, false, nil }

// notify syncs each target sink's view of a notified key; it runs on the
// informer's goroutines and never blocks.
func (b *Bridge) notify(n informer.Notification) {
	set := b.active.Load()
	if set == nil {
		return // not delivering: the reconciliation when it starts covers this
	}
	t := view.Trigger{Object: n.Object, Gone: n.Gone, Now: time.Now(), Initial: n.Initial}
	switch {
	case n.Resync:
		t.Replay = event.ReplayResync
	case n.Initial:
		t.Replay = event.ReplayCheckpoint // what a start finds, as its reconciliation marks it
	}
	for r, names := range n.Targets {
		sent := 0
		for _, name := range names {
			if s := set.byName[name]; s != nil {
				sent += s.views.Sync(r, n.Key, n.Cache, t)
			}
		}
		r.Count(sent > 0)
	}
}

// stopDelivering stops the deliveries at once (the lease is lost): queued
// events are dropped, and the checkpoint is not written again, since the
// next leader owns it now.
func (b *Bridge) stopDelivering() {
	b.haltLead()
	b.active.Store(nil)
	if b.cancelDelivery != nil {
		b.cancelDelivery()
	}
	for _, d := range b.Deliveries() {
		d.Close()
	}
	if rec := b.recorder.Swap(nil); rec != nil {
		rec.Abandon()
	}
}

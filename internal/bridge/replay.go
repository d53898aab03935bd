package bridge

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// ReplayStatus is the progress of a standalone replay.
type ReplayStatus struct {
	Queued, Delivered, Failed int
	Done                      bool
}

// Replay sends one sink the full view of its rules (or of one rule) without
// a running bridge: it watches until the caches sync, queues every object
// as updated with kbreplay "resync", waits until the sink acknowledged all
// of them, and stops. It writes no checkpoint (a running bridge owns it),
// and does not know when objects entered the view: its ids differ from the
// running bridge's.
// progress is called about twice a second and at the end.
func Replay(ctx context.Context, opts Options, sinkName, ruleName string, progress func(ReplayStatus)) (ReplayStatus, error) {
	b := New(opts)
	var sc *config.Sink
	for i := range opts.Config.Sinks {
		if opts.Config.Sinks[i].Name == sinkName {
			sc = &opts.Config.Sinks[i]
		}
	}
	if sc == nil {
		return ReplayStatus{}, fmt.Errorf("no sink %q in the config", sinkName)
	}
	defer func() {
		b.stopAll()
		b.closeAll(ctx)
	}()
	if err := b.prepare(ctx); err != nil {
		return ReplayStatus{}, err
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancelSync()
	if err := b.informers.Start(syncCtx); err != nil { // nothing is active: notifications are dropped
		return ReplayStatus{}, err
	}
	var rules []*filters.Rule
	for _, r := range b.rules {
		if (ruleName == "" || r.Name == ruleName) && slices.Contains(r.Sinks, sinkName) {
			rules = append(rules, r)
		}
	}
	if len(rules) == 0 {
		return ReplayStatus{}, fmt.Errorf("no rule %q delivers to sink %q", ruleName, sinkName)
	}
	set, _, err := buildSinkSet(ctx, b.opts.Sinks, []config.Sink{*sc}, nil, b.logger)
	if err != nil {
		return ReplayStatus{}, err
	}
	b.mu.Lock()
	b.set = set
	b.mu.Unlock()
	b.deliveryCtx, b.cancelDelivery = context.WithCancel(ctx)
	run := set.order[0]
	if err := b.startDelivery(ctx, run, nil); err != nil { // no checkpoint: a running bridge owns it
		return ReplayStatus{}, err
	}
	d := run.delivery

	var st ReplayStatus
	now := time.Now()
	for _, r := range rules {
		if !r.Delivers(event.Updated) {
			continue
		}
		for _, obj := range b.informers.View(r) {
			d.Offer(event.Build(r.Event, event.Transition{Change: event.Updated, Object: obj, Time: now, Replay: event.ReplayResync}))
			st.Queued++
		}
	}
	d.Close()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		s := d.Stats()
		st.Delivered, st.Failed = int(s.Delivered), int(s.Failed)
		select {
		case <-d.Done():
			s := d.Stats()
			st.Delivered, st.Failed, st.Done = int(s.Delivered), int(s.Failed), true
			progress(st)
			if st.Delivered+st.Failed < st.Queued {
				return st, fmt.Errorf("replay interrupted: %d of %d events delivered", st.Delivered, st.Queued)
			}
			return st, nil
		case <-tick.C:
			progress(st)
		}
	}
}

package bridge

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/stage"
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
// a running bridge: it watches until the caches sync, then reconciles the
// sink's view as /replay does (view.Sync with kbreplay "resync": every
// object in the view as updated), waits until the sink acknowledged all
// of it, and stops. It writes no checkpoint and does not read it (a
// running bridge owns it): the sink is taken to hold the view (one
// reading of it) already, so nothing is sent as added or deleted; an
// event filter drops what it drops from /replay; the ids differ from the
// running bridge's (the time each object entered the view is not known).
// progress is called about twice a second and at the end.
func Replay(ctx context.Context, opts Options, sinkName, ruleName string, progress func(ReplayStatus)) (ReplayStatus, error) {
	var sc *config.Sink
	for i := range opts.Config.Sinks {
		if opts.Config.Sinks[i].Name == sinkName {
			sc = &opts.Config.Sinks[i]
		}
	}
	if sc == nil {
		return ReplayStatus{}, fmt.Errorf("no sink %q in the config", sinkName)
	}
	var d *deliverer // the replay's: the one sink, without a checkpoint
	b := build(opts, func(b *Bridge, _ *prometheus.HistogramVec) ownership {
		d = newDeliverer(delivererOptions{Registry: b.opts.Sinks, Host: b.host, Logger: b.logger, Source: b.source, Scope: shards.Forever()})
		return &replaying{alone{d: d, config: func() *config.Config { return b.opts.Config }, watched: b.snapshot, logger: b.logger}}
	})
	defer func() { _, _ = b.teardown(cancelled()) }()
	if err := b.prepare(ctx); err != nil {
		return ReplayStatus{}, err
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancelSync()
	if err := b.own.start(ctx, syncCtx); err != nil {
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
	if err := d.start(ctx, b.opts.Config, []config.Sink{*sc}); err != nil {
		return ReplayStatus{}, err
	}
	run := d.runs()[0]
	now := time.Now()
	var st ReplayStatus
	for _, r := range rules {
		// One reading of the view: what the sink is taken to hold and what
		// it is sent again are the same objects (the informers run on).
		snap := snapshot{}
		for _, o := range b.informers.View(r) {
			snap[checkpoint.ObjectKey(o.GetNamespace(), o.GetName())] = o
		}
		if r.Routes() { // the sink's view: the objects routed to it
			for key := range snap {
				d := stage.Evaluate(r, key, snap, stage.Trigger{})
				if _, _, _, in := d.State(sinkName); !in {
					delete(snap, key)
				}
			}
		}
		run.handed.Load(r.Name, snap.held(now))
		t := stage.Trigger{Replay: event.ReplayResync, Now: now}
		for key := range snap {
			d := stage.Evaluate(r, key, snap, t)
			st.Queued += run.handed.Sync(&d)
		}
	}

	stopped := make(chan error, 1)
	go func() {
		_, err := d.stop(ctx, false) // drains until every event was answered (or ctx ends)
		stopped <- err
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		s := run.delivery.Stats()
		st.Delivered, st.Failed = int(s.Delivered), int(s.Failed)
		select {
		case err := <-stopped:
			s := run.delivery.Stats()
			st.Delivered, st.Failed, st.Done = int(s.Delivered), int(s.Failed), true
			progress(st)
			if st.Delivered+st.Failed < st.Queued {
				return st, fmt.Errorf("replay interrupted: %d of %d events delivered", st.Delivered, st.Queued)
			}
			return st, err
		case <-tick.C:
			progress(st)
		}
	}
}

// snapshot is one reading of a rule's view, by object key: the sink is
// taken to hold it (held) and it is the desired state (stage.Lookup).
type snapshot map[string]*unstructured.Unstructured

func (s snapshot) GetByKey(key string) (any, bool, error) {
	o, ok := s[key]
	return o, ok, nil
}

// held is what the sink is taken to hold: every object, entered now (as
// nothing says when).
func (s snapshot) held(now time.Time) map[string]*checkpoint.Slot {
	out := make(map[string]*checkpoint.Slot, len(s))
	for key, o := range s {
		out[key] = &checkpoint.Slot{Acked: &checkpoint.Entry{UID: string(o.GetUID()), ResourceVersion: o.GetResourceVersion(),
			Namespace: o.GetNamespace(), Name: o.GetName(), Labels: o.GetLabels(), Entered: now.UnixNano()}}
	}
	return out
}

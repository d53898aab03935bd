package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/stage"
	"github.com/kubebridge/kubebridge/internal/view"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// deliverer runs delivery: the sinks (a sinkSet), each sink's view and
// delivery, the checkpoint store and its recorder, and their lifetimes. It
// knows nothing of leases or informers: the Bridge feeds it (notify,
// reconcile against a source) and whoever owns the objects drives it:
// start when this replica comes to deliver them, stop when it no longer
// does or shuts down. stop is the one teardown.
type deliverer struct {
	opts delivererOptions

	life sync.Mutex // start, swap and stop: one at a time
	mu   sync.Mutex // guards set
	set  *sinkSet   // the sinks built; stop closes them
	// active is the set notifications go to: nil while not delivering.
	active     atomic.Pointer[sinkSet]
	store      checkpoint.Store
	closeStore func() error
	recorder   atomic.Pointer[checkpoint.Recorder]
	// settled is true while the views are reconciled against synced
	// caches: after reconcileAll, and after a reload's adopt; false from a
	// reload's swap until then. A late read of a destination
	// (readHeldLater) reconciles only then.
	settled atomic.Bool
	// over closes at stop or abort: it ends the deliveries, the late
	// reads of destinations and returnStartMemory (lifetime).
	over     chan struct{}
	overOnce sync.Once
	wg       sync.WaitGroup // deliveries, the recorder, returnStartMemory
}

// delivererOptions are what a deliverer is built with: its seams.
type delivererOptions struct {
	Registry *sinks.Registry
	Host     *host
	Logger   *slog.Logger
	// Sinks builds the sinks; nil: Registry. DeadLetter builds a sink's
	// dead-letter; nil: Host's. (Sharding shares both among its shards.)
	Sinks      sinkCreator
	DeadLetter func(ctx context.Context, cfg *config.Config, s config.Sink) (sinks.DeadLetter, func(context.Context) error, error)
	// Source returns the current rules and the caches their views are
	// reconciled against (a reload replaces both); nil caches: none yet.
	Source func() ([]*filters.Rule, source)
	// OpenStore opens the checkpoint store and returns what closes it
	// (nil: the store's owner closes it). Nil OpenStore: no checkpoint,
	// views start empty and nothing is recorded (a standalone replay: a
	// running bridge owns the checkpoint).
	OpenStore          func(ctx context.Context) (checkpoint.Store, func() error, error)
	CheckpointInterval time.Duration
	// Scope is the shard of the objects this deliverer delivers, as this
	// replica holds it: every send and checkpoint write is fenced by it
	// and bounded by its holding (delivery.Hooks.Fence and Hold).
	Scope shards.Scope
	// Reading, when set, runs fn while the informers' caches may be read
	// (not relisted meanwhile: sharding's Reselect).
	Reading func(fn func())
	// Owns, when set, says whether an object a sink's destination holds
	// is this deliverer's to reconcile (a shard's); nil: all are.
	Owns func(sinks.HeldObject) bool
	// Latency observes, per sink, the time from observing a change to its
	// acknowledgement; nil: not observed.
	Latency *prometheus.HistogramVec
}

// source is what views are reconciled against: each rule's view and the
// cache that holds an object key's current state (*informer.Informers).
type source interface {
	View(r *filters.Rule) []*unstructured.Unstructured
	Cache(r *filters.Rule, key string) cache.KeyGetter
}

var _ source = (*informer.Informers)(nil)

func newDeliverer(opts delivererOptions) *deliverer {
	if opts.Sinks == nil {
		opts.Sinks = opts.Registry
	}
	if opts.DeadLetter == nil {
		h := opts.Host
		opts.DeadLetter = func(ctx context.Context, cfg *config.Config, s config.Sink) (sinks.DeadLetter, func(context.Context) error, error) {
			return h.deadLetter(ctx, cfg, s.DeadLetter)
		}
	}
	return &deliverer{opts: opts, over: make(chan struct{})}
}

// lifetime returns a context that ends when the deliverer's life is over
// (stop, abort); cancel releases it.
func (d *deliverer) lifetime() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := afterClose(d.over, cancel)
	return ctx, func() { stop(); cancel() }
}

// end closes the deliverer's lifetime (idempotent).
func (d *deliverer) end() { d.overOnce.Do(func() { close(d.over) }) }

// start builds the sinks cfgs configure (cfg is the whole config: what
// dead-letters and the checkpoint name), opens the checkpoint, starts each
// sink's delivery and loads its views from the checkpoint: from then on
// notifications sync the views. reconcileAll must follow once the caches
// synced. On error the caller stops the deliverer.
func (d *deliverer) start(ctx context.Context, cfg *config.Config, cfgs []config.Sink) error {
	d.life.Lock()
	defer d.life.Unlock()
	set, _, err := buildSinkSet(ctx, d.opts.Sinks, cfgs, nil, d.opts.Logger)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.set = set // closed by stop from here on
	d.mu.Unlock()
	var recorder *checkpoint.Recorder
	if d.opts.OpenStore != nil {
		store, closeStore, err := d.opts.OpenStore(ctx)
		if err != nil {
			return err
		}
		d.store, d.closeStore = store, closeStore
		recorder = checkpoint.NewRecorder(store, d.opts.CheckpointInterval, d.opts.Logger, d.opts.Scope) // past its lease a replica writes no checkpoint either
		d.recorder.Store(recorder)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			recorder.Run()
		}()
	}
	for _, s := range set.order {
		if err := d.startRun(ctx, cfg, s); err != nil {
			return err
		}
	}
	d.active.Store(set)
	for _, s := range set.order {
		if err := d.loadViews(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// startRun runs the delivery of sink s (built already) with its
// dead-letter, checkpoint hooks (none without a recorder), latency metric
// and fence.
func (d *deliverer) startRun(ctx context.Context, cfg *config.Config, s *sinkRun) error {
	mute, err := muteOf(s.cfg)
	if err != nil {
		return fmt.Errorf("sink %q: mute: %w", s.cfg.Name, err)
	}
	dl, closeDL, err := d.opts.DeadLetter(ctx, cfg, s.cfg)
	if err != nil {
		return fmt.Errorf("sink %q: deadLetter: %w", s.cfg.Name, err)
	}
	if closeDL != nil {
		s.closers = append(s.closers, closeDL)
	}
	name := s.cfg.Name
	recorder := d.recorder.Load()
	var latency prometheus.Observer
	if d.opts.Latency != nil {
		latency = d.opts.Latency.WithLabelValues(name)
	}
	hooks := delivery.Hooks{Fence: d.opts.Scope.Fence, Hold: d.opts.Scope.Hold, OnAck: func(evs []*event.Event) {
		if recorder != nil {
			recorder.Acked(name, evs)
		}
		if latency == nil {
			return
		}
		now := time.Now()
		for _, e := range evs {
			if !e.Quiet {
				latency.Observe(now.Sub(e.Time).Seconds())
			}
		}
	}}
	if recorder != nil {
		hooks.BeforeSend = func(ctx context.Context, evs []*event.Event) error { return recorder.Intend(ctx, name, evs) }
	}
	var windowKey func(*event.Event) (string, error)
	if k := s.cfg.UpdateWindow.Key; k != "" {
		wk, err := filters.NewWindowKey(k)
		if err != nil {
			return fmt.Errorf("sink %q: %w", name, err)
		}
		windowKey = wk.Of
	}
	dv := delivery.New(delivery.Options{Config: s.cfg, Sink: s.sink, DeadLetter: dl, Logger: d.opts.Logger, Hooks: hooks, WindowKey: windowKey, Mute: mute})
	dctx, cancel := d.lifetime()
	d.mu.Lock() // the set is published already: readers take d.mu (deliveries)
	s.delivery, s.handed, s.cancel = dv, view.NewHanded(name, dv.Offer), cancel
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer cancel()
		dv.Run(dctx)
	}()
	if ln, ok := unwrap(s.sink).(sinks.LossNotifier); ok {
		holder := holderOf(s.sink)
		lost, stopNotify := ln.NotifyLost()
		d.wg.Add(1)
		go func() { // until the run ends (a reload retires it, or the stop)
			defer d.wg.Done()
			defer stopNotify()
			for {
				select {
				case <-dctx.Done():
					return
				case rule := <-lost:
					d.readHeldLater(s, holder, rule, true)
				}
			}
		}()
	}
	return nil
}

// loadViews loads what sink s acknowledged of each of its rules (readRule)
// and lets notifications sync its views.
func (d *deliverer) loadViews(ctx context.Context, s *sinkRun) error {
	rules, _ := d.opts.Source()
	var unanswered bool
	for _, r := range rules {
		if !slices.Contains(r.Sinks, s.cfg.Name) {
			continue
		}
		stored, err := d.readRule(ctx, s, r.Name, &unanswered)
		if err != nil {
			return err
		}
		if stored != nil {
			s.handed.Load(r.Name, stored)
		}
	}
	s.handed.Start()
	return nil
}

// readRule reads what sink s holds of rule: what the checkpoint says it
// acknowledged (nothing without one), or, for a sink whose destination
// holds the view, what the destination holds with the checkpoint's clocks
// and intents (heldView). A destination that does not answer within
// heldWait (or, once one did not, *unanswered, at once) leaves the
// checkpoint's, and readHeldLater reads on. nil: nothing to read.
func (d *deliverer) readRule(ctx context.Context, s *sinkRun, rule string, unanswered *bool) (map[string]*checkpoint.Slot, error) {
	recorder := d.recorder.Load()
	holder := holderOf(s.sink)
	if recorder == nil && holder == nil {
		return nil, nil
	}
	var stored map[string]*checkpoint.Slot
	if recorder != nil {
		var err error
		if stored, err = checkpoint.LoadView(ctx, d.store, s.cfg.Name, rule); err != nil {
			return nil, fmt.Errorf("loading the checkpoint of sink %s, rule %s: %w", s.cfg.Name, rule, err)
		}
		recorder.Known(s.cfg.Name, rule, stored)
	}
	if holder == nil {
		return stored, nil
	}
	err := errors.New("its destination did not answer for another rule")
	if !*unanswered {
		hctx, cancel := context.WithTimeout(ctx, heldWait)
		var held []sinks.HeldObject
		held, err = holder.Held(hctx, rule)
		cancel()
		if err == nil {
			return heldView(stored, held, d.opts.Owns), nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		*unanswered = true
	}
	// The destination is down: the sink starts from the checkpoint (the
	// others are not held up), and what the destination holds besides is
	// merged when it answers.
	d.opts.Logger.Warn("cannot read what the sink's destination holds; its view starts from the checkpoint, and what the destination holds besides is reconciled once it answers", "sink", s.cfg.Name, "rule", rule, "error", err)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.readHeldLater(s, holder, rule, false)
	}()
	if stored == nil {
		stored = map[string]*checkpoint.Slot{}
	}
	return stored, nil
}

// heldWait bounds the first read of what a destination holds (a sink's
// start waits for it): past it, the sink starts from its checkpoint and
// readHeldLater reads on.
const heldWait = 15 * time.Second

// readHeldLater reads what sink s's destination holds of rule until it
// answers (or the run ends), then, against synced caches, merges it into
// the sink's views (view.Handed.Merge: what the destination holds besides
// what the sink is known to hold), or, when the destination lost what it
// held (lost: sinks.LossNotifier), makes it the sink's view of the rule,
// and reconciles the rule: entries written behind the bridge's back while
// the destination was down at the start are deleted or replaced, and what
// a lost destination lacks is sent again.
func (d *deliverer) readHeldLater(s *sinkRun, holder sinks.Holder, rule string, lost bool) {
	ctx, cancel := d.lifetime()
	defer cancel()
	retry := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second}
	current := func() bool { // the sink still runs, and still delivers rule
		set := d.active.Load()
		if set == nil || set.byName[s.cfg.Name] != s {
			return false
		}
		rules, _ := d.opts.Source()
		return slices.ContainsFunc(rules, func(r *filters.Rule) bool { return r.Name == rule && slices.Contains(r.Sinks, s.cfg.Name) })
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry.Next()):
		}
		if !current() {
			return // replaced or stopped by a reload, which read again
		}
		held, err := holder.Held(ctx, rule)
		if err != nil {
			if ctx.Err() == nil {
				d.opts.Logger.Warn("still cannot read what the sink's destination holds", "sink", s.cfg.Name, "rule", rule, "error", err)
			}
			continue
		}
		n, done := 0, false
		merge := func() {
			// stop holds life while it waits for this goroutine: take it
			// only while the deliverer is not stopping.
			for !d.life.TryLock() {
				if ctx.Err() != nil {
					done = true
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			defer d.life.Unlock()
			switch {
			case ctx.Err() != nil || !current():
				done = true
			case d.settled.Load():
				// Only against synced caches: an empty or half-listed
				// cache would read every object held as deleted.
				if lost {
					// The destination lost what it held: the sink holds
					// what it holds now (what is in flight lands, or is
					// sent again: at least once).
					s.handed.Load(rule, heldView(nil, held, d.opts.Owns))
				} else {
					s.handed.Merge(rule, heldView(nil, held, d.opts.Owns))
				}
				n, done = d.reconcile(s, rule, event.ReplayCheckpoint), true
			}
		}
		for !done {
			if d.opts.Reading != nil {
				d.opts.Reading(merge)
			} else {
				merge()
			}
			if !done {
				select { // not settled yet: the start's or a reload's reconciliation comes first
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
		if current() {
			d.opts.Logger.Info("read what the sink's destination holds, and reconciled the rule's view with it", "sink", s.cfg.Name, "rule", rule, "held", len(held), "events", n)
		}
		return
	}
}

// holderOf is sink's sinks.Holder, if its destination holds the view.
func holderOf(sink sinks.Sink) sinks.Holder {
	h, _ := unwrap(sink).(sinks.Holder)
	return h
}

// unwrap is the sink a shared sink shares.
func unwrap(sink sinks.Sink) sinks.Sink {
	if u, ok := sink.(interface{ Unwrap() sinks.Sink }); ok {
		return u.Unwrap()
	}
	return sink
}

// heldView is what a sink whose destination holds the view was handed:
// what the destination holds (of the objects owns accepts; nil: all),
// with the clocks the checkpoint keeps of the same incarnations (when
// each entered the view, its ids' stamp), and the checkpoint's intents:
// incarnations a send may still hold in flight, which the diff deletes if
// they are out of the view. What the checkpoint says was acknowledged but
// the destination lacks is not held: it is sent again.
func heldView(stored map[string]*checkpoint.Slot, held []sinks.HeldObject, owns func(sinks.HeldObject) bool) map[string]*checkpoint.Slot {
	out := make(map[string]*checkpoint.Slot, len(held))
	clock := func(key, uid string) (entered, stamp int64) {
		sl := stored[key]
		if sl == nil {
			return 0, 0
		}
		if a := sl.Acked; a != nil && a.UID == uid {
			return a.Entered, a.Stamp
		}
		for _, p := range sl.Pending {
			if p.UID == uid && !p.Leaving {
				return p.Entered, p.Stamp
			}
		}
		return 0, 0
	}
	for _, h := range held {
		if owns != nil && !owns(h) {
			continue
		}
		key := checkpoint.ObjectKey(h.Namespace, h.Name)
		entered, stamp := clock(key, h.UID)
		e := checkpoint.Entry{UID: h.UID, ResourceVersion: h.ResourceVersion, Namespace: h.Namespace, Name: h.Name, Labels: h.Labels, Entered: entered, Stamp: stamp}
		sl := out[key]
		if sl == nil {
			sl = &checkpoint.Slot{}
			out[key] = sl
		}
		if e.ResourceVersion == "" {
			e.ResourceVersion = "0" // a marker: older than any state, so the object is sent again
		}
		switch {
		case sl.Acked == nil:
			sl.Acked = &e
		default:
			sl.Pending = append(sl.Pending, e) // a second uid under the key: a ghost to delete
		}
	}
	for key, st := range stored {
		if len(st.Pending) == 0 {
			continue
		}
		sl := out[key]
		if sl == nil {
			sl = &checkpoint.Slot{}
			out[key] = sl
		}
		sl.Pending = append(sl.Pending, st.Pending...)
	}
	return out
}

// reconcileAll reconciles every sink's views with the synced caches: what
// the initial list did not decide (deletions while the bridge was away,
// objects listed before their sink's view was loaded). Then returnStartMemory returns
// the start's memory once the sinks drained. It returns how many events
// that sends.
func (d *deliverer) reconcileAll() int {
	d.life.Lock() // not while stop runs: returnStartMemory starts under it
	defer d.life.Unlock()
	set := d.active.Load()
	if set == nil {
		return 0 // stopped meanwhile (a lost lease)
	}
	n := 0
	for _, s := range set.order {
		n += d.reconcile(s, "", event.ReplayCheckpoint)
	}
	d.settled.Store(true)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := d.lifetime()
		defer cancel()
		d.returnStartMemory(ctx)
	}()
	return n
}

// resync reconciles every sink's views with the caches again (they were
// replaced: objects the new caches lack were not notified as gone). It
// returns how many events that sends.
func (d *deliverer) resync() int {
	d.life.Lock()
	defer d.life.Unlock()
	n := 0
	for _, s := range d.active.Load().runs() {
		n += d.reconcile(s, "", event.ReplayCheckpoint)
	}
	return n
}

// reconcile syncs every object key of sink s's views (of one rule, or all)
// with the caches: the objects in each rule's view and those the sink was
// handed. replay marks what it finds (event.ReplayResync also re-sends
// unchanged objects). It returns how many events that sends.
func (d *deliverer) reconcile(s *sinkRun, ruleName, replay string) int {
	rules, in := d.opts.Source()
	if in == nil {
		return 0
	}
	now := time.Now()
	n := 0
	for _, r := range rules {
		if !slices.Contains(r.Sinks, s.cfg.Name) || (ruleName != "" && r.Name != ruleName) {
			continue
		}
		t := stage.Trigger{Replay: replay, Now: now}
		seen := map[string]bool{}
		for _, obj := range in.View(r) {
			key := checkpoint.ObjectKey(obj.GetNamespace(), obj.GetName())
			seen[key] = true
			if c := in.Cache(r, key); c != nil {
				d := stage.Evaluate(r, key, c, t)
				n += s.handed.Sync(&d)
			}
		}
		for _, key := range s.handed.Keys(r.Name) {
			if seen[key] {
				continue
			}
			var c cache.KeyGetter = none{}
			if got := in.Cache(r, key); got != nil {
				c = got
			} // else no informer of the rule covers the key any more
			d := stage.Evaluate(r, key, c, t)
			n += s.handed.Sync(&d)
		}
	}
	return n
}

// none is an empty cache.
type none struct{}

func (none) GetByKey(string) (any, bool, error) { return nil, false, nil }

// reconcileRules reconciles the views of rules on every sink that delivers
// them (their resource appeared or went away). It returns how many events
// that sends.
func (d *deliverer) reconcileRules(rules []*filters.Rule) int {
	set := d.active.Load()
	n := 0
	for _, s := range set.runs() {
		for _, r := range rules {
			if slices.Contains(r.Sinks, s.cfg.Name) {
				n += d.reconcile(s, r.Name, event.ReplayCheckpoint)
			}
		}
	}
	return n
}

// notify hands a notified key to the rules stage, once per target rule,
// and what it found to each target sink's view; it runs on the informer's
// goroutines and never blocks.
func (d *deliverer) notify(n informer.Notification) {
	set := d.active.Load()
	if set == nil {
		return // not delivering: the reconciliation when it starts covers this
	}
	t := stage.Trigger{Object: n.Object, Meta: n.Meta, Gone: n.Gone, Now: time.Now(), Initial: n.Initial}
	switch {
	case n.Resync:
		t.Replay = event.ReplayResync
	case n.Initial:
		t.Replay = event.ReplayCheckpoint // what a start finds, as its reconciliation marks it
	}
	for _, tg := range n.Targets {
		desired := stage.Evaluate(tg.Rule, n.Key, n.Cache, t)
		sent := 0
		for _, name := range tg.Sinks {
			if s := set.byName[name]; s != nil {
				sent += s.handed.Sync(&desired)
			}
		}
		tg.Rule.Count(sent > 0)
	}
}

// swap replaces the sink set by next (buildSinkSet against the current
// one): the runs it retires stop taking events and drain into their sinks
// for up to drain, then close, and what they acknowledged is written
// before next's new runs start; no notification may arrive meanwhile (the
// caller stopped the informers). The new runs' views wait for adopt.
func (d *deliverer) swap(ctx context.Context, cfg *config.Config, next *sinkSet, retired []*sinkRun, drain time.Duration) error {
	d.life.Lock()
	defer d.life.Unlock()
	d.settled.Store(false) // the caches are replaced: adopt reconciles
	// A changed or removed sink's delivery stops before anything replaces
	// it: the old and the new one never run side by side.
	for _, s := range retired {
		s.retire(ctx, drain, d.opts.Logger)
	}
	if rec := d.recorder.Load(); rec != nil {
		if err := rec.Flush(ctx); err != nil {
			d.opts.Logger.Warn("checkpoint write before the reload failed; replaced sinks may receive events again", "error", err)
		}
	}
	d.mu.Lock()
	d.set = next
	d.mu.Unlock()
	for _, s := range next.order {
		if s.delivery == nil {
			if err := d.startRun(ctx, cfg, s); err != nil {
				return err
			}
		}
	}
	d.active.Store(next)
	return nil
}

// adopt reconciles next's views after a swap, once the caches for the
// new rules synced: a kept run forgets the rules it no longer delivers
// and is reconciled; a new one loads its views from the checkpoint first.
// It returns how many sinks started and how many events that sends.
func (d *deliverer) adopt(ctx context.Context, prev, next *sinkSet) (started, sent int, err error) {
	rules, _ := d.opts.Source()
	delivers := func(sink, rule string) bool {
		return slices.ContainsFunc(rules, func(r *filters.Rule) bool { return r.Name == rule && slices.Contains(r.Sinks, sink) })
	}
	if rec := d.recorder.Load(); rec != nil {
		rec.Forget(delivers)
	}
	for _, s := range next.order {
		if prev.run(s.cfg.Name) != s {
			started++
			if err := d.loadViews(ctx, s); err != nil {
				return started, sent, err
			}
		} else {
			s.handed.Forget(func(rule string) bool { return delivers(s.cfg.Name, rule) })
			// A rule the kept sink delivers now and did not: what it holds
			// of it (a rule added back, moved from another sink) joins
			// what notifications handed it since the swap.
			var unanswered bool
			for _, r := range rules {
				if !slices.Contains(r.Sinks, s.cfg.Name) || s.handed.Loaded(r.Name) {
					continue
				}
				stored, err := d.readRule(ctx, s, r.Name, &unanswered)
				if err != nil {
					return started, sent, err
				}
				s.handed.Merge(r.Name, stored)
			}
		}
		sent += d.reconcile(s, "", event.ReplayCheckpoint)
	}
	d.settled.Store(true)
	return started, sent, nil
}

// stop is the one teardown. Notifications stop reaching the views; every
// queue drains into its sink until ctx ends (a cancelled ctx: not at all;
// what is left is resent from the checkpoint by the next start); the
// workers stop; what was acknowledged is written to the checkpoint, unless
// abandon (the lease is lost: another replica owns the checkpoint now);
// then the sinks, their dead-letters and the checkpoint store close. It
// returns how many events were left undelivered. The set stays, stopped, for its
// final counts (runs). A stopped deliverer does not start again; stop is
// idempotent.
func (d *deliverer) stop(ctx context.Context, abandon bool) (left int, err error) {
	d.life.Lock()
	defer d.life.Unlock()
	d.active.Store(nil)
	set := d.currentSet()
	if abandon {
		// At once, not after the workers: nothing acknowledged from now on
		// is written (another replica owns the checkpoint).
		if rec := d.recorder.Swap(nil); rec != nil {
			rec.Abandon()
		}
	}
	left = stopRuns(ctx, set.runs())
	d.end() // returnStartMemory, the late reads
	if rec := d.recorder.Swap(nil); rec != nil {
		// Bounded, whatever the drain left: a store that cannot be
		// reached (a partition) must not hold a shard's give-back or a
		// shutdown. What is not written is sent again by the next owner.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
		if err := rec.Stop(wctx); err != nil {
			d.opts.Logger.Error("final checkpoint write failed; the next start sends its changes again", "error", err)
		}
		cancel()
	}
	d.wg.Wait()
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	var errs []error
	for _, s := range set.runs() {
		errs = append(errs, s.close(closeCtx))
	}
	if d.closeStore != nil {
		errs = append(errs, d.closeStore())
		d.closeStore = nil
	}
	d.store = nil
	return left, errors.Join(errs...)
}

// abort ends every delivery's context at once (sends in flight are cut),
// without waiting: this replica may no longer deliver; stop follows.
func (d *deliverer) abort() { d.end() }

// cancelled is a context that has ended: stop with it drains nothing.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// closeTimeout bounds closing the sinks once their workers stopped (an
// exec plugin waits for its answers until then), past any caller's
// deadline: closing must end.
const closeTimeout = 10 * time.Second

// finalWriteTimeout bounds the last checkpoint write of a stopping
// deliverer (a shutdown, a shard given back, a reload).
const finalWriteTimeout = 5 * time.Second

func (d *deliverer) currentSet() *sinkSet {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.set
}

// runs returns the sinks built, in config order (after stop, stopped).
func (d *deliverer) runs() []*sinkRun { return d.currentSet().runs() }

// deliveries returns the started deliveries, in config order (none
// before start; after stop, stopped, with their final counts).
func (d *deliverer) deliveries() []*delivery.Delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.set.deliveries()
}

// delivering reports whether notifications reach the sinks now.
func (d *deliverer) delivering() bool { return d.active.Load() != nil }

// running returns the run of a sink that delivers now, nil if none.
func (d *deliverer) running(name string) *sinkRun { return d.active.Load().run(name) }

// lag is how many acknowledged changes wait to be written.
func (d *deliverer) lag() int {
	if rec := d.recorder.Load(); rec != nil {
		return rec.Lag()
	}
	return 0
}

// muteOf is the delivery's mute of a sink configured as sc; nil: none.
func muteOf(sc config.Sink) (*delivery.Mute, error) {
	if sc.Mute == nil {
		return nil, nil
	}
	schedule, err := sc.Mute.Schedule()
	if err != nil {
		return nil, err
	}
	m := &delivery.Mute{Schedule: schedule}
	if sc.Mute.Where != "" {
		if m.Matches, err = filters.CompileMatcher(sc.Mute.Where); err != nil {
			return nil, fmt.Errorf("where: %w", err)
		}
	}
	return m, nil
}

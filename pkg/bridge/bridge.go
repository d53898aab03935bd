package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/pkg/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/file"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/sinks/webhook"
)

// BuiltinSinks is the one place where the sink types of this build are
// registered.
func BuiltinSinks() *sinks.Registry {
	r, err := sinks.NewRegistry(file.Factory, natssink.Factory, webhook.Factory)
	if err != nil {
		panic(err) // duplicate built-in types: a programming error caught by every test
	}
	return r
}

// Options configure a Bridge.
type Options struct {
	Config *config.Config
	REST   *rest.Config
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Sinks builds the sinks; nil means BuiltinSinks.
	Sinks *sinks.Registry
	// SyncTimeout bounds the wait for the informers' first sync. Default 2m.
	SyncTimeout time.Duration
	// CheckpointFile, when set, overrides the config's checkpoint.file.
	CheckpointFile string
	// ResetCheckpoint moves an unreadable checkpoint file aside and starts
	// from an empty one (the full view is then delivered again).
	ResetCheckpoint bool
	// CheckpointInterval is how often acknowledged events are written to the
	// checkpoint: the most a crash makes the bridge deliver again. Default 1s.
	CheckpointInterval time.Duration
	// LeaderElection, when set, makes this replica deliver only while it
	// holds the Lease. Default nil: deliver from the start.
	LeaderElection *LeaderElection
}

// ConfigError is returned by Start when the config does not fit the
// cluster (or cannot be compiled): nothing was started.
type ConfigError struct{ Problems []config.Problem }

func (e *ConfigError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Format("config")
	}
	return fmt.Sprint(msgs)
}

// Bridge is a running kubebridge: informers feeding rules feeding one
// delivery (queue + worker + sink) per sink.
//
// Lifecycle: Start builds and starts everything, sinks and their workers
// first, informers last, and returns once the caches have synced. Shutdown
// stops the informers first, then lets each queue drain into its sink until
// its context ends, then stops the workers and closes the sinks.
type Bridge struct {
	opts       Options
	logger     *slog.Logger
	deliveries map[string]*sinks.Delivery
	order      []*sinks.Delivery
	informers  *informer.Informers

	closers        []func(context.Context) error
	cancelDelivery context.CancelFunc
	store          checkpoint.Store
	recorder       atomic.Pointer[checkpoint.Recorder]
	rules          []*filters.Rule

	// mode says what emit does with live events: drop them (a follower,
	// or a leader that lost its lease), hold them here until the checkpoint
	// reconciliation is queued (so that no live event overtakes an older
	// replayed state), or deliver them.
	mode         atomic.Int32
	gateMu       sync.Mutex
	held         []heldEvent
	fence        func() error // nil without leader election
	fatal        chan error
	runCtx       context.Context
	cancelRun    context.CancelFunc
	deliveryCtx  context.Context
	built        map[string]sinks.Sink // the sinks in use, by name
	reloadMu     sync.Mutex            // one reload at a time, not during shutdown
	started      atomic.Bool           // Start finished: reconciled and live
	metrics      *metrics
	wg           sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
}

const (
	modeDrop int32 = iota
	modeHold
	modeLive
)

type heldEvent struct {
	ev    *event.Event
	sinks []string
}

// New returns a bridge for opts; Start runs it.
func New(opts Options) *Bridge {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Sinks == nil {
		opts.Sinks = BuiltinSinks()
	}
	if opts.SyncTimeout == 0 {
		opts.SyncTimeout = 2 * time.Minute
	}
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = time.Second
	}
	b := &Bridge{opts: opts, logger: opts.Logger, deliveries: map[string]*sinks.Delivery{}, fatal: make(chan error, 1)}
	b.metrics = newMetrics(b)
	return b
}

// Start checks the config against the cluster, then starts sinks,
// deliveries and informers, and waits for the caches to sync. On any error
// everything started is stopped again: nothing half-starts. A *ConfigError
// means the config does not fit the cluster.
func (b *Bridge) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			b.stopAll()
			b.closeAll(context.WithoutCancel(ctx))
		}
	}()
	if err := b.watch(ctx); err != nil {
		return err
	}
	b.runCtx, b.cancelRun = context.WithCancel(context.Background())
	if b.opts.LeaderElection != nil {
		cs, err := kubernetes.NewForConfig(b.opts.REST)
		if err != nil {
			return err
		}
		if err := b.runElection(b.runCtx, cs); err != nil {
			return err
		}
		b.started.Store(true)
		b.logger.Info("bridge started; campaigning for the leader lease", "informers", b.informers.Specs(), "rules", len(b.rules))
		return nil
	}
	if err := b.lead(ctx); err != nil {
		return err
	}
	b.started.Store(true)
	return nil
}

// watch checks the config against the cluster, compiles the rules and runs
// the informers until their caches synced, delivering nothing yet.
func (b *Bridge) watch(ctx context.Context) (err error) {
	cfg := b.opts.Config
	info, problems, err := Preflight(ctx, cfg, b.opts.REST)
	if err != nil {
		return fmt.Errorf("checking the config against the cluster: %w", err)
	}
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	if err := b.buildInformers(cfg, info); err != nil {
		return err
	}
	// Until this replica delivers, live events are dropped (a follower) or
	// held (a leader reconciling); see emit.
	b.mode.Store(modeDrop)
	syncCtx, cancelSync := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancelSync()
	return b.informers.Start(syncCtx)
}

// buildInformers compiles cfg's rules and prepares their informers (not
// started), replacing b.rules and b.informers.
func (b *Bridge) buildInformers(cfg *config.Config, info *ClusterInfo) error {
	dyn, err := dynamic.NewForConfig(b.opts.REST)
	if err != nil {
		return err
	}

	// The informers are built before the rules that read namespace labels
	// through them; the rules are attached before anything runs.
	var rules []*filters.Rule
	sel := map[*filters.Rule]informer.RuleSelectors{}
	var nsSource *informer.Informers
	nsLabels := func(ns string) (labels.Set, bool) { return nsSource.NamespaceLabels(ns) }
	var compileProblems []config.Problem
	for i, rc := range cfg.Rules {
		r, err := filters.Compile(cfg, i, nsLabels, b.logger)
		if err != nil {
			compileProblems = append(compileProblems, config.Problem{Path: fmt.Sprintf("rules[%d]", i), Line: cfg.LineOf(fmt.Sprintf("rules[%d]", i)), Message: err.Error()})
			continue
		}
		rules = append(rules, r)
		sel[r] = informer.RuleSelectors{Namespaces: rc.Namespaces, LabelSelector: rc.LabelSelector, FieldSelector: rc.FieldSelector}
	}
	if len(compileProblems) > 0 {
		return &ConfigError{Problems: compileProblems}
	}
	plan := informer.Plan(rules, sel, info.Namespaced)
	replayEvery := map[string]time.Duration{}
	for _, sc := range cfg.Sinks {
		replayEvery[sc.Name] = sc.ReplayEvery.D()
	}
	informers, err := informer.New(dyn, plan, b.emit, replayEvery, b.logger)
	if err != nil {
		return err
	}
	informers.SkipInitialList = true // the reconciliation delivers the initial view
	nsSource = informers
	b.gateMu.Lock()
	b.rules, b.informers = rules, informers
	b.gateMu.Unlock()
	return nil
}

// lead starts delivering: sinks, checkpoint, deliveries, then the
// reconciliation with each sink's checkpoint, then live events.
func (b *Bridge) lead(ctx context.Context) error {
	cfg := b.opts.Config
	b.mode.Store(modeHold)
	deliveryCtx, cancel := context.WithCancel(context.Background())
	b.cancelDelivery = cancel
	built := map[string]sinks.Sink{}
	for _, sc := range cfg.Sinks {
		sink, err := b.opts.Sinks.Create(ctx, sinks.Settings{Config: sc, Logger: b.logger.With("sink", sc.Name)})
		if err != nil {
			return fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		built[sc.Name] = sink
		b.closers = append(b.closers, func(ctx context.Context) error { return sink.Close(ctx) })
	}
	if err := b.openCheckpoint(ctx, built); err != nil {
		return err
	}
	recorder := checkpoint.NewRecorder(b.store, b.opts.CheckpointInterval, b.logger)
	b.recorder.Store(recorder)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		recorder.Run()
	}()
	b.deliveryCtx = deliveryCtx
	b.built = built
	deliveries := map[string]*sinks.Delivery{}
	var order []*sinks.Delivery
	for _, sc := range cfg.Sinks {
		d, err := b.startDelivery(sc, built, recorder)
		if err != nil {
			return err
		}
		deliveries[sc.Name] = d
		order = append(order, d)
	}
	b.gateMu.Lock()
	b.deliveries, b.order = deliveries, order // emit reads them only once the gate is released
	b.gateMu.Unlock()
	replayed, err := b.reconcile(ctx)
	if err != nil {
		return err
	}
	b.releaseGate()
	b.logger.Info("bridge started", "informers", b.informers.Specs(), "rules", len(b.rules), "sinks", len(order), "replayedFromCheckpoint", replayed)
	return nil
}

// startDelivery runs the delivery of sink sc (built already) with its
// dead-letter, checkpoint hooks, latency metric and leader fence.
func (b *Bridge) startDelivery(sc config.Sink, built map[string]sinks.Sink, recorder *checkpoint.Recorder) (*sinks.Delivery, error) {
	dl, err := b.deadLetter(sc, built)
	if err != nil {
		return nil, fmt.Errorf("sink %q: deadLetter: %w", sc.Name, err)
	}
	d := sinks.NewDelivery(sc, built[sc.Name], dl, b.logger)
	name := sc.Name
	latency := b.metrics.latency.WithLabelValues(name)
	d.OnAck = func(evs []*event.Event) {
		recorder.Acked(name, evs)
		now := time.Now()
		for _, e := range evs {
			latency.Observe(now.Sub(e.Time).Seconds())
		}
	}
	d.BeforeSend = func(ctx context.Context, evs []*event.Event) error { return recorder.Intend(ctx, name, evs) }
	d.Fence = b.fence
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		d.Run(b.deliveryCtx)
	}()
	return d, nil
}

// stopDelivering stops the deliveries at once (the lease is lost): queued
// events are dropped, and the checkpoint is not written again, since the
// next leader owns it now.
func (b *Bridge) stopDelivering() {
	b.mode.Store(modeDrop)
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

// openCheckpoint opens the checkpoint store the config names.
func (b *Bridge) openCheckpoint(ctx context.Context, built map[string]sinks.Sink) error {
	cp := b.opts.Config.Checkpoint
	if kv := cp.NATSKV; kv != nil && b.opts.CheckpointFile == "" {
		ns, ok := built[kv.Sink].(*natssink.Sink)
		if !ok {
			return fmt.Errorf("checkpoint.natsKV.sink %q is not a nats sink", kv.Sink)
		}
		store, err := checkpoint.OpenKV(ctx, ns.Conn(), kv.Bucket)
		if err != nil {
			return err
		}
		b.store = store
		return nil
	}
	path := cp.File
	if b.opts.CheckpointFile != "" {
		path = b.opts.CheckpointFile
	}
	store, err := checkpoint.OpenBolt(path, b.opts.ResetCheckpoint)
	if err != nil {
		return err
	}
	b.store = store
	b.closers = append(b.closers, func(context.Context) error { return store.Close() })
	return nil
}

// reconcile diffs each sink's delivered view, per rule, against the
// current one and queues the difference with kbreplay "checkpoint": objects
// new or changed since as added/updated, vanished ones as deleted.
func (b *Bridge) reconcile(ctx context.Context) (int, error) {
	now := time.Now()
	n := 0
	for _, r := range b.rules {
		view := b.informers.View(r)
		for _, sinkName := range r.Sinks {
			d := b.deliveryOf(sinkName)
			seen, err := b.store.Load(ctx, sinkName, r.Name)
			if err != nil {
				return n, fmt.Errorf("loading the checkpoint of sink %s, rule %s: %w", sinkName, r.Name, err)
			}
			keys := make([]string, 0, len(seen))
			for k := range seen {
				keys = append(keys, k)
			}
			if rec := b.recorder.Load(); rec != nil {
				rec.Known(sinkName, r.Name, keys)
			}
			for _, obj := range view {
				key := checkpoint.ObjectKey(obj.GetNamespace(), obj.GetName())
				entry, known := seen[key]
				delete(seen, key)
				switch {
				case !known || entry.UID != string(obj.GetUID()) || entry.ResourceVersion == "":
					if r.Delivers(event.Added) {
						d.Offer(event.New(r.Event, event.Added, obj, nil, now).WithReplay(event.ReplayCheckpoint))
						n++
					}
				case entry.ResourceVersion != obj.GetResourceVersion():
					if r.Delivers(event.Updated) {
						d.Offer(event.New(r.Event, event.Updated, obj, nil, now).WithReplay(event.ReplayCheckpoint))
						n++
					}
				}
			}
			for _, entry := range seen { // delivered, no longer in the view
				if r.Delivers(event.Deleted) {
					d.Offer(event.New(r.Event, event.Deleted, lastKnown(entry), nil, now).WithReplay(event.ReplayCheckpoint))
					n++
				}
			}
		}
	}
	return n, nil
}

// lastKnown rebuilds the metadata of an object that is gone, from its checkpoint entry.
func lastKnown(e checkpoint.Entry) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetNamespace(e.Namespace)
	u.SetName(e.Name)
	u.SetUID(types.UID(e.UID))
	u.SetResourceVersion(e.ResourceVersion)
	if len(e.Labels) > 0 {
		u.SetLabels(e.Labels)
	}
	return u
}

// releaseGate queues the live events held during reconciliation, in order,
// and lets later ones through directly.
func (b *Bridge) releaseGate() {
	b.gateMu.Lock()
	defer b.gateMu.Unlock()
	for _, h := range b.held {
		for _, name := range h.sinks {
			if d := b.deliveries[name]; d != nil { // gateMu is held
				d.Offer(h.ev)
			}
		}
	}
	b.held = nil
	b.mode.Store(modeLive)
}

// emit hands an event to each of its sinks' queues; it never blocks.
func (b *Bridge) emit(ev *event.Event, sinkNames []string) {
	if b.mode.Load() != modeLive {
		b.gateMu.Lock()
		switch b.mode.Load() {
		case modeDrop:
			b.gateMu.Unlock()
			return // a follower: the reconciliation on takeover covers it
		case modeHold:
			b.held = append(b.held, heldEvent{ev, sinkNames})
			b.gateMu.Unlock()
			return
		}
		b.gateMu.Unlock()
	}
	b.offer(ev, sinkNames)
}

func (b *Bridge) offer(ev *event.Event, sinkNames []string) {
	for _, name := range sinkNames {
		if d := b.deliveryOf(name); d != nil {
			d.Offer(ev)
		}
	}
}

// snapshot returns the current rules and informers (a reload replaces them).
func (b *Bridge) snapshot() ([]*filters.Rule, *informer.Informers) {
	b.gateMu.Lock()
	defer b.gateMu.Unlock()
	return b.rules, b.informers
}

// Ready reports whether the caches have synced.
func (b *Bridge) Ready() bool {
	_, in := b.snapshot()
	return in != nil && in.Synced()
}

// deliveryOf returns a sink's delivery, nil while this replica does not deliver.
func (b *Bridge) deliveryOf(name string) *sinks.Delivery {
	if b.mode.Load() == modeLive {
		return b.deliveries[name] // published before the mode went live
	}
	b.gateMu.Lock()
	defer b.gateMu.Unlock()
	return b.deliveries[name]
}

// Deliveries returns the per-sink deliveries, in config order (none while
// this replica is not the leader).
func (b *Bridge) Deliveries() []*sinks.Delivery {
	b.gateMu.Lock()
	defer b.gateMu.Unlock()
	return b.order
}

// Shutdown stops the informers, drains every queue into its sink until ctx
// ends, then stops the workers and closes the sinks. Events still queued
// when ctx ends are not delivered (a restart replays them from the
// cluster's state once checkpoints exist). It is idempotent.
func (b *Bridge) Shutdown(ctx context.Context) error {
	b.shutdownOnce.Do(func() {
		b.reloadMu.Lock() // no reload from now on
		defer b.reloadMu.Unlock()
		if b.informers != nil {
			b.informers.Stop()
		}
		order := b.Deliveries()
		for _, d := range order {
			d.Close()
		}
		drained := make(chan struct{})
		go func() {
			for _, d := range order {
				<-d.Done()
			}
			close(drained)
		}()
		select {
		case <-drained:
		case <-ctx.Done():
			var left int
			for _, d := range order {
				left += d.Pending()
			}
			b.shutdownErr = fmt.Errorf("shutdown deadline reached with %d events undelivered", left)
		}
		b.stopAll()
		<-drained
		b.shutdownErr = errors.Join(b.shutdownErr, b.closeAll(context.WithoutCancel(ctx)))
	})
	return b.shutdownErr
}

// deadLetter builds the dead-letter of sink sc, if it has one.
func (b *Bridge) deadLetter(sc config.Sink, built map[string]sinks.Sink) (sinks.DeadLetter, error) {
	switch dl := sc.DeadLetter; {
	case dl == nil:
		return nil, nil
	case dl.File != "":
		f, err := sinks.OpenFileDeadLetter(dl.File)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func(context.Context) error { return f.Close() })
		return f, nil
	default:
		ns, ok := built[dl.NATS.Sink].(*natssink.Sink)
		if !ok {
			return nil, fmt.Errorf("sink %q is not a nats sink", dl.NATS.Sink)
		}
		return &natssink.DeadLetter{NC: ns.Conn(), Subject: dl.NATS.Subject}, nil
	}
}

// closeAll closes sinks and dead-letters, after the workers stopped.
func (b *Bridge) closeAll(ctx context.Context) error {
	var errs []error
	for _, c := range b.closers {
		errs = append(errs, c(ctx))
	}
	b.closers = nil
	return errors.Join(errs...)
}

// stopAll stops informers and delivery workers, then writes the last
// acknowledged events to the checkpoint, and waits for all of it.
func (b *Bridge) stopAll() {
	if b.informers != nil {
		b.informers.Stop()
	}
	if b.cancelDelivery != nil {
		b.cancelDelivery()
	}
	for _, d := range b.Deliveries() {
		<-d.Done()
	}
	if rec := b.recorder.Swap(nil); rec != nil {
		if err := rec.Stop(context.Background()); err != nil {
			b.logger.Error("final checkpoint write failed", "error", err)
		}
	}
	if b.cancelRun != nil {
		b.cancelRun() // releases the lease, after the last checkpoint write
	}
	b.wg.Wait()
}

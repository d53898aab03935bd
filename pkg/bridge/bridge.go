package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/view"
)

// Options configure a Bridge.
type Options struct {
	Config *config.Config
	REST   *rest.Config
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Sinks builds the sinks; nil means components.SinkRegistry(). It must
	// be the registry the config was loaded with.
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

// Bridge is a running kubebridge: informers feeding rules feeding, per sink,
// a view (pkg/view) and a delivery (queue + worker + sink).
//
// Lifecycle: Start checks the config, runs the informers until their caches
// synced (delivering nothing), then, as the leader or alone, starts the
// sinks and their workers and reconciles each sink's view with its
// checkpoint, and returns. Shutdown stops the
// informers first, then lets each queue drain into its sink until its
// context ends, then stops the workers and closes the sinks.
type Bridge struct {
	opts   Options
	logger *slog.Logger

	mu        sync.Mutex // guards rules, informers, set (writers); readers of set use active
	rules     []*filters.Rule
	informers *informer.Informers
	set       *sinkSet

	// active is the sink set notifications go to: nil while this replica
	// does not deliver (a follower, or before the views are loaded).
	active atomic.Pointer[sinkSet]

	store          checkpoint.Store
	recorder       atomic.Pointer[checkpoint.Recorder]
	conns          map[string]*natssink.Sink // NATS connections the bridge owns (KV checkpoint, dead-letters), by sink config
	closers        []func(context.Context) error
	deliveryCtx    context.Context
	cancelDelivery context.CancelFunc

	fence        func() error // nil without leader election
	fatal        chan error
	runCtx       context.Context
	cancelRun    context.CancelFunc
	reloadMu     sync.Mutex  // one reload at a time, not during shutdown
	started      atomic.Bool // Start finished: reconciled and live
	metrics      *metrics
	wg           sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
}

// sinkSet is the sinks in use, immutable once published: a reload builds a
// new one.
type sinkSet struct {
	byName map[string]*sinkRun
	order  []*sinkRun
}

// sinkRun is one sink in use: its config, the sink, its delivery and the
// view it was handed.
type sinkRun struct {
	cfg      config.Sink
	sink     sinks.Sink
	delivery *sinks.Delivery
	views    *view.Sink
	cancel   context.CancelFunc // stops the delivery at once
	closers  []func(context.Context) error
}

// New returns a bridge for opts; Start runs it.
func New(opts Options) *Bridge {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Sinks == nil {
		opts.Sinks = components.SinkRegistry()
	}
	if opts.SyncTimeout == 0 {
		opts.SyncTimeout = 2 * time.Minute
	}
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = time.Second
	}
	b := &Bridge{opts: opts, logger: opts.Logger, fatal: make(chan error, 1), conns: map[string]*natssink.Sink{}}
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
	// Until this replica delivers, notifications are dropped: the
	// reconciliation when it starts to deliver covers them.
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
	informers, err := informer.New(dyn, plan, b.notify, replayEvery, b.logger)
	if err != nil {
		return err
	}
	informers.SkipInitialList = true // the reconciliation delivers the initial view
	nsSource = informers
	b.mu.Lock()
	b.rules, b.informers = rules, informers
	b.mu.Unlock()
	return nil
}

// lead starts delivering: sinks, checkpoint, deliveries, then each sink's
// view is loaded from the checkpoint and reconciled with the caches.
func (b *Bridge) lead(ctx context.Context) error {
	cfg := b.opts.Config
	b.deliveryCtx, b.cancelDelivery = context.WithCancel(context.Background())
	built := map[string]sinks.Sink{}
	for _, sc := range cfg.Sinks {
		sink, err := b.opts.Sinks.Create(ctx, sinks.Settings{Config: sc, Logger: b.logger.With("sink", sc.Name)})
		if err != nil {
			for _, s := range built {
				_ = s.Close(ctx)
			}
			return fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		built[sc.Name] = sink
	}
	set := &sinkSet{byName: map[string]*sinkRun{}}
	b.mu.Lock()
	b.set = set // closed by Shutdown from here on
	b.mu.Unlock()
	for _, sc := range cfg.Sinks {
		s := &sinkRun{cfg: sc, sink: built[sc.Name]}
		set.byName[sc.Name], set.order = s, append(set.order, s)
	}
	if err := b.openCheckpoint(ctx, built); err != nil {
		return err
	}
	recorder := checkpoint.NewRecorder(b.store, b.opts.CheckpointInterval, b.logger)
	recorder.Fence = b.fence // a replica past its lease writes no checkpoint either
	b.recorder.Store(recorder)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		recorder.Run()
	}()
	for _, s := range set.order {
		if err := b.startDelivery(ctx, s, recorder); err != nil {
			return err
		}
	}
	b.active.Store(set)
	replayed := 0
	for _, s := range set.order {
		n, err := b.startViews(ctx, s, recorder)
		if err != nil {
			return err
		}
		replayed += n
	}
	b.logger.Info("bridge started", "informers", b.informers.Specs(), "rules", len(b.rules), "sinks", len(set.order), "replayedFromCheckpoint", replayed)
	return nil
}

// startDelivery runs the delivery of sink s (built already) with its
// dead-letter, checkpoint hooks, latency metric and leader fence.
func (b *Bridge) startDelivery(ctx context.Context, s *sinkRun, recorder *checkpoint.Recorder) error {
	dl, err := b.deadLetter(ctx, s)
	if err != nil {
		return fmt.Errorf("sink %q: deadLetter: %w", s.cfg.Name, err)
	}
	d := sinks.NewDelivery(s.cfg, s.sink, dl, b.logger)
	name := s.cfg.Name
	latency := b.metrics.latency.WithLabelValues(name)
	d.OnAck = func(evs []*event.Event) {
		recorder.Acked(name, evs)
		now := time.Now()
		for _, e := range evs {
			if !e.Quiet {
				latency.Observe(now.Sub(e.Time).Seconds())
			}
		}
	}
	d.BeforeSend = func(ctx context.Context, evs []*event.Event) error { return recorder.Intend(ctx, name, evs) }
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

// startViews loads what sink s acknowledged of each of its rules from the
// checkpoint, lets notifications sync its views, and reconciles them with
// the caches (kbreplay "checkpoint"). It returns how many events that sends.
func (b *Bridge) startViews(ctx context.Context, s *sinkRun, recorder *checkpoint.Recorder) (int, error) {
	rules, _ := b.snapshot()
	for _, r := range rules {
		if !slices.Contains(r.Sinks, s.cfg.Name) {
			continue
		}
		stored, err := checkpoint.LoadView(ctx, b.store, s.cfg.Name, r.Name)
		if err != nil {
			return 0, fmt.Errorf("loading the checkpoint of sink %s, rule %s: %w", s.cfg.Name, r.Name, err)
		}
		s.views.Load(r.Name, stored)
		recorder.Known(s.cfg.Name, r.Name, stored)
	}
	s.views.Start()
	return b.reconcile(s, "", event.ReplayCheckpoint), nil
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
	t := view.Trigger{Object: n.Object, Gone: n.Gone, Now: time.Now()}
	if n.Resync {
		t.Replay = event.ReplayResync
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

// openCheckpoint opens the checkpoint store the config names. A NATS KV
// store gets a connection of the bridge's own, so that a reload of the
// sink it names does not close it.
func (b *Bridge) openCheckpoint(ctx context.Context, built map[string]sinks.Sink) error {
	cp := b.opts.Config.Checkpoint
	if kv := cp.NATSKV; kv != nil && b.opts.CheckpointFile == "" {
		nc, err := b.natsConn(ctx, kv.Sink, built)
		if err != nil {
			return fmt.Errorf("checkpoint.natsKV: %w", err)
		}
		store, err := checkpoint.OpenKV(ctx, nc, kv.Bucket)
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

// natsConn returns a NATS connection to the server of the nats sink named
// sinkName, owned by the bridge (shared by the KV checkpoint and the
// dead-letters that connect alike, closed at shutdown). An
// embedded server lives inside its sink: its connection is borrowed.
func (b *Bridge) natsConn(ctx context.Context, sinkName string, built map[string]sinks.Sink) (*natsgo.Conn, error) {
	var sc *config.Sink
	for i := range b.opts.Config.Sinks {
		if b.opts.Config.Sinks[i].Name == sinkName {
			sc = &b.opts.Config.Sinks[i]
		}
	}
	nc, ok := (*natssink.Config)(nil), false
	if sc != nil {
		nc, ok = sc.Spec.(*natssink.Config)
	}
	if !ok {
		return nil, fmt.Errorf("sink %q is not a nats sink", sinkName)
	}
	if nc.Embedded {
		ns, ok := built[sinkName].(*natssink.Sink)
		if !ok {
			return nil, fmt.Errorf("sink %q is not running", sinkName)
		}
		return ns.Conn(), nil
	}
	// Keyed by what the connection is made of, not what the sink publishes
	// (the subject is only checked by Connect; streams stay the sink's).
	c := nc.Connection()
	key, _ := json.Marshal(c)
	if s := b.conns[string(key)]; s != nil {
		return s.Conn(), nil
	}
	c.Subject = nc.Subject
	s, err := natssink.Connect(ctx, sinkName+"-bridge", &c, b.logger.With("connection", sinkName))
	if err != nil {
		return nil, err
	}
	b.conns[string(key)] = s
	b.closers = append(b.closers, s.Close)
	return s.Conn(), nil
}

// deadLetter builds the dead-letter of sink s, if it has one.
func (b *Bridge) deadLetter(ctx context.Context, s *sinkRun) (sinks.DeadLetter, error) {
	switch dl := s.cfg.DeadLetter; {
	case dl == nil:
		return nil, nil
	case dl.File != "":
		f, err := sinks.OpenFileDeadLetter(dl.File)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func(context.Context) error { return f.Close() })
		return f, nil
	default:
		built := map[string]sinks.Sink{}
		if set := b.currentSet(); set != nil {
			for name, r := range set.byName {
				built[name] = r.sink
			}
		}
		nc, err := b.natsConn(ctx, dl.NATS.Sink, built)
		if err != nil {
			return nil, err
		}
		return &natssink.DeadLetter{NC: nc, Subject: dl.NATS.Subject}, nil
	}
}

// snapshot returns the current rules and informers (a reload replaces them).
func (b *Bridge) snapshot() ([]*filters.Rule, *informer.Informers) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rules, b.informers
}

func (b *Bridge) currentSet() *sinkSet {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.set
}

// Ready reports whether the caches have synced.
func (b *Bridge) Ready() bool {
	_, in := b.snapshot()
	return in != nil && in.Synced()
}

// sinkOf returns a running sink, nil while this replica does not deliver.
func (b *Bridge) sinkOf(name string) *sinkRun {
	if set := b.active.Load(); set != nil {
		return set.byName[name]
	}
	return nil
}

// Deliveries returns the per-sink deliveries, in config order (none while
// this replica is not the leader).
func (b *Bridge) Deliveries() []*sinks.Delivery {
	set := b.currentSet()
	if set == nil {
		return nil
	}
	out := make([]*sinks.Delivery, 0, len(set.order))
	for _, s := range set.order {
		if s.delivery != nil {
			out = append(out, s.delivery)
		}
	}
	return out
}

// Shutdown stops the informers, drains every queue into its sink until ctx
// ends, then stops the workers and closes the sinks. Events still queued
// when ctx ends are not delivered (the next start reconciles them from the
// checkpoint). It is idempotent.
func (b *Bridge) Shutdown(ctx context.Context) error {
	b.shutdownOnce.Do(func() {
		b.reloadMu.Lock() // no reload from now on
		defer b.reloadMu.Unlock()
		if _, in := b.snapshot(); in != nil {
			in.Stop()
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

// closeAll closes sinks, dead-letters and the bridge's connections, after
// the workers stopped.
func (b *Bridge) closeAll(ctx context.Context) error {
	var errs []error
	if set := b.currentSet(); set != nil {
		for _, s := range set.order {
			errs = append(errs, s.close(ctx))
		}
	}
	for _, c := range b.closers {
		errs = append(errs, c(ctx))
	}
	b.closers = nil
	return errors.Join(errs...)
}

// close closes the sink and its dead-letter (once its delivery stopped).
func (s *sinkRun) close(ctx context.Context) error {
	var errs []error
	if s.sink != nil {
		errs = append(errs, s.sink.Close(ctx))
		s.sink = nil
	}
	for _, c := range s.closers {
		errs = append(errs, c(ctx))
	}
	s.closers = nil
	return errors.Join(errs...)
}

// stopAll stops informers and delivery workers, then writes the last
// acknowledged events to the checkpoint, and waits for all of it.
func (b *Bridge) stopAll() {
	if _, in := b.snapshot(); in != nil {
		in.Stop()
	}
	b.active.Store(nil)
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

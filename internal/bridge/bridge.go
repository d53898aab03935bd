package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
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
	// Namespace is the namespace the bridge runs in: where /replay
	// permissions are checked. Default "default".
	Namespace string
	// OptIns are the permissions the operator gave sink types that need
	// one (sinks.Factory.OptIn), by name: exec sinks start programs the
	// config names, as the bridge's user and with its service account, so
	// whoever may edit the config may run code. A setting outside the
	// config file (bridge run --allow-exec-plugins, a chart value).
	// Default: none.
	OptIns map[string]bool
	// CredentialDirs are the directories credential files the config names
	// (every *File key: tokens, secrets, creds, TLS) must lie in, symbolic
	// links resolved (bridge run --credential-dirs, default /etc/kubebridge;
	// the chart passes its secret mounts). The pod's service-account
	// directory is refused whatever they say. Nil: no directory is
	// required (embedding and tests), the service-account directory still
	// refused.
	CredentialDirs []string
	// ReloadDrain bounds how long a sink a reload replaces may drain its
	// queue into its old settings before the new ones start from the
	// checkpoint. Default 30s.
	ReloadDrain time.Duration
	// ResourcePoll is how often the cluster is asked whether the rules'
	// resources are served (a rule whose CRD is absent waits for it; one
	// whose CRD is deleted delivers its objects' deletions). Default 10s.
	ResourcePoll time.Duration
	// AllowSecretData lets rules that set allowSecretData keep Secret data
	// in their events. It is a setting outside the config file (bridge run
	// --allow-secret-data, a chart value) so that whoever may edit the
	// config cannot switch redaction off alone. Default false: redacted.
	AllowSecretData bool
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

// gated lists what cfg asks for that only a setting outside the config
// may allow: sinks whose type needs an opt-in not given, credential files outside
// CredentialDirs.
func (b *Bridge) gated(cfg *config.Config) []config.Problem {
	dirs := b.opts.CredentialDirs
	if dirs == nil {
		dirs = []string{"/"}
	}
	out := config.ConfineCredentials(cfg, dirs, true)
	for i, s := range cfg.Sinks {
		if o := b.opts.Sinks.OptIn(s.Type); o != nil && !b.opts.OptIns[o.Name] {
			path := fmt.Sprintf("sinks[%d].%s", i, s.Type)
			out = append(out, config.Problem{Path: path, Line: cfg.LineOf(path), Message: o.Why})
		}
	}
	return out
}

// Bridge is a running kubebridge: informers feeding rules feeding, per sink,
// a view (internal/view) and a delivery (queue + worker + sink).
//
// Lifecycle: Start checks the config, runs the informers until their caches
// synced (delivering nothing), then, as the leader or alone, starts the
// sinks and their workers and reconciles each sink's view with its
// checkpoint, and returns. Shutdown stops the
// informers first, then lets each queue drain into its sink until its
// context ends, then stops the workers and closes the sinks.
type Bridge struct {
	opts    Options
	logger  *slog.Logger
	metrics *metrics

	// What is watched and where it goes; a reload replaces all three.
	mu        sync.Mutex // guards rules, informers, set (writers); readers of set use active
	rules     []*filters.Rule
	informers *informer.Informers
	set       *sinkSet
	// active is the sink set notifications go to: nil while this replica
	// does not deliver (a follower, or before the views are loaded).
	active atomic.Pointer[sinkSet]

	// Delivering (lead, deliver.go) and what the bridge owns for it: the
	// checkpoint, what sinks share (host.go).
	host           *host
	store          checkpoint.Store
	closeStore     func() error
	recorder       atomic.Pointer[checkpoint.Recorder]
	deliveryCtx    context.Context
	cancelDelivery context.CancelFunc
	// leadMu serializes starting to deliver (lead, on the elector's
	// goroutine, possibly while Start still waits for the caches) with
	// stopping: once stopping is set, lead starts nothing. stopLead
	// cancels a lead in progress so that stopping never waits long.
	leadMu   sync.Mutex
	stopping bool
	stopLead context.CancelFunc
	leadStop context.Context

	// Lifecycle: leader election (leader.go), reload, shutdown.
	fence        func() error // nil without leader election
	fatal        chan error
	runCtx       context.Context
	cancelRun    context.CancelFunc
	reloadMu     sync.Mutex  // one reload at a time, not during shutdown
	started      atomic.Bool // Start finished: reconciled and live
	shuttingDown atomic.Bool // Shutdown began: queues drain, nothing is settled
	wg           sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
	replays      replayGate // /replay's callers and pace (admin.go)
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
	if opts.ReloadDrain == 0 {
		opts.ReloadDrain = defaultReloadDrain
	}
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = time.Second
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	b := &Bridge{opts: opts, logger: opts.Logger, fatal: make(chan error, 1), host: newHost(opts.Logger)}
	b.leadStop, b.stopLead = context.WithCancel(context.Background())
	b.replays.limit = rate.NewLimiter(rate.Every(10*time.Second), 3)
	b.replays.reviews = rate.NewLimiter(10, 20)
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
			b.closeAll(ctx)
		}
	}()
	if err := b.prepare(ctx); err != nil {
		return err
	}
	b.runCtx, b.cancelRun = context.WithCancel(context.Background())
	// The initial list streams into the sinks' views as it arrives (its
	// adds only add or update; the reconciliation after the sync decides
	// deletions), so a cold start delivers at the speed of the list and a
	// warm one compares each listed object with the checkpoint as it comes.
	syncCtx, cancelSync := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancelSync()
	if b.opts.LeaderElection != nil {
		cs, err := kubernetes.NewForConfig(b.opts.REST)
		if err != nil {
			return err
		}
		// Campaign while the caches fill: a replica elected at once streams
		// its initial list too; the others keep warm caches.
		if err := b.runElection(b.runCtx, cs); err != nil {
			return err
		}
		if err := b.informers.Start(syncCtx); err != nil {
			return err
		}
		b.started.Store(true)
		b.logger.Info("bridge started; campaigning for the leader lease", "informers", b.informers.Specs(), "rules", len(b.rules))
		return nil
	}
	if err := b.startDelivering(ctx); err != nil {
		return err
	}
	if err := b.informers.Start(syncCtx); err != nil {
		return err
	}
	b.reconcileAll()
	b.started.Store(true)
	return nil
}

// prepare checks the config against the cluster, compiles the rules and
// builds their informers, not yet started.
func (b *Bridge) prepare(ctx context.Context) error {
	cfg := b.opts.Config
	if problems := b.gated(cfg); len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	info, problems, err := Preflight(ctx, cfg, b.opts.REST)
	if err != nil {
		return fmt.Errorf("checking the config against the cluster: %w", err)
	}
	if errs := Errors(problems); len(errs) > 0 {
		return &ConfigError{Problems: errs}
	}
	b.warn(problems)
	return b.buildInformers(cfg, info)
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
		if r.Event.AllowSecretData && !b.opts.AllowSecretData {
			r.Event.AllowSecretData = false
			b.logger.Warn("rule sets allowSecretData, but the bridge runs without --allow-secret-data: Secret data stays redacted", "rule", r.Name)
		}
		rules = append(rules, r)
		sel[r] = informer.RuleSelectors{Namespaces: rc.Namespaces, LabelSelector: rc.LabelSelector, FieldSelector: rc.FieldSelector}
	}
	if len(compileProblems) > 0 {
		return &ConfigError{Problems: compileProblems}
	}
	plan := informer.Plan(rules, sel, info.Namespaced)
	for i := range plan {
		plan[i].Absent = info.Absent[plan[i].Spec.GVR]
	}
	replayEvery := map[string]time.Duration{}
	for _, sc := range cfg.Sinks {
		replayEvery[sc.Name] = sc.ReplayEvery.D()
	}
	informers, err := informer.New(dyn, plan, b.notify, replayEvery, b.logger)
	if err != nil {
		return err
	}
	if err := b.followResources(informers); err != nil {
		return err
	}
	nsSource = informers
	b.mu.Lock()
	b.rules, b.informers = rules, informers
	b.mu.Unlock()
	return nil
}

// lead starts delivering as the elected leader, once the caches synced.
func (b *Bridge) lead(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.leadStop, cancel)()
	b.leadMu.Lock()
	if b.stopping {
		b.leadMu.Unlock()
		return nil
	}
	// The elector's goroutine is not the bridge's: counted here, stopping
	// waits for this lead to end and for what it starts (settle).
	b.wg.Add(1)
	defer b.wg.Done()
	err := b.startDelivering(ctx)
	b.leadMu.Unlock()
	if err != nil {
		return err
	}
	if err := b.informers.WaitSynced(ctx); err != nil {
		return err
	}
	b.reconcileAll()
	return nil
}

// startDelivering starts the sinks, the checkpoint and the deliveries, and
// loads each sink's view from the checkpoint: from then on notifications
// sync the views. reconcileAll must follow once the caches synced.
func (b *Bridge) startDelivering(ctx context.Context) error {
	cfg := b.opts.Config
	b.deliveryCtx, b.cancelDelivery = context.WithCancel(context.Background())
	cfgs, err := b.host.sinkConfigs(cfg.Sinks)
	if err != nil {
		return err
	}
	set, _, err := buildSinkSet(ctx, b.opts.Sinks, cfgs, nil, b.logger)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.set = set // closed by Shutdown from here on
	b.mu.Unlock()
	if err := b.openCheckpoint(ctx); err != nil {
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
	for _, s := range set.order {
		if err := b.loadViews(ctx, s, recorder); err != nil {
			return err
		}
	}
	return nil
}

// reconcileAll reconciles every sink's views with the synced caches: what
// the initial list did not settle (deletions while the bridge was away,
// objects listed before their sink's view was loaded).
func (b *Bridge) reconcileAll() {
	set := b.active.Load()
	if set == nil {
		return // the lease was lost meanwhile
	}
	replayed := 0
	for _, s := range set.order {
		replayed += b.reconcile(s, "", event.ReplayCheckpoint)
	}
	b.logger.Info("bridge started", "informers", b.informers.Specs(), "rules", len(b.rules), "sinks", len(set.order), "replayedFromCheckpoint", replayed)
	ctx := b.deliveryCtx
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.settle(ctx)
	}()
}

// haltLead makes lead start nothing from now on, cutting one in progress
// short and waiting for it, so that stopping never races it.
func (b *Bridge) haltLead() {
	b.stopLead()
	b.leadMu.Lock()
	b.stopping = true
	b.leadMu.Unlock()
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
func (b *Bridge) sinkOf(name string) *sinkRun { return b.active.Load().run(name) }

// Deliveries returns the per-sink deliveries, in config order (none while
// this replica is not the leader).
func (b *Bridge) Deliveries() []*sinks.Delivery { return b.currentSet().deliveries() }

// Shutdown stops the informers, drains every queue into its sink until ctx
// ends, then stops the workers and closes the sinks. Events still queued
// when ctx ends are not delivered (the next start reconciles them from the
// checkpoint). It is idempotent.
func (b *Bridge) Shutdown(ctx context.Context) error {
	b.shutdownOnce.Do(func() {
		b.shuttingDown.Store(true)
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
		b.shutdownErr = errors.Join(b.shutdownErr, b.closeAll(ctx))
	})
	return b.shutdownErr
}

// closeTimeout bounds closing the sinks once their workers stopped (an
// exec plugin waits for its answers until then), past any caller's
// deadline: closing must end.
const closeTimeout = 10 * time.Second

// closeAll closes sinks, dead-letters and the bridge's connections, after
// the workers stopped, within closeTimeout of ctx (whose cancellation it
// ignores: what was started is closed).
func (b *Bridge) closeAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	var errs []error
	if set := b.currentSet(); set != nil {
		for _, s := range set.order {
			errs = append(errs, s.close(ctx))
		}
	}
	if b.closeStore != nil {
		errs = append(errs, b.closeStore())
		b.closeStore = nil
	}
	errs = append(errs, b.host.close(ctx))
	return errors.Join(errs...)
}

// stopAll stops informers and delivery workers, then writes the last
// acknowledged events to the checkpoint, and waits for all of it.
func (b *Bridge) stopAll() {
	b.haltLead()
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

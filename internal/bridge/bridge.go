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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/admin"
	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/internal/owners"
	"github.com/kubebridge/kubebridge/internal/preflight"
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
	// Clients, when set, are the Kubernetes clients the bridge uses
	// instead of ones built from REST (unit tests: client-go's fakes).
	// Default nil.
	Clients *Clients
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
// CredentialDirs; and output files (file sinks, dead-letters) that would
// write the checkpoint, the config, a credential or another output.
func (b *Bridge) gated(cfg *config.Config) []config.Problem {
	dirs := b.opts.CredentialDirs
	if dirs == nil {
		dirs = []string{"/"}
	}
	out := config.ConfineCredentials(cfg, dirs, true)
	checkpoint := cfg.Checkpoint.File
	if b.opts.CheckpointFile != "" {
		checkpoint = b.opts.CheckpointFile
	}
	out = append(out, config.ConfineOutputFiles(cfg, config.Protected{ConfigFile: cfg.File(), CheckpointFile: checkpoint}, true)...)
	for i, s := range cfg.Sinks {
		if o := b.opts.Sinks.OptIn(s.Type); o != nil && !b.opts.OptIns[o.Name] {
			path := fmt.Sprintf("sinks[%d].%s", i, s.Type)
			out = append(out, config.Problem{Path: path, Line: cfg.LineOf(path), Message: o.Why})
		}
	}
	return out
}

// Bridge is a running kubebridge: informers feeding rules feeding, per sink,
// a view (internal/view) and a delivery. It is three parts and what
// joins them: watching (the rules and their informers, which a reload
// replaces), delivering (a deliverer: the sinks, their views and
// deliveries, the checkpoint) and ownership (alone, or a leaseOwner), which
// decides when this replica delivers. The admin API (package admin) sees it
// through admin.Target.
//
// Lifecycle: Start checks the config, then, alone, starts delivering and
// the informers, reconciles each sink's view with its checkpoint once the
// caches synced, and returns; with leader election it starts the
// informers and campaigns, and the deliverer starts when the Lease is
// held. Shutdown stops the informers, then the deliverer (draining),
// releases the Lease and closes what the sinks shared.
type Bridge struct {
	opts    Options
	logger  *slog.Logger
	metrics *metrics
	admin   *admin.Server

	// What is watched; a reload replaces both.
	mu        sync.Mutex
	rules     []*filters.Rule
	informers *informer.Informers
	// caches is held for reading while views are reconciled against the
	// informers' caches, and for writing while a reload or a Reselect
	// (sharded) replaces them: no reconciliation reads a cache being
	// listed again.
	caches sync.RWMutex

	host *host     // what sinks share (connections, embedded servers): closed last
	own  ownership // which objects this replica delivers, when, through which deliverers

	clientsOnce sync.Once // clients
	clientsVal  *Clients
	clientsErr  error

	fatal        chan error
	reloadMu     sync.Mutex  // one reload at a time, not during shutdown
	started      atomic.Bool // Start finished: reconciled and live
	shutdownOnce sync.Once
	shutdownErr  error
}

// New returns a bridge for opts; Start runs it.
func New(opts Options) *Bridge { return build(opts, (*Bridge).newOwnership) }

// build returns a bridge for opts whose ownership own makes.
func build(opts Options, own func(b *Bridge, latency *prometheus.HistogramVec) ownership) *Bridge {
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
	h := newHost(opts.Logger, opts.Sinks)
	opts.Sinks = h.sinks // the sinks get the host (sinks.Settings.Host)
	b := &Bridge{opts: opts, logger: opts.Logger, fatal: make(chan error, 1), host: h}
	latency := newLatency()
	b.own = own(b, latency)
	b.metrics = newMetrics(b, latency)
	b.admin = admin.New(admin.Options{Target: (*target)(b), Metrics: b.metrics.handler(), REST: opts.REST, Namespace: opts.Namespace, Logger: opts.Logger})
	return b
}

// Start checks the config against the cluster, then starts sinks,
// deliveries and informers, and waits for the caches to sync. On any error
// everything started is stopped again: nothing half-starts. A *ConfigError
// means the config does not fit the cluster.
func (b *Bridge) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			_, _ = b.teardown(cancelled()) // stopped at once, what was acknowledged written
		}
	}()
	if err := b.prepare(ctx); err != nil {
		return err
	}
	// The initial list streams into the sinks' views as it arrives (its
	// adds only add or update; the reconciliation after the sync decides
	// deletions), so a cold start delivers at the speed of the list and a
	// warm one compares each listed object with the checkpoint as it comes.
	syncCtx, cancelSync := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancelSync()
	if err := b.own.start(ctx, syncCtx); err != nil {
		return err
	}
	b.started.Store(true)
	return nil
}

// preflight checks cfg against the cluster (package preflight).
func (b *Bridge) preflight(ctx context.Context, cfg *config.Config) (*preflight.ClusterInfo, []config.Problem, error) {
	c, err := b.clients()
	if err != nil {
		return nil, nil, err
	}
	return preflight.Check(ctx, cfg, c.Kube)
}

// prepare checks the config against the cluster, compiles the rules and
// builds their informers, not yet started.
func (b *Bridge) prepare(ctx context.Context) error {
	cfg := b.opts.Config
	if problems := b.gated(cfg); len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	info, problems, err := b.preflight(ctx, cfg)
	if err != nil {
		return fmt.Errorf("checking the config against the cluster: %w", err)
	}
	if errs := preflight.Errors(problems); len(errs) > 0 {
		return &ConfigError{Problems: errs}
	}
	b.warn(problems)
	return b.buildInformers(cfg, info)
}

// buildInformers compiles cfg's rules and prepares their informers (not
// started), replacing b.rules and b.informers.
func (b *Bridge) buildInformers(cfg *config.Config, info *preflight.ClusterInfo) error {
	c, err := b.clients()
	if err != nil {
		return err
	}
	dyn := c.Dynamic

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
		if k := info.Kinds[r.GVR]; k != "" && r.Event.Kind == "" {
			r.Event.Kind = k
		}
		if allowed := event.AllowsSecretData(rc.AllowSecretData, b.opts.AllowSecretData); allowed != r.Event.AllowSecretData {
			r.Event.AllowSecretData = allowed
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
	notify := b.own.notify
	informers, err := informer.New(dyn, plan, notify, replayEvery, b.logger)
	if err != nil {
		return err
	}
	if len(info.Owners) > 0 && c.Metadata != nil {
		// One set of owner caches for every rule that includes owners,
		// run and stopped with the rules' informers.
		res := owners.New(c.Metadata, info.Owners, ownerLabels(rules))
		informers.Owners = res
		for _, r := range rules {
			r.SetRelations(res.Related)
		}
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

// ownerLabels are the labels the owners' caches keep: those the rules
// that include owners show, nil (all) when one of them shows all.
func ownerLabels(rules []*filters.Rule) []string {
	keep := []string{}
	for _, r := range rules {
		if !r.IncludesOwners() {
			continue
		}
		l := r.OwnerLabels()
		if l == nil {
			return nil
		}
		keep = append(keep, l...)
	}
	slices.Sort(keep)
	return slices.Compact(keep)
}

// source is what the deliverer reconciles against: the current rules and
// informers (nil before they are built).
func (b *Bridge) source() ([]*filters.Rule, source) {
	rules, in := b.snapshot()
	if in == nil {
		return rules, nil
	}
	return rules, in
}

// snapshot returns the current rules and informers (a reload replaces them).
func (b *Bridge) snapshot() ([]*filters.Rule, *informer.Informers) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rules, b.informers
}

// Ready reports whether the caches have synced (sharded: and every shard
// held reconciled).
func (b *Bridge) Ready() bool {
	_, in := b.snapshot()
	if in == nil || !in.Synced() {
		return false
	}
	return b.own.ready()
}

// Deliveries returns the per-sink deliveries, in config order (none while
// this replica does not deliver; after Shutdown, with their final counts).
// Sharded, each shard held has its own, shard by shard.
func (b *Bridge) Deliveries() []*delivery.Delivery {
	var out []*delivery.Delivery
	for _, d := range b.deliverers() {
		out = append(out, d.deliveries()...)
	}
	return out
}

// readingCaches runs fn, which reconciles views against the caches, while
// no reload or Reselect replaces them.
func (b *Bridge) readingCaches(fn func()) {
	b.caches.RLock()
	defer b.caches.RUnlock()
	fn()
}

// deliverers are the deliverers in use: one per shard held.
func (b *Bridge) deliverers() []*deliverer { return b.own.deliverers() }

// Shutdown stops the informers, drains every queue into its sink until ctx
// ends, then stops the workers and closes the sinks. Events still queued
// when ctx ends are not delivered (the next start reconciles them from the
// checkpoint). It is idempotent.
func (b *Bridge) Shutdown(ctx context.Context) error {
	b.shutdownOnce.Do(func() {
		b.own.halt()      // a leader starting ends (it holds reloadMu)
		b.reloadMu.Lock() // no reload from now on
		defer b.reloadMu.Unlock()
		b.started.Store(false) // nor after: Reload refuses a bridge not running
		left, err := b.teardown(ctx)
		if left > 0 {
			err = errors.Join(fmt.Errorf("shutdown deadline reached with %d events undelivered", left), err)
		}
		b.shutdownErr = err
	})
	return b.shutdownErr
}

// teardown is the bridge's one way down, in order: nothing starts
// delivering any more; the informers stop (no more notifications); the
// deliverer stops (draining until ctx ends) and writes its last
// checkpoint; the Lease is released; what the sinks shared closes. It
// returns how many events were left undelivered.
func (b *Bridge) teardown(ctx context.Context) (left int, err error) {
	b.own.halt()
	if _, in := b.snapshot(); in != nil {
		in.Stop()
	}
	left, err = b.own.stop(ctx)
	err = errors.Join(err, b.own.release()) // after the last checkpoint writes
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	return left, errors.Join(err, b.host.close(closeCtx))
}

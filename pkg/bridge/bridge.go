package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

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
	wg             sync.WaitGroup
	shutdownOnce   sync.Once
	shutdownErr    error
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
	return &Bridge{opts: opts, logger: opts.Logger, deliveries: map[string]*sinks.Delivery{}}
}

// Start checks the config against the cluster, then starts sinks,
// deliveries and informers, and waits for the caches to sync. On any error
// everything started is stopped again: nothing half-starts. A *ConfigError
// means the config does not fit the cluster.
func (b *Bridge) Start(ctx context.Context) (err error) {
	cfg := b.opts.Config
	info, problems, err := Preflight(ctx, cfg, b.opts.REST)
	if err != nil {
		return fmt.Errorf("checking the config against the cluster: %w", err)
	}
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	dyn, err := dynamic.NewForConfig(b.opts.REST)
	if err != nil {
		return err
	}

	defer func() {
		if err != nil {
			b.stopAll()
			b.closeAll(context.WithoutCancel(ctx))
		}
	}()

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
	for _, sc := range cfg.Sinks {
		dl, err := b.deadLetter(sc, built)
		if err != nil {
			return fmt.Errorf("sink %q: deadLetter: %w", sc.Name, err)
		}
		d := sinks.NewDelivery(sc, built[sc.Name], dl, b.logger)
		b.deliveries[sc.Name] = d
		b.order = append(b.order, d)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			d.Run(deliveryCtx)
		}()
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
	b.informers, err = informer.New(dyn, plan, b.emit, b.logger)
	if err != nil {
		return err
	}
	nsSource = b.informers

	syncCtx, cancelSync := context.WithTimeout(ctx, b.opts.SyncTimeout)
	defer cancelSync()
	if err := b.informers.Start(syncCtx); err != nil {
		return err
	}
	b.logger.Info("bridge started", "informers", b.informers.Specs(), "rules", len(rules), "sinks", len(b.order))
	return nil
}

// emit hands an event to each of its sinks' queues; it never blocks.
func (b *Bridge) emit(ev *event.Event, sinkNames []string) {
	for _, name := range sinkNames {
		if d := b.deliveries[name]; d != nil {
			d.Offer(ev)
		}
	}
}

// Ready reports whether the caches have synced.
func (b *Bridge) Ready() bool { return b.informers != nil && b.informers.Synced() }

// Deliveries returns the per-sink deliveries, in config order.
func (b *Bridge) Deliveries() []*sinks.Delivery { return b.order }

// Shutdown stops the informers, drains every queue into its sink until ctx
// ends, then stops the workers and closes the sinks. Events still queued
// when ctx ends are not delivered (a restart replays them from the
// cluster's state once checkpoints exist). It is idempotent.
func (b *Bridge) Shutdown(ctx context.Context) error {
	b.shutdownOnce.Do(func() {
		if b.informers != nil {
			b.informers.Stop()
		}
		for _, d := range b.order {
			d.Close()
		}
		drained := make(chan struct{})
		go func() {
			for _, d := range b.order {
				<-d.Done()
			}
			close(drained)
		}()
		select {
		case <-drained:
		case <-ctx.Done():
			var left int
			for _, d := range b.order {
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

// stopAll stops informers and delivery workers and waits for them.
func (b *Bridge) stopAll() {
	if b.informers != nil {
		b.informers.Stop()
	}
	if b.cancelDelivery != nil {
		b.cancelDelivery()
	}
	b.wg.Wait()
}

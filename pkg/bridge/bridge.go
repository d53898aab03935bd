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
)

// BuiltinSinks is the one place where the sink types of this build are
// registered.
func BuiltinSinks() *sinks.Registry {
	r, err := sinks.NewRegistry(file.Factory)
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
			for _, d := range b.order {
				_ = d.CloseSink(context.WithoutCancel(ctx))
			}
		}
	}()

	deliveryCtx, cancel := context.WithCancel(context.Background())
	b.cancelDelivery = cancel
	for _, sc := range cfg.Sinks {
		sink, err := b.opts.Sinks.Create(ctx, sinks.Settings{Config: sc, Logger: b.logger.With("sink", sc.Name)})
		if err != nil {
			return fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		d := sinks.NewDelivery(sc, sink, b.logger)
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
			d.Queue.Close()
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
		var errs []error
		for _, d := range b.order {
			if err := d.CloseSink(context.WithoutCancel(ctx)); err != nil {
				errs = append(errs, fmt.Errorf("closing sink %s: %w", d.Name, err))
			}
		}
		b.shutdownErr = errors.Join(append([]error{b.shutdownErr}, errs...)...)
	})
	return b.shutdownErr
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

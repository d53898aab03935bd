package informer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/filters"
)

// Informers runs the informers of a plan. It owns their goroutines: Start
// starts them, Stop ends them and waits.
type Informers struct {
	// SkipInitialList drops the adds of each informer's first list (a
	// checkpoint reconciliation delivers the view that list shows instead);
	// without it they are notified with Initial set.
	SkipInitialList bool

	logger  *slog.Logger
	notify  Notify
	running []*running
	ns      cache.SharedIndexInformer // namespaces, when a rule selects them by label
	nsRules []*filters.Rule

	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// running is a Watch's informer and its handler registrations.
type running struct {
	Watch
	informer cache.SharedIndexInformer
	regs     []cache.ResourceEventHandlerRegistration
}

// synced reports whether every handler registration has been handed the
// initial list, not only whether the cache has it.
func (run *running) synced() bool {
	for _, reg := range run.regs {
		if !reg.HasSynced() {
			return false
		}
	}
	return true
}

// New prepares the informers of plan; nothing runs before Start.
//
// replayEvery gives the sinks that want a periodic full replay (resync) and
// their period. Such a sink gets its own handler registration on each
// informer that feeds it, with that resync period (client-go's per-handler
// resync), carrying its live events too, so that replays and live events
// reach it in order. The other sinks share one registration without resync.
func New(client dynamic.Interface, plan []Watch, notify Notify, replayEvery map[string]time.Duration, logger *slog.Logger) (*Informers, error) {
	in := &Informers{logger: logger, notify: notify}
	for _, w := range plan {
		for _, r := range w.Rules {
			if r.HasNamespaceSelector() && !slices.Contains(in.nsRules, r) {
				in.nsRules = append(in.nsRules, r)
			}
		}
	}
	if len(in.nsRules) > 0 {
		in.ns = dynamicinformer.NewFilteredDynamicInformer(client, schema.GroupVersionResource{Version: "v1", Resource: "namespaces"},
			"", 0, cache.Indexers{}, nil).Informer()
		if err := in.ns.SetTransform(stripManagedFields); err != nil {
			return nil, err
		}
	}
	for _, w := range plan {
		run, err := in.prepare(client, w, replayEvery)
		if err != nil {
			return nil, err
		}
		in.running = append(in.running, run)
	}
	return in, nil
}

// prepare creates w's informer, with an index per index key of its rules,
// and registers its handlers (see New).
func (in *Informers) prepare(client dynamic.Interface, w Watch, replayEvery map[string]time.Duration) (*running, error) {
	spec := w.Spec
	indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for _, r := range w.Rules {
		for _, k := range r.IndexKeys() {
			indexers[k.String()] = filters.IndexFunc(k)
		}
	}
	// Sinks of this informer's rules that replay, and the shortest period:
	// the informer checks for due resyncs that often.
	var replaying []string
	var resyncCheck time.Duration
	for _, r := range w.Rules {
		for _, sink := range r.Sinks {
			if d := replayEvery[sink]; d > 0 && !slices.Contains(replaying, sink) {
				replaying = append(replaying, sink)
				if resyncCheck == 0 || d < resyncCheck {
					resyncCheck = d
				}
			}
		}
	}
	inf := dynamicinformer.NewFilteredDynamicInformer(client, spec.GVR, spec.Namespace, resyncCheck, indexers,
		func(o *metav1.ListOptions) {
			o.LabelSelector = spec.LabelSelector
			o.FieldSelector = spec.FieldSelector
		}).Informer()
	if err := inf.SetTransform(w.transform()); err != nil {
		return nil, err
	}
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		in.logger.Warn("watch failed; the informer relists and retries", "informer", spec.String(), "error", err)
	})

	run := &running{Watch: w, informer: inf}
	common := map[*filters.Rule][]string{}
	for _, r := range w.Rules {
		for _, sink := range r.Sinks {
			if !slices.Contains(replaying, sink) {
				common[r] = append(common[r], sink)
			}
		}
	}
	if err := run.register(in, common, false, 0); err != nil {
		return nil, err
	}
	for _, sink := range replaying {
		targets := map[*filters.Rule][]string{}
		for _, r := range w.Rules {
			if slices.Contains(r.Sinks, sink) {
				targets[r] = []string{sink}
			}
		}
		if err := run.register(in, targets, true, replayEvery[sink]); err != nil {
			return nil, err
		}
	}
	return run, nil
}

// register adds a handler for targets to the informer, with its own resync
// period (0: none).
func (run *running) register(in *Informers, targets map[*filters.Rule][]string, replays bool, resync time.Duration) error {
	reg, err := run.informer.AddEventHandlerWithResyncPeriod(run.handler(in, targets, replays), resync)
	if err != nil {
		return err
	}
	run.regs = append(run.regs, reg)
	return nil
}

// Start runs the informers and waits until every cache has synced (the
// namespace informer first, so that namespace selectors are right from the
// first object), or ctx ends. The informers outlive ctx: they stop when Stop
// is called.
func (in *Informers) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	if in.ns != nil {
		if _, err := in.ns.AddEventHandler(in.namespaceHandler()); err != nil {
			return err
		}
		in.goRun(runCtx, in.ns)
		if !waitFor(ctx, in.ns.HasSynced) {
			return fmt.Errorf("namespaces informer did not sync: %w", context.Cause(ctx))
		}
	}
	synced := make([]cache.InformerSynced, 0, len(in.running))
	for _, r := range in.running {
		in.goRun(runCtx, r.informer)
		synced = append(synced, r.synced)
	}
	if !waitFor(ctx, synced...) {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("interrupted while waiting for the caches to sync")
		}
		var pending []string
		for _, r := range in.running {
			if !r.synced() {
				pending = append(pending, r.Spec.String())
			}
		}
		return fmt.Errorf("informers did not sync (%s): %w", strings.Join(pending, "; "), context.Cause(ctx))
	}
	return nil
}

// WaitSynced waits until every cache has synced (see Start) or ctx ends.
func (in *Informers) WaitSynced(ctx context.Context) error {
	if !waitFor(ctx, in.Synced) {
		return fmt.Errorf("waiting for the caches to sync: %w", context.Cause(ctx))
	}
	return nil
}

// waitFor polls until every fn reports synced (true) or ctx ends (false).
// It polls every 5 ms, not client-go's 100 ms: a restart is ready as soon as
// the list is in, and a 100 ms step is a sizeable part of a list's time.
func waitFor(ctx context.Context, fns ...cache.InformerSynced) bool {
	err := wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, f := range fns {
			if !f() {
				return false, nil
			}
		}
		return true, nil
	})
	return err == nil
}

// goRun runs inf on a goroutine that Stop waits for.
func (in *Informers) goRun(ctx context.Context, inf cache.SharedIndexInformer) {
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		inf.RunWithContext(ctx)
	}()
}

// Stop stops every informer and waits for them. Idempotent.
func (in *Informers) Stop() {
	if in.cancel != nil {
		in.cancel()
	}
	in.wg.Wait()
}

// Synced reports whether every informer has synced.
func (in *Informers) Synced() bool {
	if in.ns != nil && !in.ns.HasSynced() {
		return false
	}
	for _, r := range in.running {
		if !r.synced() {
			return false
		}
	}
	return true
}

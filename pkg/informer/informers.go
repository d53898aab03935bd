package informer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

	// Discover, when set, says whether the cluster serves a resource now;
	// it is asked every PollEvery (default 10s) once started, so that a
	// rule whose resource is absent (a CRD not installed, or deleted)
	// waits and starts when it appears, and a resource that goes away has
	// its informer stopped and its objects reported gone (OnChange).
	Discover  func(ctx context.Context, gvr schema.GroupVersionResource) (bool, error)
	PollEvery time.Duration
	// OnChange is called, on the poller's goroutine, with the rules of an
	// informer that stopped because its resource went away (its cache is
	// empty now) or that synced after its resource appeared: the caller
	// reconciles their views. It must not call Stop.
	OnChange func(rules []*filters.Rule)
	// Owners, when set (a rule includes owners), are the owners' metadata
	// caches the rules read: run by Start before the rules' informers
	// (synced first, as the namespaces' are, so that the first objects
	// find their owners) and stopped by Stop.
	Owners OwnerCaches

	logger      *slog.Logger
	notify      Notify
	client      dynamic.Interface
	replayEvery map[string]time.Duration
	running     []*running
	ns          cache.SharedIndexInformer // namespaces, when a rule reads their labels
	nsRules     []*filters.Rule
	ownerRules  []*filters.Rule // the rules that ReadsOwners

	// shardSelector is sent with every list and watch of the rules'
	// resources (SetShardSelector).
	shardSelector atomic.Pointer[string]

	mu      sync.Mutex // Reselect and the poller replace informers one at a time
	stopped bool       // Stop was called: nothing starts any more
	wg      sync.WaitGroup
	cancel  context.CancelFunc // stops the namespaces informer and the poller
}

// OwnerCaches are informers the rules read besides their own: the owners'
// (internal/owners' Resolver).
type OwnerCaches interface {
	Informers() []cache.SharedIndexInformer
	Synced() bool
	Cached() map[string]int
	// Close ends the waits for owners not cached yet (Stop).
	Close()
	// OnChange has changed called when a cached object is added (before
	// nil), deleted (after nil), or its labels or ownerReferences change;
	// Below lists the uids of the cached objects below one (its
	// dependents, down their chains). Only for rules that ReadsOwners.
	OnChange(changed func(before, after metav1.Object)) error
	Below(uid string) []string
}

// running is a Watch and its informer: the informer runs while the
// cluster serves the resource; one whose resource goes away is stopped
// and replaced by a fresh one (empty), started when it comes back.
type running struct {
	Watch
	cur     atomic.Pointer[instance]
	absent  atomic.Bool  // the cluster does not serve the resource
	late    atomic.Bool  // started after Start: not part of readiness
	lastErr atomic.Value // string: the last list or watch error
}

// instance is one informer of a running and its handler registrations.
type instance struct {
	informer cache.SharedIndexInformer
	regs     []cache.ResourceEventHandlerRegistration
	cancel   context.CancelFunc // set once started
	done     chan struct{}      // closed when it stopped running
}

// inf is the current informer.
func (run *running) inf() cache.SharedIndexInformer { return run.cur.Load().informer }

// synced reports whether every handler registration has been handed the
// initial list, not only whether the cache has it.
func (inst *instance) synced() bool {
	for _, reg := range inst.regs {
		if !reg.HasSynced() {
			return false
		}
	}
	return true
}

// synced is readiness: an absent resource's empty view is in sync, and
// so is one that appeared after the start (it is reported as waiting until
// its list is in, see Waiting, without making the bridge unready).
func (run *running) synced() bool {
	return run.absent.Load() || run.late.Load() || run.cur.Load().synced()
}

// New prepares the informers of plan; nothing runs before Start.
//
// replayEvery gives the sinks that want a periodic full replay (resync) and
// their period. Such a sink gets its own handler registration on each
// informer that feeds it, with that resync period (client-go's per-handler
// resync), carrying its live events too, so that replays and live events
// reach it in order. The other sinks share one registration without resync.
func New(client dynamic.Interface, plan []Watch, notify Notify, replayEvery map[string]time.Duration, logger *slog.Logger) (*Informers, error) {
	in := &Informers{logger: logger, notify: notify, client: client, replayEvery: replayEvery}
	for _, w := range plan {
		for _, r := range w.Rules {
			if r.ReadsNamespaceLabels() && !slices.Contains(in.nsRules, r) {
				in.nsRules = append(in.nsRules, r)
			}
			if r.ReadsOwners() && !slices.Contains(in.ownerRules, r) {
				in.ownerRules = append(in.ownerRules, r)
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
		run := &running{Watch: w}
		run.absent.Store(w.Absent)
		inst, err := in.prepare(run)
		if err != nil {
			return nil, err
		}
		run.cur.Store(inst)
		in.running = append(in.running, run)
	}
	return in, nil
}

// prepare creates an informer of run's Watch, with an index per index key
// of its rules, and registers its handlers (see New).
func (in *Informers) prepare(run *running) (*instance, error) {
	w, client, replayEvery := run.Watch, in.client, in.replayEvery
	spec := w.Spec
	indexers := cache.Indexers{cache.NamespaceIndex: new(namespaceIndex).index}
	for _, r := range w.Rules {
		for _, k := range r.IndexKeys() {
			indexers[k.String()] = filters.IndexFunc(k)
		}
		if r.ReadsOwners() {
			indexers[relatedIndex] = relatedUIDs
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
			if sel := in.shardSelector.Load(); sel != nil {
				o.ShardSelector = *sel
			}
		}).Informer()
	if err := inf.SetTransform(w.transform()); err != nil {
		return nil, err
	}
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		run.lastErr.Store(err.Error())
		if run.absent.Load() {
			return // the poller stops it
		}
		in.logger.Warn("watch failed; the informer relists and retries", "informer", spec.String(), "error", err)
	})

	inst := &instance{informer: inf, done: make(chan struct{})}
	var common []Target
	for _, r := range w.Rules {
		t := Target{Rule: r}
		for _, sink := range r.Sinks {
			if !slices.Contains(replaying, sink) {
				t.Sinks = append(t.Sinks, sink)
			}
		}
		if len(t.Sinks) > 0 {
			common = append(common, t)
		}
	}
	if err := inst.register(in, common, false, 0); err != nil {
		return nil, err
	}
	for _, sink := range replaying {
		var targets []Target
		for _, r := range w.Rules {
			if slices.Contains(r.Sinks, sink) {
				targets = append(targets, Target{Rule: r, Sinks: []string{sink}})
			}
		}
		if err := inst.register(in, targets, true, replayEvery[sink]); err != nil {
			return nil, err
		}
	}
	return inst, nil
}

// register adds a handler for targets to the informer, with its own resync
// period (0: none).
func (inst *instance) register(in *Informers, targets []Target, replays bool, resync time.Duration) error {
	reg, err := inst.informer.AddEventHandlerWithResyncPeriod(handler(in, inst.informer.GetIndexer(), targets, replays), resync)
	if err != nil {
		return err
	}
	inst.regs = append(inst.regs, reg)
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
	if in.Owners != nil {
		if len(in.ownerRules) > 0 {
			if err := in.Owners.OnChange(in.ownerChanged); err != nil {
				return err
			}
		}
		for _, inf := range in.Owners.Informers() {
			in.goRun(runCtx, inf)
		}
		if !waitFor(ctx, in.Owners.Synced) {
			return fmt.Errorf("the owners' informers did not sync: %w", context.Cause(ctx))
		}
	}
	synced := make([]cache.InformerSynced, 0, len(in.running))
	for _, r := range in.running {
		if r.absent.Load() {
			in.logger.Warn("the cluster does not serve this resource; its rules wait for it", "informer", r.Spec.String(), "rules", ruleNames(r.Rules))
			continue
		}
		in.startInstance(r.cur.Load())
		synced = append(synced, r.synced)
	}
	if in.Discover != nil {
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			in.poll(runCtx)
		}()
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

// startInstance runs inst until Stop, or until the poller or Reselect
// stops it (inst.cancel: each instance is stopped on its own).
func (in *Informers) startInstance(inst *instance) {
	ctx, cancel := context.WithCancel(context.Background())
	inst.cancel = cancel
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		defer close(inst.done)
		inst.informer.RunWithContext(ctx)
	}()
}

// SetShardSelector makes every list and watch of the rules' resources
// from now on ask for the objects of some shards only
// (ListOptions.ShardSelector, KEP-5866; an apiserver without it ignores
// it). Set it before Start; Reselect changes it on running informers. The
// namespaces informer is never sharded.
func (in *Informers) SetShardSelector(selector string) { in.shardSelector.Store(&selector) }

// Reselect replaces every informer of the rules' resources by one that
// lists and watches with shardSelector, and waits until they synced or
// ctx ends. A watch cannot change its selector, so the new informers list
// again: their adds are notified with Initial set (an object they no
// longer list is not notified as gone: the caller reconciles, reading the
// new caches). No notification of the old informers follows its return.
func (in *Informers) Reselect(ctx context.Context, shardSelector string) error {
	in.mu.Lock()
	if in.stopped {
		in.mu.Unlock()
		return errors.New("the informers are stopped")
	}
	in.SetShardSelector(shardSelector)
	for _, run := range in.running {
		old := run.cur.Load()
		fresh, err := in.prepare(run)
		if err != nil {
			in.mu.Unlock()
			return err
		}
		if old.cancel != nil {
			old.cancel()
			<-old.done
		}
		run.cur.Store(fresh)
		if !run.absent.Load() {
			run.late.Store(false) // its new list is awaited like a start's
			in.startInstance(fresh)
		}
	}
	// Held until the lists are in: the poller must not start a resource
	// that appears meanwhile as "late", which readiness does not await.
	defer in.mu.Unlock()
	return in.WaitSynced(ctx)
}

// Stop stops every informer and waits for them. Idempotent.
func (in *Informers) Stop() {
	in.mu.Lock()
	in.stopped = true
	for _, run := range in.running {
		if inst := run.cur.Load(); inst != nil && inst.cancel != nil {
			inst.cancel()
		}
	}
	in.mu.Unlock()
	if in.Owners != nil {
		in.Owners.Close()
	}
	if in.cancel != nil {
		in.cancel()
	}
	in.wg.Wait()
}

// Cached returns how many objects each informer's cache holds, by its
// spec (for metrics: it lists the keys).
func (in *Informers) Cached() map[string]int {
	out := map[string]int{}
	for _, r := range in.running {
		out[r.Spec.String()] += len(r.inf().GetStore().ListKeys())
	}
	if in.Owners != nil {
		for name, n := range in.Owners.Cached() {
			out[name] += n
		}
	}
	return out
}

// Synced reports whether every informer has synced.
func (in *Informers) Synced() bool {
	if in.ns != nil && !in.ns.HasSynced() {
		return false
	}
	if in.Owners != nil && !in.Owners.Synced() {
		return false
	}
	for _, r := range in.running {
		if !r.synced() {
			return false
		}
	}
	return true
}

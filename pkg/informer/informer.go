// Package informer runs the dynamic shared informers kubebridge watches
// through: one per resource and scope, shared by every rule on it.
//
// Plan decides the informers: when every rule on a resource names its
// namespaces, one informer per named namespace (so namespaced RBAC is
// enough); otherwise one cluster-wide informer. A label or field selector is
// sent to the apiserver only when every rule on that informer has the same
// one (then it is exact); otherwise rules filter client-side. Objects enter
// the cache without managedFields. Each rule's index keys are registered as
// Indexers, beside the namespace index every informer has.
//
// The handler never blocks: it hands each notification's object key and
// state to Notify (pkg/view then compares it with what each sink was
// handed, and only enqueues). Deletions missed while a watch was
// down arrive as tombstones (cache.DeletedFinalStateUnknown) after the
// relist; a uid replaced while it was down arrives as an update, which the
// view turns into deleted + added.
package informer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// Spec identifies one informer.
type Spec struct {
	GVR           schema.GroupVersionResource
	Namespace     string // "" = all namespaces (or a cluster-scoped resource)
	LabelSelector string // sent to the apiserver
	FieldSelector string // sent to the apiserver
}

func (s Spec) String() string {
	var b strings.Builder
	b.WriteString(s.GVR.Resource)
	if s.GVR.Group != "" {
		b.WriteString("." + s.GVR.Group)
	}
	if s.Namespace != "" {
		b.WriteString(" in " + s.Namespace)
	}
	if s.LabelSelector != "" {
		b.WriteString(" labels " + s.LabelSelector)
	}
	if s.FieldSelector != "" {
		b.WriteString(" fields " + s.FieldSelector)
	}
	return b.String()
}

// Planned is an informer to run and the rules it feeds.
type Planned struct {
	Spec  Spec
	Rules []*filters.Rule
}

// RuleSelectors are a rule's selectors as written, for planning.
type RuleSelectors struct {
	Namespaces    []string
	LabelSelector string
	FieldSelector string
}

// Plan groups rules into informers (see the package doc). namespaced says
// whether each resource is namespaced; sel gives each rule's selectors.
func Plan(rules []*filters.Rule, sel map[*filters.Rule]RuleSelectors, namespaced map[schema.GroupVersionResource]bool) []Planned {
	byGVR := map[schema.GroupVersionResource][]*filters.Rule{}
	var order []schema.GroupVersionResource
	for _, r := range rules {
		if _, seen := byGVR[r.GVR]; !seen {
			order = append(order, r.GVR)
		}
		byGVR[r.GVR] = append(byGVR[r.GVR], r)
	}
	var out []Planned
	for _, gvr := range order {
		rs := byGVR[gvr]
		perNamespace := namespaced[gvr]
		for _, r := range rs {
			if len(sel[r].Namespaces) == 0 {
				perNamespace = false
			}
		}
		if !perNamespace {
			out = append(out, planned(Spec{GVR: gvr}, rs, sel))
			continue
		}
		byNS := map[string][]*filters.Rule{}
		for _, r := range rs {
			for _, ns := range sel[r].Namespaces {
				byNS[ns] = append(byNS[ns], r)
			}
		}
		namespaces := make([]string, 0, len(byNS))
		for ns := range byNS {
			namespaces = append(namespaces, ns)
		}
		sort.Strings(namespaces)
		for _, ns := range namespaces {
			out = append(out, planned(Spec{GVR: gvr, Namespace: ns}, byNS[ns], sel))
		}
	}
	return out
}

// planned sets the server-side selectors shared by all of rs. Field
// selectors go to the apiserver only when they use metadata.name and
// metadata.namespace, which every resource supports; others (status.phase,
// spec.nodeName, ...) are supported per resource, and a list the apiserver
// refuses would keep the informer from ever syncing, so they are evaluated
// client-side.
func planned(s Spec, rs []*filters.Rule, sel map[*filters.Rule]RuleSelectors) Planned {
	s.LabelSelector, s.FieldSelector = sel[rs[0]].LabelSelector, sel[rs[0]].FieldSelector
	for _, r := range rs[1:] {
		if sel[r].LabelSelector != s.LabelSelector {
			s.LabelSelector = ""
		}
		if sel[r].FieldSelector != s.FieldSelector {
			s.FieldSelector = ""
		}
	}
	if !universalFields(s.FieldSelector) {
		s.FieldSelector = ""
	}
	return Planned{Spec: s, Rules: rs}
}

func universalFields(selector string) bool {
	if selector == "" {
		return true
	}
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return false
	}
	for _, req := range sel.Requirements() {
		if req.Field != "metadata.name" && req.Field != "metadata.namespace" {
			return false
		}
	}
	return true
}

// Notification says that an object key may have changed. The receiver
// syncs each target sink's view of each rule with the state it carries, or
// reads the key's current state from Cache; it is called on the informer's
// goroutine and must not block.
type Notification struct {
	Key     string                     // namespace/name, or name
	Targets map[*filters.Rule][]string // rules to evaluate and the sinks to sync for each
	Cache   cache.KeyGetter            // the informer's cache
	Object  *unstructured.Unstructured // the state an add or update notification carries
	Gone    *unstructured.Unstructured // the last state, for a delete notification
	Resync  bool                       // an informer resync: a replay to the registration's sinks
}

// Notify receives notifications; see Notification.
type Notify func(n Notification)

// Informers runs a set of planned informers.
type Informers struct {
	// SkipInitialList drops the adds of each informer's first list: a
	// checkpoint reconciliation delivers the view that list shows instead.
	SkipInitialList bool

	logger  *slog.Logger
	notify  Notify
	running []*running
	ns      cache.SharedIndexInformer // namespaces, when a rule selects them by label
	nsRules []*filters.Rule

	wg     sync.WaitGroup
	cancel context.CancelFunc
}

type running struct {
	Planned
	informer cache.SharedIndexInformer
	regs     []cache.ResourceEventHandlerRegistration
}

func (r *running) synced() bool {
	for _, reg := range r.regs {
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
func New(client dynamic.Interface, plan []Planned, notify Notify, replayEvery map[string]time.Duration, logger *slog.Logger) (*Informers, error) {
	in := &Informers{logger: logger, notify: notify}
	for _, p := range plan {
		for _, r := range p.Rules {
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
	for _, p := range plan {
		spec := p.Spec
		indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
		for _, r := range p.Rules {
			for _, k := range r.IndexKeys() {
				indexers[k.String()] = filters.IndexFunc(k)
			}
		}
		// Sinks of this informer's rules that replay, and the shortest period:
		// the informer checks for due resyncs that often.
		var replaying []string
		var resyncCheck time.Duration
		for _, r := range p.Rules {
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
		transform := stripManagedFields
		if p.MetadataOnly() {
			transform = keepMetadata
		}
		if err := inf.SetTransform(transform); err != nil {
			return nil, err
		}
		_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			logger.Warn("watch failed; the informer relists and retries", "informer", spec.String(), "error", err)
		})
		run := &running{Planned: p, informer: inf}
		common := map[*filters.Rule][]string{}
		for _, r := range p.Rules {
			for _, sink := range r.Sinks {
				if !slices.Contains(replaying, sink) {
					common[r] = append(common[r], sink)
				}
			}
		}
		reg, err := inf.AddEventHandlerWithResyncPeriod(run.handler(in, common, false), 0)
		if err != nil {
			return nil, err
		}
		run.regs = append(run.regs, reg)
		for _, sink := range replaying {
			targets := map[*filters.Rule][]string{}
			for _, r := range p.Rules {
				if slices.Contains(r.Sinks, sink) {
					targets[r] = []string{sink}
				}
			}
			reg, err := inf.AddEventHandlerWithResyncPeriod(run.handler(in, targets, true), replayEvery[sink])
			if err != nil {
				return nil, err
			}
			run.regs = append(run.regs, reg)
		}
		in.running = append(in.running, run)
	}
	return in, nil
}

// NamespaceLabels is the filters.NamespaceLabels backed by the namespace
// informer (valid once Start has synced it).
func (in *Informers) NamespaceLabels(ns string) (labels.Set, bool) {
	if in.ns == nil {
		return nil, false
	}
	obj, ok, err := in.ns.GetStore().GetByKey(ns)
	if err != nil || !ok {
		return nil, false
	}
	return labels.Set(obj.(*unstructured.Unstructured).GetLabels()), true
}

// Start runs the informers and waits until every cache has synced (the
// namespace informer first, so that namespace selectors are right from the
// first object), or ctx ends. The informers stop when Stop is called.
func (in *Informers) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	if in.ns != nil {
		if _, err := in.ns.AddEventHandler(in.namespaceHandler()); err != nil {
			return err
		}
		in.goRun(runCtx, in.ns)
		if !cache.WaitForCacheSync(ctx.Done(), in.ns.HasSynced) {
			return fmt.Errorf("namespaces informer did not sync: %w", context.Cause(ctx))
		}
	}
	synced := make([]cache.InformerSynced, 0, len(in.running))
	for _, r := range in.running {
		in.goRun(runCtx, r.informer)
		synced = append(synced, r.synced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
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

// View returns the objects currently in rule r's view, from the caches of
// the informers that feed it. A rule with index terms is enumerated through
// the informer's index (ByIndex on its first term), not by a full scan.
func (in *Informers) View(r *filters.Rule) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	name, values, indexed := r.IndexLookup()
	for _, run := range in.running {
		if !slices.Contains(run.Rules, r) {
			continue
		}
		var objs []any
		if indexed {
			for _, v := range values {
				got, err := run.informer.GetIndexer().ByIndex(name, v)
				if err != nil {
					in.logger.Error("index lookup failed; scanning", "rule", r.Name, "index", name, "error", err)
					objs = run.informer.GetStore().List()
					break
				}
				objs = append(objs, got...)
			}
		} else {
			objs = run.informer.GetStore().List()
		}
		seen := map[*unstructured.Unstructured]bool{}
		for _, o := range objs {
			u, ok := o.(*unstructured.Unstructured)
			if ok && !seen[u] && r.InView(u) {
				seen[u] = true
				out = append(out, u)
			}
		}
	}
	return out
}

// Specs lists the running informers, for logs.
func (in *Informers) Specs() []string {
	out := make([]string, len(in.running))
	for i, r := range in.running {
		out[i] = r.Spec.String()
		if r.MetadataOnly() {
			out[i] += " (metadata only)"
		}
	}
	return out
}

// Cache returns the cache of the informer that holds key for rule r (nil if
// no informer of r covers it).
func (in *Informers) Cache(r *filters.Rule, key string) cache.KeyGetter {
	ns, _, _ := cache.SplitMetaNamespaceKey(key)
	for _, run := range in.running {
		if slices.Contains(run.Rules, r) && (run.Spec.Namespace == "" || run.Spec.Namespace == ns) {
			return run.informer.GetIndexer()
		}
	}
	return nil
}

// handler notifies the key of every notification to the rules in targets.
// With replays set (a sink's own registration, with its resync period), an
// informer resync (an update with an unchanged resourceVersion) is a
// replay; other registrations never see resyncs.
func (run *running) handler(in *Informers, targets map[*filters.Rule][]string, replays bool) cache.ResourceEventHandler {
	notify := func(obj any, state, gone *unstructured.Unstructured, resync bool) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		in.notify(Notification{Key: key, Targets: targets, Cache: run.informer.GetIndexer(), Object: state, Gone: gone, Resync: resync})
	}
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initialList bool) {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok || (initialList && in.SkipInitialList) {
				return
			}
			notify(u, u, nil, false)
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*unstructured.Unstructured)
			u, ok2 := obj.(*unstructured.Unstructured)
			if !ok1 || !ok2 {
				return
			}
			resync := old.GetResourceVersion() == u.GetResourceVersion()
			if resync && !replays {
				return
			}
			notify(u, u, nil, resync)
		},
		DeleteFunc: func(obj any) {
			// A tombstone without a usable last state still syncs the key:
			// the cache no longer has it, so the sink's view sends its deletion.
			notify(obj, nil, filters.AsUnstructured(obj), false)
		},
	}
}

// namespaceHandler syncs the objects of a namespace for the rules that
// select namespaces by label, when the namespace appears (objects seen
// before their namespace enter the view now) or its labels change the
// rule's selection.
func (in *Informers) namespaceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if ns, ok := obj.(*unstructured.Unstructured); ok {
				for _, r := range in.nsRules {
					in.syncNamespace(r, ns.GetName())
				}
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*unstructured.Unstructured)
			ns, ok2 := obj.(*unstructured.Unstructured)
			if !ok1 || !ok2 {
				return
			}
			before, after := labels.Set(old.GetLabels()), labels.Set(ns.GetLabels())
			for _, r := range in.nsRules {
				if r.MatchesNamespace(before) != r.MatchesNamespace(after) {
					in.syncNamespace(r, ns.GetName())
				}
			}
		},
	}
}

func (in *Informers) syncNamespace(r *filters.Rule, ns string) {
	targets := map[*filters.Rule][]string{r: r.Sinks}
	for _, run := range in.running {
		if !slices.Contains(run.Rules, r) {
			continue
		}
		objs, err := run.informer.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
		if err != nil {
			in.logger.Error("namespace index lookup failed", "rule", r.Name, "namespace", ns, "error", err)
			continue
		}
		for _, o := range objs {
			key, err := cache.MetaNamespaceKeyFunc(o)
			if err != nil {
				continue
			}
			in.notify(Notification{Key: key, Targets: targets, Cache: run.informer.GetIndexer()})
		}
	}
}

// MetadataOnly reports whether no rule of the informer needs more of an
// object than its apiVersion, kind and metadata: then only those are cached.
func (p Planned) MetadataOnly() bool {
	for _, r := range p.Rules {
		if !r.MetadataOnly() {
			return false
		}
	}
	return len(p.Rules) > 0
}

// keepMetadata reduces objects to apiVersion, kind and metadata (without
// managedFields) before they are cached, for informers whose rules need no
// more: a fraction of the memory for objects with large specs or data.
func keepMetadata(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.Object = event.MetadataOnly(u.Object)
	}
	return obj, nil
}

// stripManagedFields drops metadata.managedFields before objects are cached
// (they are large and no rule needs them) and interns what repeats across
// objects.
func stripManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		if md, ok := u.Object["metadata"].(map[string]any); ok {
			delete(md, "managedFields")
		}
		u.Object = intern(u.Object, 0)
	}
	return obj, nil
}

// intern rebuilds a decoded object with its map keys, and the values that
// repeat across objects (apiVersion, kind, namespace, label values, owner
// kinds), replaced by canonical copies: the JSON decoder allocates every
// string anew, and the keys alone are a tenth of a small object's cache
// footprint. Other values (names, uids, data) are unique and kept as they are.
func intern(m map[string]any, depth int) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			out[unique.Make(k).Value()] = intern(v, depth+1)
		case []any:
			for i, e := range v {
				if em, ok := e.(map[string]any); ok {
					v[i] = intern(em, depth+1)
				}
			}
			out[unique.Make(k).Value()] = v
		case string:
			if len(v) <= 63 && repeats(k, depth) { // label values are at most 63 bytes
				v = unique.Make(v).Value()
			}
			out[unique.Make(k).Value()] = v
		default:
			out[unique.Make(k).Value()] = v
		}
	}
	return out
}

// repeats says whether string values of key at depth are worth interning.
func repeats(key string, depth int) bool {
	switch key {
	case "apiVersion", "kind":
		return true
	case "namespace":
		return depth == 1
	}
	return depth == 2 // metadata.labels values (and short values of other maps two levels down)
}

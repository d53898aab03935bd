// Package owners resolves an object's owner chain (Pod → ReplicaSet →
// Deployment, Job → CronJob, any CRD owner) and, for a Kubernetes Event,
// the object it is about, from shared metadata-only informers, so that a
// message can name what an object belongs to and an expression can choose
// by it.
//
// Only the resources the rules need are watched (Needs; their list and
// watch is what the chart's RBAC grants), each through one metadata
// informer per scope (all namespaces, or each namespace the rules name)
// that caches names, labels and ownerReferences only. The caller runs the
// informers (Informers) and ends the waits (Close): one owner of every
// goroutine.
//
// An owner whose kind is not watched is named from its ownerReference at
// once, and the chain says it is incomplete. One not in its cache yet (it
// was created a moment before its child and its watch event has not
// arrived) is waited for, up to the wait given, then named from the
// reference the same way, but only when that can help: the child is young
// (created, or for an Event's object last reported, in the last youngFor),
// the reference can be in a cache (a namespaced kind names a namespace),
// it was not waited for in vain lately and the caches did not see it
// deleted (an owner deleted before its children, a Pod deleted before
// the Events about it), and the resolver's wait budget is not spent: the
// waits run on an informer's goroutine, and whoever may create the
// objects (Events name anything) must not be able to stall the rules.
// Chains are bounded (MaxDepth) and cycles in ownerReferences end them.
package owners

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// MaxDepth bounds a chain: Kubernetes' deepest built-in one is two owners
// (a Pod's ReplicaSet and Deployment); ownerReferences are written by
// users too.
const MaxDepth = 8

// DefaultWait is how long a notification waits for an owner not cached
// yet. An owner is created before the children its controller makes, so
// its watch event is normally in first; the wait covers the two watches'
// skew, not a missing owner.
const DefaultWait = time.Second

// missedFor is how long a reference waited for in vain is not waited for
// again; missedMax bounds how many are remembered.
const (
	missedFor = time.Minute
	missedMax = 10_000
)

// youngFor is how recent a child must be (its creation, an Event's last
// report) for its owners to be waited for: the skew between two watches is
// milliseconds; an older child's owner missing from a synced cache is
// gone, or never was.
const youngFor = 10 * time.Second

// The wait budget: a resolver waits at most budgetBurst at once, and
// budgetBurst more every budgetEvery, whatever the objects say.
const (
	budgetBurst = time.Second
	budgetEvery = 10 * time.Second
)

// Resource is a resource whose objects may own others (or be an Event's
// involved object), the kind of its objects, and whether they are
// cluster-scoped (the built-in ones of Needs are namespaced).
type Resource struct {
	GVR     schema.GroupVersionResource
	Kind    string
	Cluster bool
}

func (r Resource) String() string {
	if r.GVR.Group == "" {
		return r.GVR.Version + "/" + r.GVR.Resource
	}
	return r.GVR.Group + "/" + r.GVR.Version + "/" + r.GVR.Resource
}

var (
	pods         = Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod"}
	replicaSets  = Resource{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, Kind: "ReplicaSet"}
	deployments  = Resource{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Kind: "Deployment"}
	statefulSets = Resource{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, Kind: "StatefulSet"}
	daemonSets   = Resource{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}, Kind: "DaemonSet"}
	jobs         = Resource{GVR: schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, Kind: "Job"}
	cronJobs     = Resource{GVR: schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "cronjobs"}, Kind: "CronJob"}
)

// Needs lists the built-in resources whose objects own objects of gvr, up
// to their top controller (for a Kubernetes Event: the objects it is
// about, Pods and those controllers, and their owners). The chart's
// kubebridge.ownerResources renders the same table (TestChartOwnerRBAC).
func Needs(gvr schema.GroupVersionResource) []Resource {
	workloads := []Resource{replicaSets, deployments, statefulSets, daemonSets, jobs, cronJobs}
	switch {
	case config.IsKubernetesEvent(gvr):
		return append([]Resource{pods}, workloads...)
	case gvr.Group == "" && gvr.Resource == "pods":
		return workloads
	case gvr.Group == "apps" && gvr.Resource == "replicasets":
		return []Resource{deployments}
	case gvr.Group == "apps" && gvr.Resource == "controllerrevisions":
		return []Resource{statefulSets, daemonSets}
	case gvr.Group == "batch" && gvr.Resource == "jobs":
		return []Resource{cronJobs}
	}
	return nil
}

// Watch is one resource to cache, in one namespace ("": all).
type Watch struct {
	Resource
	Namespace string
}

// Resolver resolves chains from its informers' caches.
type Resolver struct {
	// byKind holds the informers of a kind (ownerReferences name group
	// and kind; the version they carry may be another the apiserver
	// serves), by namespace ("": every namespace).
	byKind    map[schema.GroupKind]map[string]cache.SharedIndexInformer
	cluster   map[schema.GroupKind]bool // the cluster-scoped kinds
	informers []cache.SharedIndexInformer
	names     []string
	closed    chan struct{}
	closeOnce sync.Once

	mu sync.Mutex
	// missed holds the references waited for in vain or deleted (by uid,
	// else by kind, namespace and name), until when they are not waited
	// for.
	missed map[string]time.Time
	// budget is the waiting left (budgetBurst at most), as of budgetAt.
	budget   time.Duration
	budgetAt time.Time
}

// New makes a resolver over watches; nothing runs before the caller runs
// Informers. keepLabels, when not nil, are the only labels its caches keep
// (the union of what the rules show: their ownerLabels).
func New(client metadata.Interface, watches []Watch, keepLabels []string) *Resolver {
	r := &Resolver{
		byKind:   map[schema.GroupKind]map[string]cache.SharedIndexInformer{},
		cluster:  map[schema.GroupKind]bool{},
		closed:   make(chan struct{}),
		missed:   map[string]time.Time{},
		budget:   budgetBurst,
		budgetAt: time.Now(),
	}
	for _, w := range watches {
		inf := metadatainformer.NewFilteredMetadataInformer(client, w.GVR, w.Namespace, 0, cache.Indexers{}, nil).Informer()
		_ = inf.SetTransform(trim(keepLabels)) // only fails once the informer runs
		// An object deleted is not waited for: the Events about a Pod
		// just deleted, the children of an owner deleted first.
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, ok := obj.(metav1.Object); ok && m.GetUID() != "" {
				r.miss(string(m.GetUID()))
			}
		}})
		gk := schema.GroupKind{Group: w.GVR.Group, Kind: w.Kind}
		if r.byKind[gk] == nil {
			r.byKind[gk] = map[string]cache.SharedIndexInformer{}
		}
		r.byKind[gk][w.Namespace] = inf
		r.cluster[gk] = w.Cluster
		r.informers = append(r.informers, inf)
		name := "owners:" + w.Resource.String()
		if w.Namespace != "" {
			name += " in " + w.Namespace
		}
		r.names = append(r.names, name)
	}
	return r
}

// Informers are the informers to run (until the caller stops them).
func (r *Resolver) Informers() []cache.SharedIndexInformer { return r.informers }

// Synced reports whether every informer has listed once.
func (r *Resolver) Synced() bool {
	for _, inf := range r.informers {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// Cached returns how many objects each informer holds, by name (for the
// informer cache metric).
func (r *Resolver) Cached() map[string]int {
	out := make(map[string]int, len(r.informers))
	for i, inf := range r.informers {
		out[r.names[i]] = len(inf.GetStore().ListKeys())
	}
	return out
}

// Close ends every wait, now and later (the bridge is stopping).
// Idempotent.
func (r *Resolver) Close() { r.closeOnce.Do(func() { close(r.closed) }) }

// ownerIndex indexes the caches' objects by the uids their
// ownerReferences name (OnChange adds it; Below walks down chains with it).
const ownerIndex = "kubebridge/owner"

// ownerUIDs is ownerIndex's function.
func ownerUIDs(obj any) ([]string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, nil
	}
	refs := m.GetOwnerReferences()
	if len(refs) == 0 {
		return nil, nil
	}
	uids := make([]string, 0, len(refs))
	for _, ref := range refs {
		if ref.UID != "" {
			uids = append(uids, string(ref.UID))
		}
	}
	return uids, nil
}

// OnChange calls changed, on an owner informer's goroutine, when a cached
// object's metadata changes as a chain reads it: it is added after the
// first list (before nil) or deleted (after nil), or its labels or ownerReferences change. It
// indexes the caches by owner (Below). Call it before the informers run;
// changed must not block.
func (r *Resolver) OnChange(changed func(before, after metav1.Object)) error {
	for _, inf := range r.informers {
		if err := inf.AddIndexers(cache.Indexers{ownerIndex: ownerUIDs}); err != nil {
			return err
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initialList bool) {
				// The first list is in before the rules' informers start:
				// nothing below it was evaluated yet.
				if m, ok := obj.(metav1.Object); ok && !initialList {
					changed(nil, m)
				}
			},
			UpdateFunc: func(oldObj, obj any) {
				old, ok1 := oldObj.(metav1.Object)
				m, ok2 := obj.(metav1.Object)
				if ok1 && ok2 && (!maps.Equal(old.GetLabels(), m.GetLabels()) || !slices.EqualFunc(old.GetOwnerReferences(), m.GetOwnerReferences(), sameRef)) {
					changed(old, m)
				}
			},
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				if m, ok := obj.(metav1.Object); ok {
					changed(m, nil)
				}
			},
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// sameRef reports whether two ownerReferences name the same owner the same
// way (a chain follows the controller reference).
func sameRef(a, b metav1.OwnerReference) bool {
	return a.UID == b.UID && a.Kind == b.Kind && a.APIVersion == b.APIVersion && a.Name == b.Name &&
		(a.Controller != nil && *a.Controller) == (b.Controller != nil && *b.Controller)
}

// Below returns the uids of the cached objects a chain may reach uid from:
// those whose ownerReferences name it, and so on down, MaxDepth levels at
// most (a Deployment's ReplicaSets, and for a rule on Events their Pods).
// Only after OnChange.
func (r *Resolver) Below(uid string) []string {
	var out []string
	seen := map[string]bool{uid: true}
	level := []string{uid}
	for depth := 0; depth < MaxDepth && len(level) > 0; depth++ {
		var next []string
		for _, u := range level {
			for _, inf := range r.informers {
				objs, err := inf.GetIndexer().ByIndex(ownerIndex, u)
				if err != nil {
					continue
				}
				for _, o := range objs {
					m, ok := o.(metav1.Object)
					if !ok || seen[string(m.GetUID())] {
						continue
					}
					seen[string(m.GetUID())] = true
					next = append(next, string(m.GetUID()))
				}
			}
		}
		out = append(out, next...)
		level = next
	}
	return out
}

// Chain is an object's owner chain, nearest first, and whether it may
// stop short of the top (see event.Related).
type Chain struct {
	Owners     []event.Owner
	Incomplete bool
}

// Resolve returns the chain of an object in namespace ns with these
// ownerReferences (its uid ends a cycle back to it): at each step the
// controller reference, else the first. An owner not cached yet is waited
// for until deadline.
func (r *Resolver) Resolve(uid types.UID, ns string, refs []metav1.OwnerReference, deadline time.Time) Chain {
	var c Chain
	seen := map[types.UID]bool{uid: true}
	for len(refs) > 0 {
		ref := pick(refs)
		if seen[ref.UID] {
			break // a cycle: every owner is in the chain once
		}
		if len(c.Owners) == MaxDepth {
			c.Incomplete = true
			break
		}
		seen[ref.UID] = true
		o := event.Owner{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: string(ref.UID)}
		found, ok := r.lookup(ref.APIVersion, ref.Kind, ns, ref.Name, ref.UID, deadline)
		if !ok {
			c.Owners = append(c.Owners, o)
			c.Incomplete = true
			break
		}
		o.Labels = found.GetLabels()
		c.Owners = append(c.Owners, o)
		refs = found.GetOwnerReferences()
	}
	return c
}

// Related resolves what include: [owners] adds to obj (an object of
// resource gvr): its chain and, for a Kubernetes Event, the involved
// object and its chain, waiting for what is not cached yet until
// deadline (the zero time: not at all) when obj is young: created (for
// the involved object: the Event last reported) in the last youngFor.
func (r *Resolver) Related(gvr schema.GroupVersionResource, obj *unstructured.Unstructured, deadline time.Time) *event.Related {
	now := time.Now()
	own := deadline
	if !young(obj.GetCreationTimestamp().Time, now) {
		own = time.Time{}
	}
	c := r.Resolve(obj.GetUID(), obj.GetNamespace(), obj.GetOwnerReferences(), own)
	rel := &event.Related{Owners: c.Owners, Incomplete: c.Incomplete}
	if config.IsKubernetesEvent(gvr) {
		if !young(reported(obj), now) {
			deadline = time.Time{}
		}
		rel.Involved = r.involved(obj, deadline)
	}
	return rel
}

// young reports whether t is within youngFor of now (either side: the
// apiserver's clock may be ahead).
func young(t, now time.Time) bool {
	return !t.IsZero() && t.After(now.Add(-youngFor)) && t.Before(now.Add(youngFor))
}

// reported is when an Event last reported its object: the latest of its
// times (core/v1 lastTimestamp, eventTime, series.lastObservedTime;
// events.k8s.io/v1 deprecatedLastTimestamp) and its creation.
func reported(ev *unstructured.Unstructured) time.Time {
	last := ev.GetCreationTimestamp().Time
	for _, path := range [][]string{{"lastTimestamp"}, {"eventTime"}, {"series", "lastObservedTime"}, {"deprecatedLastTimestamp"}} {
		v, _, _ := unstructured.NestedString(ev.Object, path...)
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.After(last) {
			last = t
		}
	}
	return last
}

// involved is the object an Event is about: involvedObject (core/v1) or
// regarding (events.k8s.io/v1), found in the caches with its chain, or
// what the reference says of it. Only an object of the Event's own
// namespace (or a cluster-scoped one) is looked up: anyone who may create
// Events in a namespace may name any object in them, and another
// namespace's labels and owners would let them choose where and how the
// Event is routed.
func (r *Resolver) involved(ev *unstructured.Unstructured, deadline time.Time) *event.Involved {
	field := "involvedObject"
	if _, ok := ev.Object["regarding"]; ok {
		field = "regarding"
	}
	ref, _ := ev.Object[field].(map[string]any)
	if ref == nil {
		return nil
	}
	s := func(k string) string { v, _ := ref[k].(string); return v }
	in := &event.Involved{APIVersion: s("apiVersion"), Kind: s("kind"), Namespace: s("namespace"), Name: s("name"), UID: s("uid")}
	if in.Kind == "" || in.Name == "" {
		return in
	}
	ns := in.Namespace
	if gv, err := schema.ParseGroupVersion(in.APIVersion); err == nil && r.cluster[schema.GroupKind{Group: gv.Group, Kind: in.Kind}] {
		ns = ""
	} else if ns != ev.GetNamespace() {
		in.Incomplete = true
		return in
	}
	found, ok := r.lookup(in.APIVersion, in.Kind, ns, in.Name, types.UID(in.UID), deadline)
	if !ok {
		in.Incomplete = true
		return in
	}
	in.Found = true
	in.Labels = found.GetLabels()
	if in.UID == "" {
		in.UID = string(found.GetUID())
	}
	c := r.Resolve(found.GetUID(), found.GetNamespace(), found.GetOwnerReferences(), deadline)
	in.Owners, in.Incomplete = c.Owners, c.Incomplete
	return in
}

// pick is the reference a chain follows: the controller, else the first.
func pick(refs []metav1.OwnerReference) metav1.OwnerReference {
	for _, ref := range refs {
		if ref.Controller != nil && *ref.Controller {
			return ref
		}
	}
	return refs[0]
}

// lookup finds an object of apiVersion's group and kind named name in
// namespace ns (a cluster-scoped kind: whatever ns) in the caches; uid,
// when set, must be its uid (a name re-used by a new object is not the
// owner). It polls until deadline while the object is missing from a
// cache that may get it.
func (r *Resolver) lookup(apiVersion, kind, ns, name string, uid types.UID, deadline time.Time) (metav1.Object, bool) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, false
	}
	gk := schema.GroupKind{Group: gv.Group, Kind: kind}
	key := ns + "/" + name
	switch {
	case r.cluster[gk]:
		ns, key = "", name
	case ns == "":
		return nil, false // a namespaced kind named without a namespace: never in a cache
	}
	missKey := string(uid)
	if uid == "" {
		missKey = gk.String() + " " + key // a reference without a uid (an Event's may lack it)
	}
	infs := r.byKind[gk]
	var candidates []cache.SharedIndexInformer
	for _, scope := range []string{"", ns} {
		if inf := infs[scope]; inf != nil {
			candidates = append(candidates, inf)
		}
	}
	if len(candidates) == 0 {
		return nil, false // a kind not watched (or not in this namespace): named from the reference
	}
	waited := false
	for {
		for _, inf := range candidates {
			item, exists, err := inf.GetIndexer().GetByKey(key)
			if err != nil || !exists {
				continue
			}
			if m, ok := item.(metav1.Object); ok && (uid == "" || m.GetUID() == uid) {
				return m, true
			}
		}
		if deadline.IsZero() || !waited && r.missedBefore(missKey) {
			return nil, false
		}
		waited = true
		now := time.Now()
		wait := deadline.Sub(now)
		if wait <= 0 {
			r.miss(missKey)
			return nil, false
		}
		step := min(10*time.Millisecond, wait)
		if !r.spend(step, now) {
			return nil, false // the budget is spent: named from the reference, not remembered as missing
		}
		t := time.NewTimer(step)
		select {
		case <-r.closed:
			t.Stop()
			return nil, false
		case <-t.C:
		}
	}
}

// spend takes d of the wait budget, refilled as of now; false (nothing
// taken) when less is left.
func (r *Resolver) spend(d time.Duration, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if elapsed := now.Sub(r.budgetAt); elapsed > 0 {
		r.budget = min(budgetBurst, r.budget+time.Duration(float64(elapsed)*float64(budgetBurst)/float64(budgetEvery)))
		r.budgetAt = now
	}
	if r.budget < d {
		return false
	}
	r.budget -= d
	return true
}

// missedBefore reports whether a reference (lookup's missKey: its uid,
// else its kind and name) was waited for in vain, or deleted, lately.
func (r *Resolver) missedBefore(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	until, ok := r.missed[key]
	if ok && time.Now().After(until) {
		delete(r.missed, key)
		return false
	}
	return ok
}

// miss remembers that a reference (lookup's missKey) was waited for in
// vain, or deleted.
func (r *Resolver) miss(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.missed) >= missedMax {
		now := time.Now()
		for k, until := range r.missed {
			if now.After(until) {
				delete(r.missed, k)
			}
		}
		if len(r.missed) >= missedMax {
			clear(r.missed) // a storm of missing owners: forget, and wait again
		}
	}
	r.missed[key] = time.Now().Add(missedFor)
}

// trim is the caches' transform: it keeps what a chain reads of an
// object, its names, uid, labels (those in keep, unless nil) and owner
// references (managedFields and annotations can be most of an object's
// metadata).
func trim(keep []string) cache.TransformFunc {
	return func(obj any) (any, error) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return obj, nil
		}
		labels := m.Labels
		if keep != nil && labels != nil {
			labels = map[string]string{}
			for _, k := range keep {
				if v, ok := m.Labels[k]; ok {
					labels[k] = v
				}
			}
		}
		m.ObjectMeta = metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
			Labels: labels, OwnerReferences: m.OwnerReferences,
		}
		return obj, nil
	}
}

// String is the chain as a person reads it: "ReplicaSet web-6d4 →
// Deployment web".
func (c Chain) String() string {
	var b strings.Builder
	for i, o := range c.Owners {
		if i > 0 {
			b.WriteString(" → ")
		}
		fmt.Fprintf(&b, "%s %s", o.Kind, o.Name)
	}
	return b.String()
}

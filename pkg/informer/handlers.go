package informer

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// Notification says that an object key may have changed. The receiver
// syncs each target sink's view of each rule with the state it carries, or
// reads the key's current state from Cache; it is called on the informer's
// goroutine and must not block.
type Notification struct {
	Key     string                     // namespace/name, or name
	Targets []Target                   // rules to evaluate and the sinks to sync for each
	Cache   cache.KeyGetter            // the informer's cache
	Object  *unstructured.Unstructured // the state an add or update notification carries
	Meta    event.Meta                 // Object's (event.MetaOf), read once by the handler; zero: unknown
	Gone    *unstructured.Unstructured // the last state, for a delete notification
	// Replaced is the previous state of an update whose object has
	// another uid (a relist found it deleted and created again under the
	// same key): a receiver that places objects by uid (shards) must also
	// tell the old incarnation's place that it is gone.
	Replaced *unstructured.Unstructured
	Resync   bool // an informer resync: a replay to the registration's sinks
	// Initial marks an add of the informer's first list (see
	// Informers.SkipInitialList): other caches may not have synced yet.
	Initial bool
}

// Target is a rule a notification is for and the sinks to sync for it. A
// registration's targets are a slice, in the rules' order, made once: the
// receiver ranges over them on every notification.
type Target struct {
	Rule  *filters.Rule
	Sinks []string
}

// Notify receives notifications; see Notification.
type Notify func(n Notification)

// handler notifies the key of every notification to the rules in targets.
// With replays set (a sink's own registration, with its resync period), an
// informer resync (an update with an unchanged resourceVersion) is a
// replay; other registrations never see resyncs.
func handler(in *Informers, idx cache.Indexer, targets []Target, replays bool) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initialList bool) {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok || (initialList && in.SkipInitialList) {
				return
			}
			m := event.MetaFrom(metadata(u))
			in.notify(Notification{Key: objectKey(m), Targets: targets, Cache: idx, Object: u, Meta: m, Initial: initialList})
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*unstructured.Unstructured)
			u, ok2 := obj.(*unstructured.Unstructured)
			if !ok1 || !ok2 {
				return
			}
			md, oldMD := metadata(u), metadata(old)
			rv, _ := md["resourceVersion"].(string)
			oldRV, _ := oldMD["resourceVersion"].(string)
			resync := oldRV == rv
			if resync && !replays {
				return
			}
			m := event.MetaFrom(md)
			n := Notification{Key: objectKey(m), Targets: targets, Cache: idx, Object: u, Meta: m, Resync: resync}
			if oldUID, _ := oldMD["uid"].(string); m.UID != oldUID {
				n.Replaced = old
			}
			in.notify(n)
		},
		DeleteFunc: func(obj any) {
			// A tombstone without a usable last state still syncs the key:
			// the cache no longer has it, so the sink's view sends its deletion.
			key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			if err != nil {
				return
			}
			in.notify(Notification{Key: key, Targets: targets, Cache: idx, Gone: filters.AsUnstructured(obj)})
		},
	}
}

// metadata is an object's metadata map (nil if it has none).
func metadata(u *unstructured.Unstructured) map[string]any {
	md, _ := u.Object["metadata"].(map[string]any)
	return md
}

// objectKey is the cache key (cache.MetaNamespaceKeyFunc) of the object
// m names: namespace/name, or name.
func objectKey(m event.Meta) string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// namespaceHandler syncs the objects of a namespace for the rules that
// read namespaces' labels (a namespaceSelector, a route), when the
// namespace appears (objects seen before their namespace enter the view
// now) or its labels change what the rule decides.
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
				if r.NamespaceChanged(before, after) {
					in.syncNamespace(r, ns.GetName())
				}
			}
		},
	}
}

// syncNamespace notifies every key of namespace ns to rule r and all its
// sinks, without a state: the receiver reads each from the cache and
// re-evaluates r against the namespace as it is now.
func (in *Informers) syncNamespace(r *filters.Rule, ns string) {
	targets := []Target{{Rule: r, Sinks: r.Sinks}}
	for _, run := range in.running {
		if !slices.Contains(run.Rules, r) {
			continue
		}
		objs, err := run.inf().GetIndexer().ByIndex(cache.NamespaceIndex, ns)
		if err != nil {
			in.logger.Error("namespace index lookup failed", "rule", r.Name, "namespace", ns, "error", err)
			continue
		}
		for _, o := range objs {
			key, err := cache.MetaNamespaceKeyFunc(o)
			if err != nil {
				continue
			}
			in.notify(Notification{Key: key, Targets: targets, Cache: run.inf().GetIndexer()})
		}
	}
}

// ownerChanged syncs the objects below an owner (or a Kubernetes Event's
// involved object) for the rules that read owners in their where or
// route, when it appears, goes, or its metadata changes what the rule
// decides: the objects it owns, down their chains, and the Events about
// them are evaluated again with the caches as they are now. It runs on
// the owner informer's goroutine, as namespaceHandler does.
func (in *Informers) ownerChanged(before, after metav1.Object) {
	var rules []*filters.Rule
	for _, r := range in.ownerRules {
		if before == nil || after == nil || r.OwnerChanged(before.GetLabels(), after.GetLabels()) ||
			!slices.EqualFunc(before.GetOwnerReferences(), after.GetOwnerReferences(), func(a, b metav1.OwnerReference) bool { return a.UID == b.UID }) {
			rules = append(rules, r)
		}
	}
	if len(rules) == 0 {
		return
	}
	o := after
	if o == nil {
		o = before
	}
	uids := append([]string{string(o.GetUID())}, in.Owners.Below(string(o.GetUID()))...)
	for _, r := range rules {
		in.syncRelated(r, uids)
	}
}

// syncRelated notifies every key of rule r's objects that name one of
// uids as an owner or involved object to r and all its sinks, without a
// state (as syncNamespace does).
func (in *Informers) syncRelated(r *filters.Rule, uids []string) {
	targets := []Target{{Rule: r, Sinks: r.Sinks}}
	for _, run := range in.running {
		if !slices.Contains(run.Rules, r) {
			continue
		}
		idx := run.inf().GetIndexer()
		seen := map[string]bool{}
		for _, uid := range uids {
			objs, err := idx.ByIndex(relatedIndex, uid)
			if err != nil {
				in.logger.Error("owner index lookup failed", "rule", r.Name, "uid", uid, "error", err)
				break
			}
			for _, o := range objs {
				key, err := cache.MetaNamespaceKeyFunc(o)
				if err != nil || seen[key] {
					continue
				}
				seen[key] = true
				in.notify(Notification{Key: key, Targets: targets, Cache: idx})
			}
		}
	}
}

// Package stage is the rules stage, between the informers and the sinks'
// views: it evaluates a rule once per notification, and each sink's view
// of the rule (internal/view) diffs what it is handed.
//
// For a notified key and a rule, Evaluate finds the desired state: the
// object the notification carries (or, for triggers that carry none, the
// informer cache's), whether it is in the rule's view, and what the rule's
// filters see of it (pkg/filters Seen: Secret values as the rule's
// event.SecretPolicy shows them). The result, a Desired, is handed to every
// sink of the rule in turn, on the notifier's goroutine: the views ask it
// whether a transition is sent (the rule's events, changed and event
// filter, judged once per distinct transition) and for the transition's
// event, built once and shared by every sink handed the same transition.
//
// A rule that routes (config route) sends each object to one of its sinks:
// each sink's view is the objects in the rule's view routed to it, so the
// state a sink asks says "in" only to the sink the object is routed to.
// The route is evaluated once per state and namespace labels, whichever
// sink asks first.
//
// A rule that includes owners has the state's owner chain (and a
// Kubernetes Event's involved object) resolved here too, once: the state
// a live change carries may wait, bounded, for an owner not cached yet
// (filters.OwnersWait; the resolver waits only for a young object, within
// a budget) on the notifier's goroutine, before any sink's queue is
// offered anything; a list's, resync's or replay's does not. Every sink's
// verdict, event filter and event share the result.
package stage

import (
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// Lookup reads the desired state of object keys: the informer's cache
// (a cache.Indexer is one).
type Lookup interface {
	GetByKey(key string) (item any, exists bool, err error)
}

// Trigger says why a key is synced.
type Trigger struct {
	// Replay marks the transitions found (kbreplay): "" for live changes,
	// event.ReplayCheckpoint for a reconciliation, event.ReplayResync for
	// a replay, which also re-sends an unchanged object as updated.
	Replay string
	// Object is the state a live add or update notification carries (nil
	// for other triggers: they read the cache).
	Object *unstructured.Unstructured
	// Meta, when the notifier read it, is Object's (event.MetaOf): the
	// stage and the events it builds take it rather than reading Object's
	// maps again. Zero: unknown.
	Meta event.Meta
	// Gone is the last state of a deleted object, from its delete
	// notification (nil otherwise): the data of its deleted event.
	Gone *unstructured.Unstructured
	// Now is when the change was observed; an object that enters the view
	// is stamped with it (event.Entered).
	Now time.Time
	// Initial marks an add from an informer's first list, before every
	// cache synced: it may add or update what a sink holds, never take
	// anything away (an object may look out of the view only because other
	// caches are not complete yet). The reconciliation after the sync
	// decides the rest. It lets the initial view stream to the sinks while
	// it is being listed.
	Initial bool
}

// Desired is a rule's evaluation of one object key for one trigger: what
// every sink's view of the rule is to hold, and the judgement and events
// of the transitions the views find. It is used by one goroutine at a
// time (the notifier's), and kept no longer than the notification.
type Desired struct {
	Rule    *filters.Rule
	Key     string // the object key: namespace/name, or name
	Trigger Trigger

	cache Lookup
	cur   state // the state evaluated last (obj nil: none yet)

	judged [2]judgement // the last transitions judged (Quiet)
	nJudge int
	built  [2]built // the last events built (Event)
	nBuilt int
}

// state is one state of the object and the rule's verdict on it.
type state struct {
	obj, seen *unstructured.Unstructured // seen: what the rule's filters see of obj
	uid, rv   string
	// rel is obj's owners and involved object (nil: the rule does not
	// include owners), resolved once for every sink.
	rel *event.Related
	// in is the verdict obj alone decides (filters ObjectInView); its
	// namespace's labels are asked on each State, under the sink's lock,
	// as the namespace handler's re-evaluation of the namespace's objects
	// asks them: a verdict from labels read before that would undo it.
	in bool
	// route is the sink a routing rule sends obj to, evaluated with its
	// namespace's labels routeNS (routed: evaluated), again if they change.
	route   string
	routeNS labels.Set
	routed  bool
}

type judgement struct {
	obj, old *unstructured.Unstructured
	change   event.Change
	partial  bool
	quiet    bool
}

type built struct {
	t  event.Transition
	ev *event.Event
}

// Evaluate is rule r's evaluation of key for trigger t; c is the informer's
// cache of the key (read by triggers that carry no state). A state the
// trigger carries is evaluated now, once for every sink.
func Evaluate(r *filters.Rule, key string, c Lookup, t Trigger) Desired {
	d := Desired{Rule: r, Key: key, Trigger: t, cache: c}
	switch {
	case t.Object != nil:
		d.evaluate(t.Object, t.Meta)
	case t.Gone != nil:
		r.Event.Learn(t.Gone) // its kind, for events of objects known only from a checkpoint
	}
	return d
}

// State returns the desired state of the key for sink: its object (nil: it
// does not exist, or it is a deletion), the object's uid and
// resourceVersion, and whether it is in sink's view of the rule (the
// rule's view, and for a routing rule routed to sink). A deletion has no
// state; a trigger
// that carries one was evaluated by Evaluate; other triggers read the
// cache on each call (the view calls State holding the sink's lock, so
// that concurrent triggers of one key reach each sink in the cache's
// order) and evaluate each state they find once.
func (d *Desired) State(sink string) (obj *unstructured.Unstructured, uid, rv string, in bool) {
	switch {
	case d.Trigger.Object != nil:
	case d.Trigger.Gone != nil:
		return nil, "", "", false
	default:
		item, ok, err := d.cache.GetByKey(d.Key)
		u, _ := item.(*unstructured.Unstructured)
		if err != nil || !ok || u == nil {
			return nil, "", "", false
		}
		if u != d.cur.obj {
			d.evaluate(u, event.Meta{})
		}
	}
	in = d.cur.in && d.Rule.InSelectedNamespace(d.cur.obj)
	if in && d.Rule.Routes() {
		in = d.route() == sink
	}
	return d.cur.obj, d.cur.uid, d.cur.rv, in
}

// route is the sink the current state is routed to ("": none, its
// namespace not known yet). Its namespace's labels are read on each call,
// as InSelectedNamespace reads them (see state.in): the route is evaluated
// again only when they changed.
func (d *Desired) route() string {
	ns, known := d.Rule.RouteNamespaceLabels(d.cur.obj)
	if !known {
		return ""
	}
	if !d.cur.routed || !maps.Equal(ns, d.cur.routeNS) {
		d.cur.route, d.cur.routeNS, d.cur.routed = d.Rule.Route(d.cur.seen, ns, d.cur.rel), ns, true
	}
	return d.cur.route
}

// evaluate makes obj the current state; m is its Meta when known.
func (d *Desired) evaluate(obj *unstructured.Unstructured, m event.Meta) {
	r := d.Rule
	if m == (event.Meta{}) {
		md, _ := obj.Object["metadata"].(map[string]any)
		m.UID, _ = md["uid"].(string)
		m.ResourceVersion, _ = md["resourceVersion"].(string)
	}
	// An object of the resource teaches the rule its kind, which the
	// events of objects rebuilt from a checkpoint (metadata only) carry.
	r.Event.Learn(obj)
	seen := r.Seen(obj)
	// A state a live change carries may name an owner whose own
	// notification is not in yet: it is waited for (bounded), once. A
	// list's, a resync's or a replay's state is not: the owners' caches
	// synced before the rules' informers started.
	how := filters.Reread
	if d.Trigger.Object == obj {
		how = filters.Notified
		if d.Trigger.Replay == "" && !d.Trigger.Initial {
			how = filters.Live
		}
	}
	rel := r.Related(obj, how)
	d.cur = state{obj: obj, seen: seen, uid: m.UID, rv: m.ResourceVersion, rel: rel, in: r.ObjectInView(obj, seen, rel)}
}

// Quiet reports whether the rule does not send transition tr (it is still
// handed to the sink, quiet, so that what is recorded is the whole view):
// its events leave out tr's change, its changed paths did not change, or
// its event filter (a where reading oldObject or type) drops it. partial
// says tr's object is only the metadata a checkpoint kept, which an event
// filter cannot judge: such a transition passes it (sent rather than
// lost). Sinks of the rule handed the same transition share one judgement.
func (d *Desired) Quiet(tr event.Transition, partial bool) bool {
	r := d.Rule
	if !r.Delivers(tr.Change) {
		return true
	}
	checksChanged := tr.Change == event.Updated && tr.Old != nil
	if !checksChanged && (partial || !r.HasEventFilter()) {
		return false
	}
	for i := range min(d.nJudge, len(d.judged)) {
		if j := &d.judged[i]; j.obj == tr.Object && j.old == tr.Old && j.change == tr.Change && j.partial == partial {
			return j.quiet
		}
	}
	quiet := (checksChanged && !r.Changed(tr.Old, tr.Object)) ||
		(!partial && r.HasEventFilter() && !r.PassesSeen(d.seen(tr.Object), r.Seen(tr.Old), tr.Change, d.related(tr.Object)))
	d.judged[d.nJudge%len(d.judged)] = judgement{obj: tr.Object, old: tr.Old, change: tr.Change, partial: partial, quiet: quiet}
	d.nJudge++
	return quiet
}

// seen is what the rule's filters see of obj, reusing the current state's.
func (d *Desired) seen(obj *unstructured.Unstructured) *unstructured.Unstructured {
	if obj != nil && obj == d.cur.obj {
		return d.cur.seen
	}
	return d.Rule.Seen(obj)
}

// related is obj's owners for the rule, reusing the current state's (a
// state other than the one notified, such as a deletion's last, is read
// from the caches as they are; one a checkpoint kept has none known).
func (d *Desired) related(obj *unstructured.Unstructured) *event.Related {
	if obj != nil && obj == d.cur.obj {
		return d.cur.rel
	}
	if obj != nil && d.Rule.IncludesOwners() && obj.GetKind() == "" {
		// Rebuilt from a checkpoint (a deletion found at a start): it kept
		// no ownerReferences, so the owners are not known, not none.
		return &event.Related{Incomplete: true}
	}
	return d.Rule.Related(obj, filters.Reread)
}

// Event returns the event of transition tr: built once, and shared by
// every sink of the rule handed the same transition of this trigger (an
// event is immutable).
func (d *Desired) Event(tr event.Transition) *event.Event {
	for i := range min(d.nBuilt, len(d.built)) {
		if b := &d.built[i]; b.t == tr {
			return b.ev
		}
	}
	t := tr
	t.Related = d.related(tr.Object)
	ev := event.Build(d.Rule.Event, t)
	d.built[d.nBuilt%len(d.built)] = built{t: tr, ev: ev}
	d.nBuilt++
	return ev
}

package stage

import (
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

func compile(t testing.TB, rule string, nsLabels filters.NamespaceLabels) *filters.Rule {
	t.Helper()
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}, {name: t, file: {path: y}}, {name: u, file: {path: z}}]\n" +
		"rules:\n  - name: r\n    sinks: [s, t, u]\n" + rule
	return testenv.CompileRules(t, doc, components.SinkRegistry(), nsLabels)[0]
}

func cm(name, rv string, lbls map[string]string, data map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
	if data != nil {
		u.Object["data"] = data
	}
	u.SetNamespace("a")
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion(rv)
	u.SetLabels(lbls)
	return u
}

// cacheOf is a cache of several keys.
type cacheOf map[string]*unstructured.Unstructured

func (c cacheOf) GetByKey(key string) (any, bool, error) {
	if o, ok := c[key]; ok {
		return o, true, nil
	}
	return nil, false, nil
}

// A notification is evaluated once, whatever the number of sinks asking
// its state: an object in the view, one out of it and one whose where
// fails (each failure is one evaluation: counted once) give every sink
// the same answer; a trigger without a state reads the cache at each ask
// and evaluates a state it has not evaluated yet.
func TestOneEvaluationPerNotification(t *testing.T) {
	ns := labels.Set{"env": "prod"}
	r := compile(t, "    resource: v1/configmaps\n    namespaceSelector: env=prod\n    labelSelector: app=web\n    where: \"object.data.size == 'big'\"\n",
		func(string) (labels.Set, bool) { return ns, true })
	in := cm("x", "1", map[string]string{"app": "web"}, map[string]any{"size": "big"})
	out := cm("y", "1", map[string]string{"app": "web"}, map[string]any{"size": "small"})
	failing := cm("z", "1", map[string]string{"app": "web"}, nil) // no data: the where fails
	for i, o := range []struct {
		obj  *unstructured.Unstructured
		want bool
	}{{in, true}, {out, false}, {failing, false}} {
		d := Evaluate(r, "a/"+o.obj.GetName(), nil, Trigger{Object: o.obj})
		for _, sink := range []string{"s", "t", "u"} {
			if got, uid, rv, inView := d.State(sink); got != o.obj || uid != "uid-"+o.obj.GetName() || rv != "1" || inView != o.want {
				t.Errorf("%s, sink %s: state %v %s %s %v; want the object, in the view: %v", o.obj.GetName(), sink, got != nil, uid, rv, inView, o.want)
			}
		}
		if i == 2 && r.EvalErrors() != 1 {
			t.Errorf("%d evaluation errors; want 1: the sinks share one evaluation", r.EvalErrors())
		}
	}

	cache := cacheOf{"a/x": in}
	d := Evaluate(r, "a/x", cache, Trigger{Replay: event.ReplayCheckpoint})
	if _, _, _, inView := d.State("s"); !inView {
		t.Error("read from the cache: not in the view")
	}
	cache["a/x"] = failing // the cache moved on between two sinks' syncs
	if got, _, _, inView := d.State("s"); got != failing || inView || r.EvalErrors() != 2 {
		t.Errorf("after the cache changed: state %v in view %v, %d evaluation errors; want the new state, evaluated", got != nil, inView, r.EvalErrors())
	}
	d.State("s")
	if r.EvalErrors() != 2 {
		t.Errorf("the same state evaluated again: %d evaluation errors", r.EvalErrors())
	}
	delete(cache, "a/x")
	if got, _, _, inView := d.State("s"); got != nil || inView {
		t.Error("deleted from the cache: still a state")
	}

	ns = labels.Set{"env": "dev"} // the namespace leaves the selection: a new notification sees it
	if d := Evaluate(r, "a/x", nil, Trigger{Object: in}); func() bool { _, _, _, v := d.State("s"); return v }() {
		t.Error("namespace no longer selected: in the view")
	}
	if d := Evaluate(r, "a/x", nil, Trigger{Gone: in}); func() bool { o, _, _, v := d.State("s"); return o != nil || v }() {
		t.Error("a deletion has a state")
	}
}

// Sinks handed the same transition share its judgement and its event;
// another transition (another old state: a sink that missed an update)
// gets its own.
func TestSinksShareEvents(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    changed: [data]\n    where: \"type != 'updated' || oldObject.data.n != '0'\"\n", nil)
	v0, v1 := cm("x", "1", nil, map[string]any{"n": "0"}), cm("x", "2", nil, map[string]any{"n": "1"})
	v2 := cm("x", "3", nil, map[string]any{"n": "2"})
	now := time.Unix(1700000000, 0)
	d := Evaluate(r, "a/x", nil, Trigger{Object: v2, Now: now})
	tr := func(old *unstructured.Unstructured) event.Transition {
		return event.Transition{Change: event.Updated, Object: v2, Old: old, Time: now, Entered: 1, Subject: "a/x"}
	}
	a, b := tr(v1), tr(v1)
	if d.Quiet(a, false) || d.Quiet(b, false) {
		t.Error("an update of data from n=1 is quiet")
	}
	if ea, eb := d.Event(a), d.Event(b); ea != eb {
		t.Error("two sinks handed the same transition got two events")
	}
	c := tr(v0) // a sink that was handed v0: the where drops it
	if !d.Quiet(c, false) {
		t.Error("an update from n=0 passes the event filter")
	}
	c.Quiet = true
	if ec := d.Event(c); ec == d.Event(a) || !ec.Quiet || ec.OldObject() != v0 {
		t.Error("another transition shares the event of the first")
	}
	same := tr(cm("x", "2", nil, map[string]any{"n": "2"}))
	same.Object = cm("x", "3", nil, map[string]any{"n": "2"})
	if !d.Quiet(same, false) {
		t.Error("an update that changes no changed path is sent")
	}
}

// What the filters see of a Secret is redacted (the rule's
// event.SecretPolicy), once per notification; with allowSecretData the
// values.
func TestSecretsSeenRedacted(t *testing.T) {
	secret := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"password": "c2VjcmV0"}}}
		u.SetNamespace("a")
		u.SetName("s")
		u.SetUID("uid-s")
		u.SetResourceVersion("1")
		return u
	}
	for _, tc := range []struct {
		allow string
		want  bool
	}{{"", true}, {"    allowSecretData: true\n", false}} {
		r := compile(t, "    resource: v1/secrets\n    where: \"object.data.password == '<redacted>'\"\n"+tc.allow, nil)
		d := Evaluate(r, "a/s", nil, Trigger{Object: secret()})
		if _, _, _, in := d.State("s"); in != tc.want {
			t.Errorf("%qwhere sees <redacted>: %v, want %v", tc.allow, in, tc.want)
		}
	}
}

// The namespace's labels are asked when a sink asks the state, not when
// the notification was evaluated: the namespace handler, which re-syncs a
// namespace's objects after its labels change, must not be undone by a
// verdict from the labels before (an object of a namespace that left the
// selector re-added, or one that entered removed).
func TestNamespaceLabelsAreAskedAtEachState(t *testing.T) {
	var mu sync.Mutex
	ns := labels.Set{"env": "prod"}
	r := compile(t, "    resource: v1/configmaps\n    namespaceSelector: env=prod\n",
		func(string) (labels.Set, bool) { mu.Lock(); defer mu.Unlock(); return ns, true })
	obj := cm("x", "2", nil, nil)
	d := Evaluate(r, "a/x", cacheOf{}, Trigger{Object: obj, Now: time.Now()})
	if _, _, _, in := d.State("s"); !in {
		t.Fatal("in a selected namespace, out of the view")
	}
	mu.Lock()
	ns = labels.Set{"env": "dev"} // the namespace leaves the selector meanwhile
	mu.Unlock()
	if _, _, _, in := d.State("s"); in {
		t.Error("a sink asking after the namespace left the selector was told the object is in the view")
	}
	mu.Lock()
	ns = labels.Set{"env": "prod"}
	mu.Unlock()
	if _, _, _, in := d.State("s"); !in {
		t.Error("back in the selector, still out of the view")
	}
}

// A routing rule's state is in the view of the sink it is routed to only:
// a name that is not one of the rule's sinks, a missing label and a
// result that is not a string go to the default, counted by reason; the
// route is evaluated once per state whatever the number of sinks asking,
// and again when the namespace's labels changed between two asks; an
// object of a namespace not known yet is in no sink's view.
func TestRouteChoosesOneSink(t *testing.T) {
	var mu sync.Mutex
	nsLabels := map[string]labels.Set{"a": {"team": "t"}}
	r := compile(t, "    resource: v1/configmaps\n    route: {sink: \"has(object.data) ? object.data.to : namespaceLabels.team\", default: u}\n",
		func(ns string) (labels.Set, bool) { mu.Lock(); defer mu.Unlock(); s, ok := nsLabels[ns]; return s, ok })
	routedTo := func(d *Desired) (sinks []string) {
		for _, s := range []string{"s", "t", "u"} {
			if _, _, _, in := d.State(s); in {
				sinks = append(sinks, s)
			}
		}
		return sinks
	}
	for _, tc := range []struct {
		name string
		data map[string]any
		want string
		why  filters.RouteReason
	}{
		{name: "by-label"}, // namespaceLabels.team: t
		{name: "by-object", data: map[string]any{"to": "s"}, want: "s"}, // object.data.to
		{name: "undeclared", data: map[string]any{"to": "https://x"}, want: "u", why: filters.RouteUndeclared},
		{name: "no-string", data: map[string]any{"to": int64(3)}, want: "u", why: filters.RouteFailed},
		{name: "missing-key", data: map[string]any{}, want: "u", why: filters.RouteFailed},
	} {
		if tc.want == "" {
			tc.want = "t"
		}
		before := r.RouteDefaulted(tc.why)
		d := Evaluate(r, "a/"+tc.name, nil, Trigger{Object: cm(tc.name, "1", nil, tc.data)})
		if got := routedTo(&d); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: in the views of %v; want %s only", tc.name, got, tc.want)
		}
		defaulted := r.RouteDefaulted(tc.why) - before
		if want := map[bool]uint64{true: 1}[tc.want == "u"]; defaulted != want {
			t.Errorf("%s: %d counted as %s; want %d (one evaluation for three sinks)", tc.name, defaulted, tc.why, want)
		}
	}

	d := Evaluate(r, "a/x", nil, Trigger{Object: cm("x", "1", nil, nil)})
	if got := routedTo(&d); len(got) != 1 || got[0] != "t" {
		t.Fatalf("routed to %v; want t", got)
	}
	mu.Lock()
	nsLabels["a"] = labels.Set{"team": "s"} // relabeled between two sinks' syncs
	mu.Unlock()
	if got := routedTo(&d); len(got) != 1 || got[0] != "s" {
		t.Errorf("after the namespace was relabeled: routed to %v; want s", got)
	}
	mu.Lock()
	delete(nsLabels, "a") // a namespace not known (yet): in no sink's view, as under a namespaceSelector
	mu.Unlock()
	if got := routedTo(&d); len(got) != 0 {
		t.Errorf("namespace unknown: routed to %v; want none", got)
	}
}

// include: [owners]: the chain is resolved once per notification, waiting
// for an owner not cached yet, and shared by every sink: the view's
// verdict, the event filter and the event (whose data and templates carry
// it); a deletion's last state is read from the caches without waiting.
func TestOwnersResolvedOncePerNotification(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    include: [owners]\n    where: \"type != 'deleted' && owners.exists(o, o.kind == 'Deployment')\"\n", nil)
	var calls []bool
	incomplete := false
	r.SetRelations(func(_ schema.GroupVersionResource, _ *unstructured.Unstructured, deadline time.Time) *event.Related {
		calls = append(calls, !deadline.IsZero())
		return &event.Related{Owners: []event.Owner{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d"}}, Incomplete: incomplete}
	})
	obj := cm("x", "1", nil, nil)
	d := Evaluate(r, "a/x", nil, Trigger{Object: obj, Now: time.Now()})
	tr := event.Transition{Change: event.Added, Object: obj, Time: time.Now()}
	for range 3 {
		if _, _, _, in := d.State("s"); !in || d.Quiet(tr, false) {
			t.Fatal("not in the view, or quiet")
		}
		if ev := d.Event(tr); ev.Related() == nil || len(ev.Related().Owners) != 1 {
			t.Fatalf("event without its owners: %+v", ev.Related())
		}
	}
	if len(calls) != 1 || !calls[0] {
		t.Errorf("resolutions %v; want one, waiting", calls)
	}
	// The state of a list (a start, a reload), a resync or a replay is not
	// waited for: the owners' caches synced before the rules' informers
	// (Events about Pods deleted before the start would each wait); what
	// is missing is counted, as after a wait.
	incomplete = true
	for _, tg := range []Trigger{{Object: obj, Initial: true, Replay: event.ReplayCheckpoint}, {Object: obj, Replay: event.ReplayResync}, {Object: obj}} {
		calls = nil
		before := r.OwnersIncomplete()
		tg.Now = time.Now()
		d := Evaluate(r, "a/x", nil, tg)
		d.State("s")
		if live := tg.Replay == ""; len(calls) != 1 || calls[0] != live || r.OwnersIncomplete() != before+1 {
			t.Errorf("%+v: resolutions %v (want one, waiting %v), %d counted incomplete", tg, calls, live, r.OwnersIncomplete()-before)
		}
	}
	incomplete = false
	calls = nil
	gone := Evaluate(r, "a/x", nil, Trigger{Gone: obj, Now: time.Now()})
	gone.Event(event.Transition{Change: event.Deleted, Object: obj, Time: time.Now()})
	if len(calls) != 1 || calls[0] {
		t.Errorf("deletion: resolutions %v; want one, not waiting", calls)
	}
	// A deletion found at a start: the checkpoint kept metadata only (no
	// kind, no ownerReferences): its owners are not known, not none.
	kept := &unstructured.Unstructured{Object: map[string]any{}}
	kept.SetNamespace("a")
	kept.SetName("x")
	kept.SetUID("uid-x")
	calls = nil
	found := Evaluate(r, "a/x", cacheOf{}, Trigger{Replay: event.ReplayCheckpoint, Now: time.Now()})
	ev := found.Event(event.Transition{Change: event.Deleted, Object: kept, Time: time.Now()})
	if rel := ev.Related(); rel == nil || !rel.Incomplete || len(calls) != 0 {
		t.Errorf("a checkpoint's deletion: owners %+v, %d resolutions", rel, len(calls))
	}
}

// What an owner's change re-syncs (a trigger without a state, the object
// unchanged in the cache) is evaluated with the owners as the caches hold
// them now, not waited for: a route by the Deployment's team moves the
// object to the new team's sink, and a where on owners lets it in or out.
func TestOwnerChangeReevaluatesUnchangedObject(t *testing.T) {
	team := "s"
	var waited []bool
	relations := func(_ schema.GroupVersionResource, _ *unstructured.Unstructured, deadline time.Time) *event.Related {
		waited = append(waited, !deadline.IsZero())
		return &event.Related{Owners: []event.Owner{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Labels: map[string]string{"team": team}}}}
	}
	routed := compile(t, "    resource: v1/configmaps\n    include: [owners]\n    route: {sink: \"owners[size(owners) - 1].labels.team\", default: u}\n", nil)
	where := compile(t, "    resource: v1/configmaps\n    include: [owners]\n    where: \"owners.exists(o, o.labels.team == 's')\"\n", nil)
	for _, r := range []*filters.Rule{routed, where} {
		r.SetRelations(relations)
		if !r.ReadsOwners() {
			t.Fatalf("rule %s: ReadsOwners false", r.Name)
		}
	}
	obj := cm("x", "1", nil, nil)
	c := cacheOf{"a/x": obj}
	in := func(r *filters.Rule) (sinks []string) {
		d := Evaluate(r, "a/x", c, Trigger{Now: time.Now()}) // as syncRelated notifies: read from the cache
		for _, s := range []string{"s", "t", "u"} {
			if _, _, _, ok := d.State(s); ok {
				sinks = append(sinks, s)
			}
		}
		return sinks
	}
	if got := in(routed); !slices.Equal(got, []string{"s"}) {
		t.Fatalf("routed to %v; want s", got)
	}
	if got := in(where); len(got) != 3 {
		t.Fatalf("where: in %v; want every sink", got)
	}
	team = "t" // the Deployment relabelled; the object unchanged
	if got := in(routed); !slices.Equal(got, []string{"t"}) {
		t.Errorf("after the owner's relabelling: routed to %v; want t", got)
	}
	if got := in(where); len(got) != 0 {
		t.Errorf("after the owner's relabelling: where in %v; want none", got)
	}
	if slices.Contains(waited, true) {
		t.Errorf("a re-sync waited for owners: %v", waited)
	}
	if shows := compile(t, "    resource: v1/configmaps\n    include: [owners]\n    where: \"type != 'deleted' && owners.size() > 0\"\n", nil); shows.ReadsOwners() {
		t.Error("ReadsOwners of a where that is an event filter (reads type): true; it decides no view")
	}
}

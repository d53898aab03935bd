package filters

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

func compile(t testing.TB, ruleYAML string, nsLabels NamespaceLabels) *Rule {
	t.Helper()
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}]\nrules:\n  - name: r\n    sinks: [s]\n" + ruleYAML
	cfg, _, err := config.Parse("t.yaml", []byte(doc), components.SinkRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := Compile(cfg, 0, nsLabels, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func cm(ns, name, rv string, lbls map[string]string, data map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion(rv)
	u.SetLabels(lbls)
	if data != nil {
		u.Object["data"] = data
	}
	return u
}

// Tombstones (deletions missed while a watch was down) are unwrapped to
// their last known state; anything else that is not an object is nil.
func TestAsUnstructured(t *testing.T) {
	obj := cm("a", "x", "1", nil, nil)
	if got := AsUnstructured(obj); got != obj {
		t.Errorf("object: %v", got)
	}
	if got := AsUnstructured(cache.DeletedFinalStateUnknown{Key: "a/x", Obj: obj}); got != obj {
		t.Errorf("tombstone of an object: %v", got)
	}
	if got := AsUnstructured(cache.DeletedFinalStateUnknown{Key: "a/x", Obj: "junk"}); got != nil {
		t.Errorf("tombstone of something else: %v", got)
	}
	if got := AsUnstructured("junk"); got != nil {
		t.Errorf("not an object: %v", got)
	}
}

func TestFilterKinds(t *testing.T) {
	nsLabels := func(ns string) (labels.Set, bool) {
		switch ns {
		case "prod":
			return labels.Set{"env": "prod"}, true
		case "dev":
			return labels.Set{"env": "dev"}, true
		}
		return nil, false
	}
	owned := cm("a", "o", "1", nil, nil)
	owned.Object["metadata"].(map[string]any)["ownerReferences"] = []any{map[string]any{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs1", "uid": "u"}}
	annotated := cm("a", "n", "1", nil, nil)
	annotated.SetAnnotations(map[string]string{"example.com/owner": "team-a"})
	for _, tc := range []struct {
		rule    string
		in, out []*unstructured.Unstructured
	}{
		{"namespaces: [a, b]", []*unstructured.Unstructured{cm("a", "x", "1", nil, nil), cm("b", "x", "1", nil, nil)}, []*unstructured.Unstructured{cm("c", "x", "1", nil, nil)}},
		{"namespaceSelector: env=prod", []*unstructured.Unstructured{cm("prod", "x", "1", nil, nil)}, []*unstructured.Unstructured{cm("dev", "x", "1", nil, nil), cm("unknown", "x", "1", nil, nil)}},
		{"labelSelector: 'team in (pay, ops),!legacy'", []*unstructured.Unstructured{cm("a", "x", "1", map[string]string{"team": "ops"}, nil)}, []*unstructured.Unstructured{cm("a", "x", "1", map[string]string{"team": "ops", "legacy": ""}, nil), cm("a", "y", "1", nil, nil)}},
		{"fieldSelector: metadata.name=x,metadata.namespace!=b", []*unstructured.Unstructured{cm("a", "x", "1", nil, nil)}, []*unstructured.Unstructured{cm("b", "x", "1", nil, nil), cm("a", "y", "1", nil, nil)}},
		{"fieldSelector: data.mode=on", []*unstructured.Unstructured{cm("a", "x", "1", nil, map[string]any{"mode": "on"})}, []*unstructured.Unstructured{cm("a", "x", "1", nil, map[string]any{"mode": "off"}), cm("a", "y", "1", nil, nil)}},
		{"index: {namespace: [a]}", []*unstructured.Unstructured{cm("a", "x", "1", nil, nil)}, []*unstructured.Unstructured{cm("b", "x", "1", nil, nil)}},
		{`index: {"label:team": [pay, ops], "label:tier": [front]}`, []*unstructured.Unstructured{cm("a", "x", "1", map[string]string{"team": "pay", "tier": "front"}, nil)}, []*unstructured.Unstructured{cm("a", "x", "1", map[string]string{"team": "pay"}, nil), cm("a", "x", "1", map[string]string{"team": "dev", "tier": "front"}, nil)}},
		{`index: {"annotation:example.com/owner": [team-a]}`, []*unstructured.Unstructured{annotated}, []*unstructured.Unstructured{cm("a", "x", "1", nil, nil)}},
		{`index: {"owner:ReplicaSet": [rs1]}`, []*unstructured.Unstructured{owned}, []*unstructured.Unstructured{cm("a", "x", "1", nil, nil)}},
		{`where: "object.metadata.name.startsWith('x') && object.?data.?n.orValue('0') != '0'"`, []*unstructured.Unstructured{cm("a", "x1", "1", nil, map[string]any{"n": "2"})}, []*unstructured.Unstructured{cm("a", "x1", "1", nil, nil), cm("a", "y", "1", nil, map[string]any{"n": "2"})}},
	} {
		r := compile(t, "    resource: v1/configmaps\n    "+tc.rule+"\n", nsLabels)
		for _, o := range tc.in {
			if !r.InView(o) {
				t.Errorf("%s: %s/%s excluded, want included", tc.rule, o.GetNamespace(), o.GetName())
			}
		}
		for _, o := range tc.out {
			if r.InView(o) {
				t.Errorf("%s: %s/%s included, want excluded", tc.rule, o.GetNamespace(), o.GetName())
			}
		}
	}
}

func TestEventsAndChanged(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    events: [updated]\n    changed: [data.watch, 'metadata.annotations[\"a.b/c\"]']\n", nil)
	base := cm("a", "x", "1", nil, map[string]any{"watch": "1", "other": "1"})
	if r.Delivers(event.Added) || r.Delivers(event.Deleted) {
		t.Error("added/deleted delivered though events: [updated]")
	}
	if !r.Delivers(event.Updated) {
		t.Error("updated not delivered though events: [updated]")
	}
	if !r.InView(base) {
		t.Error("events and changed narrowed the view")
	}
	if r.Changed(base, cm("a", "x", "2", nil, map[string]any{"watch": "1", "other": "2"})) {
		t.Error("update of an unlisted path delivered")
	}
	if !r.Changed(base, cm("a", "x", "2", nil, map[string]any{"watch": "2", "other": "1"})) {
		t.Error("update of data.watch not delivered")
	}
	if !r.Changed(base, cm("a", "x", "2", nil, map[string]any{"other": "1"})) {
		t.Error("removal of data.watch not delivered")
	}
	annotated := cm("a", "x", "2", nil, map[string]any{"watch": "1", "other": "1"})
	annotated.SetAnnotations(map[string]string{"a.b/c": "v"})
	if !r.Changed(base, annotated) {
		t.Error("update of a bracketed annotation path not delivered")
	}
	if !r.Changed(annotated, cm("a", "x", "3", nil, map[string]any{"watch": "1", "other": "1"})) {
		t.Error("removal of a bracketed annotation not delivered")
	}

	all := compile(t, "    resource: v1/configmaps\n", nil)
	if !all.Changed(base, cm("a", "x", "2", nil, map[string]any{"watch": "1", "other": "1"})) {
		t.Error("without changed paths, an update is not delivered")
	}
	for _, typ := range []event.Change{event.Added, event.Updated, event.Deleted} {
		if !all.Delivers(typ) {
			t.Errorf("without events, %s is not delivered", typ)
		}
	}
}

// A where expression that reads oldObject or type filters events; it does
// not define a view, so it causes no enter/leave transitions.
func TestWhereAsEventFilter(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    where: \"type != 'updated' || object.data.n != oldObject.data.n\"\n", nil)
	a := cm("a", "x", "1", nil, map[string]any{"n": "1"})
	b := cm("a", "x", "2", nil, map[string]any{"n": "1"})
	c := cm("a", "x", "3", nil, map[string]any{"n": "2"})
	for _, o := range []*unstructured.Unstructured{a, b, c} {
		if !r.InView(o) {
			t.Errorf("%s: out of the view, want in (where is an event filter)", o.GetResourceVersion())
		}
	}
	if !r.PassesEventFilter(a, nil, event.Added) {
		t.Error("add filtered out")
	}
	if r.PassesEventFilter(b, a, event.Updated) {
		t.Error("update with equal n passed")
	}
	if !r.PassesEventFilter(c, b, event.Updated) {
		t.Error("update with new n filtered out")
	}
	if !r.PassesEventFilter(c, nil, event.Deleted) {
		t.Error("delete filtered out")
	}

	// A where that reads only type is an event filter too: it never takes
	// an object out of the view.
	del := compile(t, "    resource: v1/configmaps\n    where: \"type == 'deleted'\"\n", nil)
	if !del.InView(a) {
		t.Error("type-only where: out of the view, want in")
	}
	if del.PassesEventFilter(a, nil, event.Added) || !del.PassesEventFilter(a, nil, event.Deleted) {
		t.Error("type-only where: wrong transitions pass")
	}

	// A where that reads only object is part of the view, not an event filter.
	view := compile(t, "    resource: v1/configmaps\n    where: \"object.data.n == '1'\"\n", nil)
	if !view.InView(a) || view.InView(c) {
		t.Error("object-only where: wrong view")
	}
	if !view.PassesEventFilter(c, a, event.Updated) || !view.PassesEventFilter(c, nil, event.Added) {
		t.Error("object-only where filtered transitions: it is a view predicate")
	}
}

// A where expression failing at run time drops the event and is counted.
func TestWhereRuntimeErrorIsCounted(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    where: \"object.data.n == '1'\"\n", nil)
	if r.InView(cm("a", "x", "1", nil, nil)) {
		t.Error("delivered though where failed (no data)")
	}
	if r.EvalErrors() != 1 {
		t.Errorf("EvalErrors = %d, want 1", r.EvalErrors())
	}
	if !r.InView(cm("a", "x", "1", nil, map[string]any{"n": "1"})) {
		t.Error("matching object not delivered")
	}
	if r.EvalErrors() != 1 {
		t.Errorf("EvalErrors = %d after a success, want 1", r.EvalErrors())
	}

	f := compile(t, "    resource: v1/configmaps\n    where: \"type == 'updated' && object.data.n != oldObject.data.n\"\n", nil)
	if f.PassesEventFilter(cm("a", "x", "2", nil, map[string]any{"n": "1"}), cm("a", "x", "1", nil, nil), event.Updated) {
		t.Error("event filter passed though where failed (no old data)")
	}
	if f.EvalErrors() != 1 {
		t.Errorf("event filter: EvalErrors = %d, want 1", f.EvalErrors())
	}
}

// An object leaves the view when its namespace stops matching the
// namespaceSelector; one outside the rest of the view was never in it.
func TestDepartedWithNamespace(t *testing.T) {
	nsSet := labels.Set{"env": "prod"}
	r := compile(t, "    resource: v1/configmaps\n    namespaceSelector: env=prod\n    labelSelector: keep=yes\n", func(ns string) (labels.Set, bool) {
		if ns != "a" {
			return nil, false
		}
		return nsSet, true
	})
	if !r.ReadsNamespaceLabels() {
		t.Error("ReadsNamespaceLabels() = false")
	}
	x := cm("a", "x", "1", map[string]string{"keep": "yes"}, nil)
	y := cm("a", "y", "1", nil, nil)
	if !r.MatchesNamespace(nsSet) || !r.InView(x) {
		t.Error("in a matching namespace: out of the view")
	}
	if r.InView(y) {
		t.Error("outside the label selector: in the view")
	}
	if r.InView(cm("b", "x", "1", map[string]string{"keep": "yes"}, nil)) {
		t.Error("in an unknown namespace: in the view")
	}
	dev := labels.Set{"env": "dev"}
	if r.MatchesNamespace(dev) {
		t.Error("MatchesNamespace(env=dev) = true")
	}
	nsSet = dev // the namespace's labels change: it stops matching
	if r.InView(x) {
		t.Error("departed: still in the view")
	}
	if r.InView(y) {
		t.Error("departed outside the label selector: in the view")
	}
	if !compile(t, "    resource: v1/configmaps\n", nil).MatchesNamespace(dev) {
		t.Error("without a namespaceSelector, a namespace does not match")
	}
}

func BenchmarkIndexAndCELFilter(b *testing.B) {
	r := compile(b, "    resource: v1/configmaps\n    index: {\"label:team\": [pay, ops]}\n    where: \"object.?data.?size.orValue('') == 'big'\"\n", nil)
	obj := cm("a", "x", "1", map[string]string{"team": "pay"}, map[string]any{"size": "big"})
	b.ReportAllocs()
	for b.Loop() {
		if !r.InView(obj) {
			b.Fatal("not in view")
		}
	}
}

func BenchmarkLabelSelectorFilter(b *testing.B) {
	r := compile(b, "    resource: v1/configmaps\n    labelSelector: 'team in (pay, ops)'\n", nil)
	obj := cm("a", "x", "1", map[string]string{"team": "pay"}, nil)
	b.ReportAllocs()
	for b.Loop() {
		if !r.InView(obj) {
			b.Fatal("not in view")
		}
	}
}

// BenchmarkRuleUpdate is the rule's share of an update: both states'
// membership and the changed paths.
func BenchmarkRuleUpdate(b *testing.B) {
	r := compile(b, "    resource: v1/configmaps\n    labelSelector: team=pay\n    changed: [data]\n", nil)
	old := cm("a", "x", "1", map[string]string{"team": "pay"}, map[string]any{"k": strings.Repeat("v", 100)})
	obj := cm("a", "x", "2", map[string]string{"team": "pay"}, map[string]any{"k": strings.Repeat("w", 100)})
	b.ReportAllocs()
	for b.Loop() {
		if !r.InView(old) || !r.InView(obj) || !r.Changed(old, obj) {
			b.Fatal("no event")
		}
	}
}

// Only rules that read nothing but apiVersion, kind and metadata let the
// informer cache metadata only.
func TestMetadataOnly(t *testing.T) {
	for _, tc := range []struct {
		rule string
		want bool
	}{
		{"    include: [metadata]\n", true},
		{"    include: [object]\n", false},
		{"    include: [metadata]\n    where: \"object.metadata.labels.team == 'pay' && has(oldObject.metadata.annotations)\"\n", true},
		{"    include: [metadata]\n    where: \"object.kind == 'ConfigMap'\"\n", true},
		{"    include: [metadata]\n    where: \"object.data.size == 'big'\"\n", false},
		{"    include: [metadata]\n    where: \"object.?data.orValue({}).size() > 0\"\n", false},
		{"    include: [metadata]\n    where: \"size(dyn(object)) > 3\"\n", false},
		{"    include: [metadata]\n    changed: [metadata.labels]\n", true},
		{"    include: [metadata]\n    changed: [data]\n", false},
		{"    include: [metadata]\n    fieldSelector: metadata.name=a\n", true},
		{"    include: [metadata]\n    fieldSelector: status.phase=Up\n", false},
		{"    include: [metadata]\n    index: {\"label:team\": [pay]}\n", true},
		// a route reading the body needs it cached, or every object goes to the default
		{"    include: [metadata]\n    route: {sink: \"object.data.team\", default: s}\n", false},
		{"    include: [metadata]\n    route: {sink: \"object.metadata.labels.team\", default: s}\n", true},
	} {
		r := compile(t, "    resource: v1/configmaps\n"+tc.rule, nil)
		if got := r.MetadataOnly(); got != tc.want {
			t.Errorf("%sMetadataOnly() = %v, want %v", tc.rule, got, tc.want)
		}
	}
	// A Kubernetes Event's involved object (and when it was last reported)
	// is in its body: owners read it.
	for _, res := range []string{"v1/events", "events.k8s.io/v1/events"} {
		if compile(t, "    resource: "+res+"\n    include: [metadata, owners]\n", nil).MetadataOnly() {
			t.Errorf("%s with include: [metadata, owners]: MetadataOnly() = true; involved would be lost", res)
		}
	}
	if !compile(t, "    resource: v1/pods\n    include: [metadata, owners]\n", nil).MetadataOnly() {
		t.Error("v1/pods with include: [metadata, owners]: MetadataOnly() = false; ownerReferences are metadata")
	}
}

// A core/v1 Event's field selector source is what the apiserver computes
// (source.component, else reportingComponent), as the apiserver filters
// the list: checked on the object too, it must not drop what the apiserver
// sent. Another resource's source is its field.
func TestEventSourceFieldSelector(t *testing.T) {
	ev := func(component, reporting string) *unstructured.Unstructured {
		u := cm("a", "e", "1", nil, nil)
		u.SetKind("Event")
		if component != "" {
			u.Object["source"] = map[string]any{"component": component}
		}
		if reporting != "" {
			u.Object["reportingComponent"] = reporting
		}
		return u
	}
	r := compile(t, "    resource: v1/events\n    fieldSelector: source=kubelet\n", nil)
	for _, tc := range []struct {
		obj  *unstructured.Unstructured
		want bool
	}{{ev("kubelet", ""), true}, {ev("", "kubelet"), true}, {ev("kubelet", "other"), true}, {ev("scheduler", "kubelet"), false}, {ev("", ""), false}} {
		if got := r.InView(tc.obj); got != tc.want {
			t.Errorf("source %v, reportingComponent %v: in view %v, want %v", tc.obj.Object["source"], tc.obj.Object["reportingComponent"], got, tc.want)
		}
	}
	cmRule := compile(t, "    resource: v1/configmaps\n    fieldSelector: data.source=kubelet\n", nil)
	if !cmRule.InView(cm("a", "x", "1", nil, map[string]any{"source": "kubelet"})) {
		t.Error("a ConfigMap's data.source is not read at its path")
	}
}

package filters

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

func compile(t testing.TB, ruleYAML string, nsLabels NamespaceLabels) *Rule {
	t.Helper()
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}]\nrules:\n  - name: r\n    sinks: [s]\n" + ruleYAML
	cfg, _, err := config.Parse("t.yaml", []byte(doc))
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

var t0 = time.Unix(1700000000, 0)

func change(ev *event.Event) string {
	if ev == nil {
		return "-"
	}
	if ev.Reason != "" {
		return string(ev.Change) + ":" + ev.Reason
	}
	return string(ev.Change)
}

func TestViewTransitions(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    labelSelector: tier=front\n", nil)
	back := cm("a", "x", "1", map[string]string{"tier": "back"}, nil)
	front := cm("a", "x", "2", map[string]string{"tier": "front"}, nil)
	front2 := cm("a", "x", "3", map[string]string{"tier": "front", "v": "2"}, nil)
	back2 := cm("a", "x", "4", map[string]string{"tier": "back"}, nil)
	steps := []struct {
		name string
		ev   *event.Event
		want string
	}{
		{"add outside", r.OnAdd(back, t0), "-"},
		{"enter", r.OnUpdate(back, front, t0), "added"},
		{"update inside", r.OnUpdate(front, front2, t0), "updated"},
		{"resync (same resourceVersion)", r.OnUpdate(front2, front2, t0), "-"},
		{"leave", r.OnUpdate(front2, back2, t0), "deleted:unmatched"},
		{"update outside", r.OnUpdate(back2, cm("a", "x", "5", map[string]string{"tier": "back"}, nil), t0), "-"},
		{"delete outside", r.OnDelete(back2, t0), "-"},
		{"delete inside", r.OnDelete(front2, t0), "deleted"},
		{"tombstone inside", r.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/x", Obj: front2}, t0), "deleted"},
		{"tombstone of something else", r.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/x", Obj: "junk"}, t0), "-"},
	}
	for _, s := range steps {
		if got := change(s.ev); got != s.want {
			t.Errorf("%s: %s, want %s", s.name, got, s.want)
		}
	}
	ev := r.OnUpdate(back, front, t0)
	if ev.ID != "uid-x.2.added" || ev.Key != "r/a/x" || ev.Subject != "a/x" || ev.Type != "io.kubebridge.configmaps.core.added" {
		t.Errorf("entering event: %+v", ev)
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
			if ev := r.OnAdd(o, t0); ev == nil {
				t.Errorf("%s: %s/%s excluded, want included", tc.rule, o.GetNamespace(), o.GetName())
			}
		}
		for _, o := range tc.out {
			if ev := r.OnAdd(o, t0); ev != nil {
				t.Errorf("%s: %s/%s included, want excluded", tc.rule, o.GetNamespace(), o.GetName())
			}
		}
	}
}

func TestEventsAndChanged(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    events: [updated]\n    changed: [data.watch, 'metadata.annotations[\"a.b/c\"]']\n", nil)
	base := cm("a", "x", "1", nil, map[string]any{"watch": "1", "other": "1"})
	if r.OnAdd(base, t0) != nil || r.OnDelete(base, t0) != nil {
		t.Error("added/deleted delivered though events: [updated]")
	}
	if ev := r.OnUpdate(base, cm("a", "x", "2", nil, map[string]any{"watch": "1", "other": "2"}), t0); ev != nil {
		t.Error("update of an unlisted path delivered")
	}
	if ev := r.OnUpdate(base, cm("a", "x", "2", nil, map[string]any{"watch": "2", "other": "1"}), t0); ev == nil {
		t.Error("update of data.watch not delivered")
	}
	if ev := r.OnUpdate(base, cm("a", "x", "2", nil, map[string]any{"other": "1"}), t0); ev == nil {
		t.Error("removal of data.watch not delivered")
	}
	annotated := cm("a", "x", "2", nil, map[string]any{"watch": "1", "other": "1"})
	annotated.SetAnnotations(map[string]string{"a.b/c": "v"})
	if ev := r.OnUpdate(base, annotated, t0); ev == nil {
		t.Error("update of a bracketed annotation path not delivered")
	}
}

// A where expression that reads oldObject or type filters events; it does
// not define a view, so it causes no enter/leave transitions.
func TestWhereAsEventFilter(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    where: \"type != 'updated' || object.data.n != oldObject.data.n\"\n", nil)
	a := cm("a", "x", "1", nil, map[string]any{"n": "1"})
	b := cm("a", "x", "2", nil, map[string]any{"n": "1"})
	c := cm("a", "x", "3", nil, map[string]any{"n": "2"})
	if got := change(r.OnAdd(a, t0)); got != "added" {
		t.Errorf("add: %s", got)
	}
	if got := change(r.OnUpdate(a, b, t0)); got != "-" {
		t.Errorf("update with equal n: %s", got)
	}
	if got := change(r.OnUpdate(b, c, t0)); got != "updated" {
		t.Errorf("update with new n: %s", got)
	}
}

// A where expression failing at run time drops the event and is counted.
func TestWhereRuntimeErrorIsCounted(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    where: \"object.data.n == '1'\"\n", nil)
	if ev := r.OnAdd(cm("a", "x", "1", nil, nil), t0); ev != nil {
		t.Error("delivered though where failed (no data)")
	}
	if r.EvalErrors() != 1 {
		t.Errorf("EvalErrors = %d, want 1", r.EvalErrors())
	}
	if ev := r.OnAdd(cm("a", "x", "1", nil, map[string]any{"n": "1"}), t0); ev == nil {
		t.Error("matching object not delivered")
	}
}

func TestDepartedWithNamespace(t *testing.T) {
	r := compile(t, "    resource: v1/configmaps\n    namespaceSelector: env=prod\n    labelSelector: keep=yes\n", func(string) (labels.Set, bool) { return nil, false })
	if got := change(r.Departed(cm("a", "x", "1", map[string]string{"keep": "yes"}, nil), t0)); got != "deleted:unmatched" {
		t.Errorf("departed: %s", got)
	}
	if got := change(r.Departed(cm("a", "y", "1", nil, nil), t0)); got != "-" {
		t.Errorf("departed outside the label selector: %s", got)
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

func BenchmarkOnUpdate(b *testing.B) {
	r := compile(b, "    resource: v1/configmaps\n    labelSelector: team=pay\n    changed: [data]\n", nil)
	old := cm("a", "x", "1", map[string]string{"team": "pay"}, map[string]any{"k": strings.Repeat("v", 100)})
	obj := cm("a", "x", "2", map[string]string{"team": "pay"}, map[string]any{"k": strings.Repeat("w", 100)})
	b.ReportAllocs()
	for b.Loop() {
		if r.OnUpdate(old, obj, t0) == nil {
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
		{"    include: [metadata]\n    where: \"size(object) > 3\"\n", false},
		{"    include: [metadata]\n    changed: [metadata.labels]\n", true},
		{"    include: [metadata]\n    changed: [data]\n", false},
		{"    include: [metadata]\n    fieldSelector: metadata.name=a\n", true},
		{"    include: [metadata]\n    fieldSelector: status.phase=Up\n", false},
		{"    include: [metadata]\n    index: {\"label:team\": [pay]}\n", true},
	} {
		r := compile(t, "    resource: v1/configmaps\n"+tc.rule, nil)
		if got := r.MetadataOnly(); got != tc.want {
			t.Errorf("%sMetadataOnly() = %v, want %v", tc.rule, got, tc.want)
		}
	}
}

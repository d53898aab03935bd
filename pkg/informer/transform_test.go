package informer

import (
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The cache transform drops managedFields and interns keys and repeating
// values without changing the object.
func TestStripManagedFieldsInterns(t *testing.T) {
	decode := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"alpha","namespace":"ns","labels":{"team":"pay"},
			"managedFields":[{"manager":"kubectl"}],"ownerReferences":[{"kind":"Deployment","name":"d"}]},"data":{"k":"v"}}`)); err != nil {
			t.Fatal(err)
		}
		return u
	}
	a, b := decode(), decode()
	for _, u := range []*unstructured.Unstructured{a, b} {
		if _, err := stripManagedFields(u); err != nil {
			t.Fatal(err)
		}
	}
	want := decode()
	unstructured.RemoveNestedField(want.Object, "metadata", "managedFields")
	if !reflect.DeepEqual(a.Object, want.Object) {
		t.Fatalf("transformed = %v, want %v", a.Object, want.Object)
	}
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(a.GetNamespace(), b.GetNamespace()) || !same(a.GetLabels()["team"], b.GetLabels()["team"]) || !same(a.GetKind(), b.GetKind()) {
		t.Error("namespace, label values and kind of two objects are not shared")
	}
	if same(a.GetName(), b.GetName()) {
		t.Error("names are interned: they are unique, interning only costs")
	}
}

// BenchmarkTransform is the cache transform's cost per decoded object (a
// ~1 KiB ConfigMap with managedFields), paid once per watch event.
func BenchmarkTransform(b *testing.B) {
	raw := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench-000001","namespace":"bench","uid":"6f1c1d2e-2f0a-4b8e-9c55-0d3c1a2b3c4d",
		"resourceVersion":"123456","creationTimestamp":"2026-11-21T10:00:00Z","labels":{"app":"bench","shard":"1"},
		"managedFields":[{"manager":"bench","operation":"Update","apiVersion":"v1","time":"2026-11-21T10:00:00Z","fieldsType":"FieldsV1",
		"fieldsV1":{"f:data":{".":{},"f:payload":{},"f:revision":{}},"f:metadata":{"f:labels":{".":{},"f:app":{},"f:shard":{}}}}}]},
		"data":{"payload":"` + strings.Repeat("x", 1000) + `","revision":"0"}}`)
	objs := make([]*unstructured.Unstructured, 1000)
	for i := range objs {
		objs[i] = &unstructured.Unstructured{}
		if err := objs[i].UnmarshalJSON(raw); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		u := objs[i%len(objs)]
		_, _ = stripManagedFields(u)
	}
}

// A whole float (as CBOR carries 1.0) is cached as the int64 JSON decodes it
// to, in maps and in lists; fractions and out-of-range values stay floats.
func TestWholeFloatsBecomeInts(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "x"},
		"spec":     map[string]any{"a": float64(1), "b": 1.5, "c": []any{float64(2), 2.5, map[string]any{"d": float64(-3)}}, "e": 1e300},
	}}
	out, err := stripManagedFields(u)
	if err != nil {
		t.Fatal(err)
	}
	spec := out.(*unstructured.Unstructured).Object["spec"].(map[string]any)
	list := spec["c"].([]any)
	for name, c := range map[string]struct{ got, want any }{
		"a": {spec["a"], int64(1)}, "b": {spec["b"], 1.5}, "c[0]": {list[0], int64(2)}, "c[1]": {list[1], 2.5},
		"c[2].d": {list[2].(map[string]any)["d"], int64(-3)}, "e": {spec["e"], 1e300},
	} {
		if c.got != c.want {
			t.Errorf("spec.%s = %#v, want %#v", name, c.got, c.want)
		}
	}
}

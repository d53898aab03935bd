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

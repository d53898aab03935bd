package informer

import (
	"reflect"
	"testing"

	"k8s.io/client-go/tools/cache"
)

// The namespace index gives what cache.MetaNamespaceIndexFunc gives, one
// shared slice per namespace, and a slice of their own to objects of
// namespaces past the ones it remembers.
func TestNamespaceIndex(t *testing.T) {
	x := new(namespaceIndex)
	for _, obj := range []any{object("a", "x", "1", nil), object("", "n", "1", nil), object("b", "y", "1", nil), "junk"} {
		got, err := x.index(obj)
		want, wantErr := cache.MetaNamespaceIndexFunc(obj)
		if !reflect.DeepEqual(got, want) || (err == nil) != (wantErr == nil) {
			t.Errorf("%v: %v, %v; want %v, %v", obj, got, err, want, wantErr)
		}
	}
	a1, _ := x.index(object("a", "x", "1", nil))
	a2, _ := x.index(object("a", "z", "2", nil))
	if &a1[0] != &a2[0] {
		t.Error("two objects of one namespace: two slices")
	}
	obj := object("a", "x", "1", nil)
	if n := testing.AllocsPerRun(100, func() { _, _ = x.index(obj) }); n != 0 {
		t.Errorf("index of a known namespace: %v allocations", n)
	}
	for i := range maxIndexedNamespaces + 10 {
		ns := "ns-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
		got, _ := x.index(object(ns, "x", "1", nil))
		if len(got) != 1 || got[0] != ns {
			t.Fatalf("%s: %v", ns, got)
		}
	}
	if m := x.values.Load(); len(*m) != maxIndexedNamespaces {
		t.Errorf("%d namespaces remembered; want at most %d", len(*m), maxIndexedNamespaces)
	}
}

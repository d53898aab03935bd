package informer

import (
	"maps"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// namespaceIndex is the cache.NamespaceIndex every informer has, as
// cache.MetaNamespaceIndexFunc computes it, without allocating: client-go
// calls an index function twice per cache update (the old state and the
// new one), and the values of a namespace are one slice, shared (client-go
// only reads them). It remembers up to maxIndexedNamespaces namespaces;
// objects of others get a slice of their own, as before.
type namespaceIndex struct {
	values atomic.Pointer[map[string][]string] // replaced whole, never modified
	mu     sync.Mutex                          // serializes replacements
}

const maxIndexedNamespaces = 1024

// index is the IndexFunc.
func (x *namespaceIndex) index(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return cache.MetaNamespaceIndexFunc(obj)
	}
	ns, _ := metadata(u)["namespace"].(string)
	if m := x.values.Load(); m != nil {
		if v, ok := (*m)[ns]; ok {
			return v, nil
		}
	}
	return x.add(ns), nil
}

// add returns the values of namespace ns, remembering them while there is room.
func (x *namespaceIndex) add(ns string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var m map[string][]string
	if p := x.values.Load(); p != nil {
		m = *p
	}
	if v, ok := m[ns]; ok {
		return v
	}
	v := []string{ns}
	if len(m) < maxIndexedNamespaces {
		next := make(map[string][]string, len(m)+1)
		maps.Copy(next, m)
		next[ns] = v
		x.values.Store(&next)
	}
	return v
}

// relatedIndex indexes the objects of rules that read owners by the uids
// of their owners and, for a Kubernetes Event, of its involved object
// (involvedObject, regarding): what an owner's change re-evaluates
// (Informers.ownerChanged).
const relatedIndex = "kubebridge/related"

// relatedUIDs is relatedIndex's function.
func relatedUIDs(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	var uids []string
	refs, _ := metadata(u)["ownerReferences"].([]any)
	for _, ref := range refs {
		if m, ok := ref.(map[string]any); ok {
			if uid, _ := m["uid"].(string); uid != "" {
				uids = append(uids, uid)
			}
		}
	}
	for _, field := range []string{"involvedObject", "regarding"} {
		if m, ok := u.Object[field].(map[string]any); ok {
			if uid, _ := m["uid"].(string); uid != "" {
				uids = append(uids, uid)
			}
		}
	}
	return uids, nil
}

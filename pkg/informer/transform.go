package informer

import (
	"math"
	"unique"
	"unsafe"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// MetadataOnly reports whether no rule of the informer needs more of an
// object than its apiVersion, kind and metadata: then only those are cached.
func (w Watch) MetadataOnly() bool {
	for _, r := range w.Rules {
		if !r.MetadataOnly() {
			return false
		}
	}
	return len(w.Rules) > 0
}

// transform is what w's informer does to each object before caching it.
// client-go calls it once per object it decodes (never again on a cached
// object: resyncs and tombstones skip it).
func (w Watch) transform() cache.TransformFunc {
	reduce := stripManagedFields
	if w.MetadataOnly() {
		reduce = keepMetadata
	}
	annotations, digest := w.secretDigests()
	if !digest {
		return reduce
	}
	return func(obj any) (any, error) {
		obj, err := reduce(obj)
		if u, ok := obj.(*unstructured.Unstructured); ok && err == nil {
			event.DigestSecret(u.Object, annotations) // after interning: digests are unique, interning them would only cost
		}
		return obj, err
	}
}

// secretDigests reports whether w's informer caches Secrets whose values
// none of its rules may deliver, and which annotations every one of its
// rules redacts: the rules' event.SecretPolicy decides (event.CacheDigests).
// Then the cache holds a Digest of each such value instead of the value
// (event.DigestSecret): every rule sees and sends those values redacted,
// and compares digests where it compares values (changed).
func (w Watch) secretDigests() (annotations []string, ok bool) {
	policies := make([]event.SecretPolicy, len(w.Rules))
	for i, r := range w.Rules {
		if r.Event == nil {
			return nil, false
		}
		policies[i] = r.Event.Secrets()
	}
	return event.CacheDigests(w.Spec.GVR, policies)
}

// keepMetadata reduces objects to apiVersion, kind and metadata (without
// managedFields) before they are cached, for informers whose rules need no
// more: a fraction of the memory for objects with large specs or data.
func keepMetadata(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.Object = event.MetadataOnly(u.Object)
	}
	return obj, nil
}

// stripManagedFields drops metadata.managedFields before objects are cached
// (they are large and no rule needs them) and interns what repeats across
// objects.
func stripManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		if md, ok := u.Object["metadata"].(map[string]any); ok {
			delete(md, "managedFields")
		}
		u.Object = intern(u.Object, 0)
	}
	return obj, nil
}

// intern rebuilds a decoded object with its map keys, and the values that
// repeat across objects (apiVersion, kind, namespace, label values, owner
// kinds), replaced by canonical copies: the JSON decoder allocates every
// string anew, and the keys alone are a tenth of a small object's cache
// footprint. Other values (names, uids, data) are unique and kept as they are.
// A map whose keys are canonical already (the bridge's JSON watch decoder,
// internal/kubejson, makes them so) is not rebuilt: its values are
// replaced in place.
func intern(m map[string]any, depth int) map[string]any {
	if canonicalKeys(m) {
		for k, v := range m {
			switch v := v.(type) {
			case map[string]any:
				m[k] = intern(v, depth+1)
			case []any:
				internSlice(v, depth)
			case float64:
				m[k] = wholeAsInt(v)
			case string:
				if len(v) <= 63 && repeats(k, depth) {
					m[k] = unique.Make(v).Value()
				}
			}
		}
		return m
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			out[unique.Make(k).Value()] = intern(v, depth+1)
		case []any:
			internSlice(v, depth)
			out[unique.Make(k).Value()] = v
		case float64:
			out[unique.Make(k).Value()] = wholeAsInt(v)
		case string:
			if len(v) <= 63 && repeats(k, depth) { // label values are at most 63 bytes
				v = unique.Make(v).Value()
			}
			out[unique.Make(k).Value()] = v
		default:
			out[unique.Make(k).Value()] = v
		}
	}
	return out
}

// internSlice interns the maps in a list, in place, and makes its whole
// floats ints.
func internSlice(v []any, depth int) {
	for i, e := range v {
		switch e := e.(type) {
		case map[string]any:
			v[i] = intern(e, depth+1)
		case float64:
			v[i] = wholeAsInt(e)
		}
	}
}

// canonicalKeys reports whether every key of m is its canonical copy
// (unique.Make's).
func canonicalKeys(m map[string]any) bool {
	for k := range m {
		if unsafe.StringData(unique.Make(k).Value()) != unsafe.StringData(k) {
			return false
		}
	}
	return true
}

// wholeAsInt returns a whole float64 as the int64 the JSON path decodes it
// to: the apiserver writes float64(1) as 1 in JSON, which decodes to
// int64, but keeps it a float in CBOR. So CEL types and changed paths do
// not depend on the encoding the apiserver answered with.
func wholeAsInt(f float64) any {
	if f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
		return int64(f)
	}
	return f
}

// repeats says whether string values of key at depth are worth interning.
func repeats(key string, depth int) bool {
	switch key {
	case "apiVersion", "kind":
		return true
	case "namespace":
		return depth == 1
	}
	return depth == 2 // metadata.labels values (and short values of other maps two levels down)
}

package event

import (
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// Every object an event carries has its apiVersion and kind. Objects from
// the informer's cache carry them; an object rebuilt from a checkpoint (a
// deletion found at a restart: metadata only) does not, so they are taken
// from the rule's resource: apiVersion from its group and version, kind
// from Rule.Kind, else from an object of the resource seen since the start
// (Learn), else from Kubernetes' built-in resources.

// ResourceKind is the kind of the rule's resource: Kind, else the kind of
// an object of the resource seen (Learn), else the kind Kubernetes gives a
// built-in resource of that group, version and name; "" when none of those
// knows it (a custom resource of which no object was seen since the start
// and whose kind nobody set).
func (r *Rule) ResourceKind() string {
	if r.Kind != "" {
		return r.Kind
	}
	if k := r.learned.Load(); k != nil {
		return *k
	}
	return builtinKind(r.GVR)
}

// Learn records the kind of obj, an object of the rule's resource, for
// the events whose objects carry none (ResourceKind). The first object
// whose apiVersion is the resource's teaches it; later calls cost an
// atomic load.
func (r *Rule) Learn(obj *unstructured.Unstructured) {
	if r.Kind != "" || r.learned.Load() != nil || obj == nil {
		return
	}
	kind, _ := obj.Object["kind"].(string)
	av, _ := obj.Object["apiVersion"].(string)
	if kind == "" || !isGroupVersion(av, r.GVR) {
		return
	}
	kind = strings.Clone(kind)
	r.learned.CompareAndSwap(nil, &kind)
}

// APIVersion is the apiVersion of the rule's resource: <group>/<version>,
// or <version> for the core group.
func (r *Rule) APIVersion() string { return r.GVR.GroupVersion().String() }

// isGroupVersion reports whether apiVersion is gvr's group and version.
func isGroupVersion(apiVersion string, gvr schema.GroupVersionResource) bool {
	if gvr.Group == "" {
		return apiVersion == gvr.Version
	}
	return len(apiVersion) == len(gvr.Group)+1+len(gvr.Version) && apiVersion[len(gvr.Group)] == '/' &&
		strings.HasPrefix(apiVersion, gvr.Group) && strings.HasSuffix(apiVersion, gvr.Version)
}

// typed returns obj, or when it lacks its apiVersion or kind a shallow copy
// with the rule's resource's (a kind nobody knows stays out). obj is not
// modified.
func (r *Rule) typed(obj map[string]any) map[string]any {
	av, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if av != "" && kind != "" {
		return obj
	}
	if kind == "" {
		kind = r.ResourceKind()
	}
	if av == "" {
		av = r.APIVersion()
	}
	out := make(map[string]any, len(obj)+2)
	for k, v := range obj {
		out[k] = v
	}
	out["apiVersion"] = av
	if kind != "" {
		out["kind"] = kind
	}
	return out
}

var builtin struct {
	once  sync.Once
	kinds map[schema.GroupVersionResource]string
}

// builtinKind is the kind of a resource Kubernetes serves itself (client-go's
// scheme), "" for others.
func builtinKind(gvr schema.GroupVersionResource) string {
	builtin.once.Do(func() {
		kinds := map[schema.GroupVersionResource]string{}
		clash := map[schema.GroupVersionResource]bool{}
		for gvk := range scheme.Scheme.AllKnownTypes() {
			if strings.HasSuffix(gvk.Kind, "List") || strings.HasSuffix(gvk.Kind, "Options") {
				continue
			}
			plural, _ := meta.UnsafeGuessKindToResource(gvk)
			if k, ok := kinds[plural]; ok && k != gvk.Kind {
				clash[plural] = true
			}
			kinds[plural] = gvk.Kind
		}
		for gvr := range clash {
			delete(kinds, gvr) // no guess rather than a wrong one
		}
		builtin.kinds = kinds
	})
	return builtin.kinds[gvr]
}

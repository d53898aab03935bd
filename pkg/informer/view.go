package informer

import (
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/filters"
)

// View returns the objects currently in rule r's view, from the caches of
// the informers that feed it. A rule with index terms is enumerated through
// the informer's index (ByIndex on its first term), not by a full scan.
func (in *Informers) View(r *filters.Rule) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	name, values, indexed := r.IndexLookup()
	for _, run := range in.running {
		if !slices.Contains(run.Rules, r) {
			continue
		}
		var objs []any
		if indexed {
			for _, v := range values {
				got, err := run.inf().GetIndexer().ByIndex(name, v)
				if err != nil {
					in.logger.Error("index lookup failed; scanning", "rule", r.Name, "index", name, "error", err)
					objs = run.inf().GetStore().List()
					break
				}
				objs = append(objs, got...)
			}
		} else {
			objs = run.inf().GetStore().List()
		}
		seen := map[*unstructured.Unstructured]bool{}
		for _, o := range objs {
			u, ok := o.(*unstructured.Unstructured)
			if ok && !seen[u] && r.InView(u) {
				seen[u] = true
				out = append(out, u)
			}
		}
	}
	return out
}

// Cache returns the cache of the informer that holds key for rule r (nil if
// no informer of r covers it).
func (in *Informers) Cache(r *filters.Rule, key string) cache.KeyGetter {
	ns, _, _ := cache.SplitMetaNamespaceKey(key)
	for _, run := range in.running {
		if slices.Contains(run.Rules, r) && (run.Spec.Namespace == "" || run.Spec.Namespace == ns) {
			return run.inf().GetIndexer()
		}
	}
	return nil
}

// NamespaceLabels is the filters.NamespaceLabels backed by the namespace
// informer (valid once Start has synced it).
func (in *Informers) NamespaceLabels(ns string) (labels.Set, bool) {
	if in.ns == nil {
		return nil, false
	}
	obj, ok, err := in.ns.GetStore().GetByKey(ns)
	if err != nil || !ok {
		return nil, false
	}
	return labels.Set(obj.(*unstructured.Unstructured).GetLabels()), true
}

// Specs lists the informers, for logs.
func (in *Informers) Specs() []string {
	out := make([]string, len(in.running))
	for i, r := range in.running {
		out[i] = r.Spec.String()
		if r.MetadataOnly() {
			out[i] += " (metadata only)"
		}
		if _, ok := r.secretDigests(); ok {
			out[i] += " (secret values digested)"
		}
	}
	return out
}

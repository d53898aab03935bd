// Package owners resolves an object's owner chain (Pod → ReplicaSet →
// Deployment, Job → CronJob, any CRD owner) from shared metadata-only
// informers, so that a message can name what an object belongs to and an
// expression can choose by it.
//
// Only the resources a config asks for are watched (their list and watch
// is what the chart's RBAC grants), each through one metadata informer
// that caches names, labels and ownerReferences only. An owner whose kind
// is not watched, or that is not in the cache (not synced yet, or created
// a moment ago) is named from the ownerReference alone, and the chain
// says it is incomplete: resolution never blocks the caller beyond the
// wait it was given. Chains are bounded (MaxDepth) and cycles in
// ownerReferences end them.
package owners

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// MaxDepth bounds a chain: Kubernetes' deepest built-in one is three
// (Pod, ReplicaSet, Deployment); ownerReferences are written by users too.
const MaxDepth = 8

// Owner is one link of a chain.
type Owner struct {
	APIVersion, Kind, Name string
	UID                    types.UID
	// Labels are the owner's labels; nil when it was not found in a cache
	// (Resolved false: named from the ownerReference only).
	Labels   map[string]string
	Resolved bool
}

// Chain is an object's owners, nearest first, and whether every link was
// found (an incomplete chain ends at the first owner not found).
type Chain struct {
	Owners   []Owner
	Complete bool
}

// Top is the last owner: the top controller (a Deployment for its Pods).
func (c Chain) Top() (Owner, bool) {
	if len(c.Owners) == 0 {
		return Owner{}, false
	}
	return c.Owners[len(c.Owners)-1], true
}

// Resolver resolves chains. Start starts its informers; Shutdown stops
// them and waits.
type Resolver struct {
	factory metadatainformer.SharedInformerFactory
	// byKind maps an ownerReference's apiVersion and kind to the
	// informer of its resource.
	byKind map[schema.GroupVersionKind]cache.SharedIndexInformer
	synced []cache.InformerSynced
	once   sync.Once
}

// Resource is a resource to watch for owners and the kind its objects
// have (discovery's).
type Resource struct {
	GVR  schema.GroupVersionResource
	Kind string
}

// New makes a resolver over the given resources (usually what
// DefaultResources lists, plus the CRDs a config names).
func New(client metadata.Interface, resources []Resource) *Resolver {
	r := &Resolver{
		factory: metadatainformer.NewSharedInformerFactoryWithOptions(client, 0, metadatainformer.WithTransform(trim)),
		byKind:  map[schema.GroupVersionKind]cache.SharedIndexInformer{},
	}
	for _, res := range resources {
		inf := r.factory.ForResource(res.GVR).Informer()
		r.byKind[res.GVR.GroupVersion().WithKind(res.Kind)] = inf
		r.synced = append(r.synced, inf.HasSynced)
	}
	return r
}

// DefaultResources are the built-in controllers that own objects.
var DefaultResources = []Resource{
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, "ReplicaSet"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, "Deployment"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, "StatefulSet"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}, "DaemonSet"},
	{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, "Job"},
	{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "cronjobs"}, "CronJob"},
}

// Start starts the informers; they stop with ctx or Shutdown.
func (r *Resolver) Start(ctx context.Context) { r.factory.Start(ctx.Done()) }

// WaitForSync waits until every informer listed once, or ctx ends.
func (r *Resolver) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), r.synced...)
}

// Shutdown stops the informers and waits for their goroutines.
func (r *Resolver) Shutdown() { r.once.Do(r.factory.Shutdown) }

// Resolve returns obj's chain: its controller owner (else its first
// owner), that owner's, and so on. An owner not in its cache yet is
// waited for up to wait (an object and its owner are often created
// together), then named from the reference.
func (r *Resolver) Resolve(ctx context.Context, obj metav1.Object, wait time.Duration) Chain {
	chain := Chain{Complete: true}
	seen := map[types.UID]bool{obj.GetUID(): true}
	ns := obj.GetNamespace()
	refs := obj.GetOwnerReferences()
	deadline := time.Now().Add(wait)
	for len(refs) > 0 {
		ref := pick(refs)
		if seen[ref.UID] || len(chain.Owners) == MaxDepth {
			break // a cycle, or a chain past any a controller makes
		}
		seen[ref.UID] = true
		o := Owner{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}
		found, ok := r.lookup(ctx, ref, ns, deadline)
		if !ok {
			chain.Owners = append(chain.Owners, o)
			chain.Complete = false
			return chain
		}
		o.Labels, o.Resolved = found.GetLabels(), true
		chain.Owners = append(chain.Owners, o)
		refs = found.GetOwnerReferences()
	}
	return chain
}

// pick is the reference a chain follows: the controller, else the first.
func pick(refs []metav1.OwnerReference) metav1.OwnerReference {
	for _, ref := range refs {
		if ref.Controller != nil && *ref.Controller {
			return ref
		}
	}
	return refs[0]
}

// lookup finds ref's object in its informer's cache (in ns, or
// cluster-scoped), polling until deadline while it is missing.
func (r *Resolver) lookup(ctx context.Context, ref metav1.OwnerReference, ns string, deadline time.Time) (metav1.Object, bool) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, false
	}
	inf, ok := r.byKind[gv.WithKind(ref.Kind)]
	if !ok {
		return nil, false // a kind not watched: named from the reference
	}
	for {
		for _, key := range []string{ns + "/" + ref.Name, ref.Name} {
			item, exists, err := inf.GetIndexer().GetByKey(key)
			if err != nil || !exists {
				continue
			}
			if m, ok := item.(metav1.Object); ok && m.GetUID() == ref.UID {
				return m, true
			}
		}
		if !time.Now().Before(deadline) {
			return nil, false
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(min(20*time.Millisecond, time.Until(deadline))):
		}
	}
}

// trim keeps what a chain reads of an owner: its names, labels and
// owner references (managedFields and annotations can be most of an
// object's metadata).
func trim(obj any) (any, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil
	}
	m.SetManagedFields(nil)
	m.SetAnnotations(nil)
	return obj, nil
}

// String is the chain as a person reads it: "ReplicaSet web-6d4 →
// Deployment web".
func (c Chain) String() string {
	s := ""
	for i, o := range c.Owners {
		if i > 0 {
			s += " → "
		}
		s += fmt.Sprintf("%s %s", o.Kind, o.Name)
	}
	return s
}

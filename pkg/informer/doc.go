// Package informer runs the dynamic shared informers kubebridge watches
// through: one per resource and scope, shared by every rule on it.
//
// Plan decides the informers: when every rule on a resource names its
// namespaces, one informer per named namespace (so namespaced RBAC is
// enough); otherwise one cluster-wide informer. A label or field selector is
// sent to the apiserver only when every rule on that informer has the same
// one (then it is exact); otherwise rules filter client-side. Objects enter
// the cache without managedFields. Each rule's index keys are registered as
// Indexers, beside the namespace index every informer has.
//
// The handler never blocks: it hands each notification's object key and
// state to Notify (internal/view then compares it with what each sink was
// handed, and only enqueues). Deletions missed while a watch was
// down arrive as tombstones (cache.DeletedFinalStateUnknown) after the
// relist; a uid replaced while it was down arrives as an update, which the
// view turns into deleted + added.
package informer

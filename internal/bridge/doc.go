// Package bridge wires a config into a running kubebridge and owns its
// lifetime: the cluster preflight (discovery and access review), sinks with
// their deliveries and dead-letters, the checkpoint store and recorder, the
// shared informers and compiled rules, the reconciliation with each sink's
// checkpoint at start, the admin endpoints (health, readiness, metrics,
// replay) and an orderly shutdown (informers first, then drained queues,
// then a last checkpoint write).
package bridge

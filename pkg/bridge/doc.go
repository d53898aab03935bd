// Package bridge wires a config into a running kubebridge: informers,
// filters, per-sink queues and sinks, and owns their lifetime. Today it holds
// the cluster preflight used by `bridge validate --kubeconfig`.
package bridge

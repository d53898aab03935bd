// Package bridge wires a config into a running kubebridge and owns its
// lifetime. It checks the config against the cluster (preflight.go),
// compiles the rules and builds their informers (bridge.go), and joins
// three parts:
//
//   - the deliverer (deliverer.go, sinkset.go): the sinks, each sink's
//     view (internal/view) and delivery (internal/delivery), the checkpoint
//     store and recorder; start, reconcile, swap (a reload) and stop, the
//     one teardown;
//   - ownership (leader.go): alone, or a leaseOwner that starts the
//     deliverer while this replica holds the Lease and fences every send;
//   - the host (host.go): what sink types share across reloads
//     (sinks.Host), and the dead-letters and checkpoint bucket the config
//     asks of a sink's type.
//
// The admin API (internal/admin) sees the bridge through admin.Target
// (admin.go). Shutdown goes one way (teardown): informers, then the
// deliverer draining and writing its last checkpoint, then the Lease,
// then the host.
package bridge

// Package bridge wires a config into a running kubebridge and owns its
// lifetime. It checks the config against the cluster (internal/preflight),
// compiles the rules and builds their informers (bridge.go), and joins
// three parts:
//
//   - the deliverer (deliverer.go, sinkset.go): the sinks, each sink's
//     view (internal/view) and delivery (internal/delivery), the checkpoint
//     store and recorder; start, reconcile, swap (a reload) and stop, the
//     one teardown;
//   - ownership (ownership.go): which objects this replica delivers, one
//     shape in three sizes: alone, one shard held forever; under leader
//     election, one behind the Lease (leader.go); sharded, N, each behind
//     its own Lease (sharded.go, internal/shards). Each shard held is one
//     deliverer built with the shard's scope (shards.Scope: its fence and
//     its holding), which its deliveries and checkpoint recorder write
//     through;
//   - the host (host.go): what sink types share across reloads
//     (sinks.Host), and the dead-letters and checkpoint bucket the config
//     asks of a sink's type.
//
// The admin API (internal/admin) sees the bridge through admin.Target
// (admin.go). Shutdown goes one way (teardown): ownership halts (no shard
// starts), informers stop, the deliverers drain and write their last
// checkpoint, the Leases are released, then the host closes. A reload
// (reload.go) swaps every deliverer's sinks while the shards are held
// still.
package bridge

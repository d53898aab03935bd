package sinks

import "context"

// Holder is implemented by sinks whose destination holds each rule's view
// as state a consumer reads (a NATS KV bucket per rule, a compacted Kafka
// topic): there, what the destination holds is what the sink has
// acknowledged, whatever the bridge's checkpoint says. The bridge reads it
// whenever it loads a sink's views (start, reload, a shard taken over)
// and diffs the rule's view against it, so the destination converges to
// the view even after it lost or gained entries behind the bridge's back
// (a bucket recreated, a checkpoint lost, a write that landed after a
// crash). The checkpoint still supplies what the destination does not
// keep (when an object entered the view, its ids' stamp) and the
// incarnations a send may still hold in flight.
type Holder interface {
	// Held returns every object the destination holds for rule, in any
	// order, one entry per incarnation (a key may hold a stale uid beside
	// the current one in a store keyed by uid). It learns, as a side
	// effect, what a conditional write to each needs (revisions, offsets).
	Held(ctx context.Context, rule string) ([]HeldObject, error)
}

// HeldObject is one object as a destination holds it: enough to diff the
// view against (its identity and version) and to address its deletion.
type HeldObject struct {
	Namespace       string // "" for cluster-scoped objects
	Name            string
	UID             string
	ResourceVersion string // "" when the destination holds a marker (an object too large), which is re-sent
	Labels          map[string]string
}

// LossNotifier is implemented by Holder sinks whose destination can lose
// what it held while the bridge runs (a bucket deleted and created again
// by the sink): the bridge then reads it again (Held) and sends what it
// lacks. NotifyLost returns a channel of the rules whose state was lost,
// and stop, which ends the notifications. A notification is never blocked
// on: a reader that is behind may miss a repeat of a rule it has pending.
type LossNotifier interface {
	NotifyLost() (lost <-chan string, stop func())
}

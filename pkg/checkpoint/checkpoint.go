// Package checkpoint keeps, per sink and rule, the view each sink has been
// delivered: object key -> (uid, resourceVersion, namespace, name, labels),
// written after the sink acknowledged, in batches.
//
// On restart the bridge diffs each rule's current view against it, so
// changes made while the bridge was down (or events it had queued but not
// delivered) reach the sink: new or changed objects as added/updated,
// vanished ones as deleted, all with kbreplay "checkpoint".
//
// What the store holds may lag what the sinks have: a crash loses at most
// the last unflushed batch, whose events are then delivered again (at least
// once). It never runs ahead: entries are written only after acknowledgement.
package checkpoint

import (
	"context"
	"errors"
)

// Entry is what a sink last received of one object under one rule.
type Entry struct {
	UID             string            `json:"uid"`
	ResourceVersion string            `json:"rv"`
	Namespace       string            `json:"ns,omitempty"`
	Name            string            `json:"name"`
	Labels          map[string]string `json:"labels,omitempty"`
}

// Change is one update of a view: Entry nil deletes the key.
type Change struct {
	Sink, Rule, Key string
	Entry           *Entry
}

// Store persists delivered views.
type Store interface {
	// Load returns the delivered view of a sink's rule, keyed by object key
	// (namespace/name, or name for cluster-scoped objects).
	Load(ctx context.Context, sink, rule string) (map[string]Entry, error)
	// Apply records changes atomically, in order.
	Apply(ctx context.Context, changes []Change) error
	// Close releases the store.
	Close() error
}

// ErrCorrupt is returned (wrapped) when a store's content cannot be read.
// The bridge refuses to start on it rather than treat the state as empty,
// unless told to reset it.
var ErrCorrupt = errors.New("checkpoint is corrupt")

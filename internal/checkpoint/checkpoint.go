// Package checkpoint keeps, per sink and rule, the view each sink has
// acknowledged: object key -> (uid, resourceVersion, entry time, namespace,
// name, labels), for every rule whatever its events, written after the sink
// acknowledged, in batches. Beside it, under PendingKey, the incarnations a
// sink may hold without having acknowledged them yet (intents: written
// durably before their first send).
//
// On restart (and leader take-over, reload) internal/view diffs each rule's
// current view against it, so changes made while the bridge was down (or
// events it had queued but not delivered) reach the sink, with kbreplay
// "checkpoint".
//
// What the store holds may lag what the sinks have, by the unflushed
// acknowledgements (then delivered again: at least once), but never by an
// incarnation a sink may hold: those are intents first.
package checkpoint

import (
	"cmp"
	"context"
	"errors"
	"slices"
)

// Entry is what a sink last received of one object under one rule.
type Entry struct {
	UID             string            `json:"uid"`
	ResourceVersion string            `json:"rv"` // "" in intents (and in acknowledged entries of old versions: read as intents)
	Namespace       string            `json:"ns,omitempty"`
	Name            string            `json:"name"`
	Labels          map[string]string `json:"labels,omitempty"`
	// Entered is when this incarnation entered the rule's view (unix nanos;
	// event.Entered): a request's for counts from it across restarts.
	Entered int64 `json:"entered,omitempty"`
	// Stamp is the incarnation's ids' stamp (event.Stamp) when it is not
	// Entered: replays of its transitions keep their ids.
	Stamp int64 `json:"stamp,omitempty"`
	// Pending lists, in an intent record (PendingKey), the incarnations a
	// sink may hold unacknowledged.
	Pending []Entry `json:"pending,omitempty"`
	// Leaving marks, in Pending, an incarnation whose deletion (the object
	// left the view but exists) may have been sent unacknowledged: the sink
	// may no longer hold it.
	Leaving bool `json:"leaving,omitempty"`
	// Inline marks, in the recorder's memory only, an intent written as the
	// key's own entry (it had none), not in a PendingKey record.
	Inline bool `json:"-"`
}

// IDStamp is the stamp of the incarnation's ids: Stamp, or Entered.
func (e *Entry) IDStamp() int64 {
	if e.Stamp != 0 {
		return e.Stamp
	}
	return e.Entered
}

// PendingKey is the store key of the intent record of an object key.
// Object keys never start with a NUL byte.
func PendingKey(key string) string { return "\x00" + key }

// Slot is what a store holds of one object key of a sink's rule.
type Slot struct {
	Acked   *Entry  // nil: not acknowledged in the view
	Pending []Entry // incarnations sent (or about to be) but not acknowledged
}

// LoadView reads the acknowledged view of a sink's rule with its intents.
// An acknowledged entry without resourceVersion (written by an older
// version as an intent) counts as pending.
func LoadView(ctx context.Context, s Store, sink, rule string) (map[string]*Slot, error) {
	raw, err := s.Load(ctx, sink, rule)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Slot, len(raw))
	slot := func(k string) *Slot {
		if sl := out[k]; sl != nil {
			return sl
		}
		sl := &Slot{}
		out[k] = sl
		return sl
	}
	for k, e := range raw {
		switch {
		case len(k) > 0 && k[0] == 0:
			sl := slot(k[1:])
			sl.Pending = append(sl.Pending, e.Pending...)
		case e.ResourceVersion == "":
			sl := slot(k)
			sl.Pending = append(sl.Pending, e)
		default:
			e := e
			slot(k).Acked = &e
		}
	}
	for _, sl := range out { // an inline intent may also be listed in the pending record
		sl.Pending = slices.CompactFunc(slices.SortedStableFunc(slices.Values(sl.Pending), func(a, b Entry) int {
			return cmp.Or(cmp.Compare(a.UID, b.UID), cmp.Compare(a.Entered, b.Entered), cmp.Compare(a.IDStamp(), b.IDStamp()))
		}), func(a, b Entry) bool {
			return a.UID == b.UID && a.Entered == b.Entered && a.IDStamp() == b.IDStamp() && a.Leaving == b.Leaving
		})
	}
	return out, nil
}

// Change is one update of a view: Entry nil deletes the key, only while
// it holds IfUID when that is set (a deletion of one incarnation must not
// erase another one's entry).
type Change struct {
	Sink, Rule, Key string
	Entry           *Entry
	IfUID           string
}

// Store persists delivered views.
type Store interface {
	// Load returns the delivered view of a sink's rule, keyed by object key
	// (namespace/name, or name for cluster-scoped objects).
	Load(ctx context.Context, sink, rule string) (map[string]Entry, error)
	// Apply records changes in order (the file store in one transaction;
	// NATS KV key by key, so a crash may leave a prefix applied).
	Apply(ctx context.Context, changes []Change) error
	// Close releases the store.
	Close() error
}

// ErrCorrupt is returned (wrapped) when a store's content cannot be read.
// The bridge refuses to start on it rather than treat the state as empty,
// unless told to reset it.
var ErrCorrupt = errors.New("checkpoint is corrupt")

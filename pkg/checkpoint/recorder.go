package checkpoint

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// Recorder batches acknowledged events into a Store: it keeps the latest
// change per (sink, rule, key) and flushes every interval, so checkpoint
// lag is bounded by the interval.
//
// Before an object the checkpoint does not know is first sent to a sink,
// Intend writes it durably with an empty resourceVersion ("may have been
// delivered"): should the bridge die before its acknowledgement reaches the
// checkpoint, and the object be deleted meanwhile, the restart still knows
// to deliver the deletion; an entry without resourceVersion is replayed as
// added if the object still exists.
type Recorder struct {
	store    Store
	interval time.Duration
	logger   *slog.Logger

	flushMu sync.Mutex // one flush at a time, so that newer changes land last
	mu      sync.Mutex
	pending map[changeKey]*Entry
	order   []changeKey
	known   map[changeKey]bool // keys the store holds (or will, once flushed)

	stop chan struct{}
	done chan struct{}
}

type changeKey struct{ sink, rule, key string }

// NewRecorder returns a recorder flushing into store every interval; Run starts it.
func NewRecorder(store Store, interval time.Duration, logger *slog.Logger) *Recorder {
	return &Recorder{store: store, interval: interval, logger: logger, pending: map[changeKey]*Entry{}, known: map[changeKey]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}
}

// Known marks keys the store already holds (from the reconciliation).
func (r *Recorder) Known(sink, rule string, keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		r.known[changeKey{sink, rule, k}] = true
	}
}

// Intend durably records, before a batch is sent, the objects in it the
// checkpoint does not know yet. An error means the batch must not be sent.
func (r *Recorder) Intend(ctx context.Context, sink string, events []*event.Event) error {
	r.mu.Lock()
	added := false
	for _, e := range events {
		if e.Change == event.Deleted {
			continue
		}
		k := changeKey{sink, e.Rule, ObjectKey(e.Namespace, e.Name)}
		if r.known[k] {
			continue
		}
		if _, ok := r.pending[k]; !ok {
			r.order = append(r.order, k)
		}
		r.pending[k] = &Entry{UID: e.UID, Namespace: e.Namespace, Name: e.Name, Labels: e.Object().GetLabels()}
		r.known[k] = true
		added = true
	}
	r.mu.Unlock()
	if !added {
		return nil
	}
	return r.Flush(ctx)
}

// Acked records events a sink acknowledged. Safe for concurrent use.
func (r *Recorder) Acked(sink string, events []*event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range events {
		k := changeKey{sink, e.Rule, ObjectKey(e.Namespace, e.Name)}
		if _, ok := r.pending[k]; !ok {
			r.order = append(r.order, k)
		}
		if e.Change == event.Deleted {
			r.pending[k] = nil
			delete(r.known, k)
			continue
		}
		r.known[k] = true
		o := e.Object()
		r.pending[k] = &Entry{UID: e.UID, ResourceVersion: o.GetResourceVersion(), Namespace: e.Namespace, Name: e.Name, Labels: o.GetLabels()}
	}
}

// Lag is how many acknowledged changes wait to be written.
func (r *Recorder) Lag() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// ObjectKey is the key of an object in a view.
func ObjectKey(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Run flushes every interval until Stop.
func (r *Recorder) Run() {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			r.Flush(context.Background())
		case <-r.stop:
			return
		}
	}
}

// Stop ends Run and flushes what is pending.
func (r *Recorder) Stop(ctx context.Context) error {
	close(r.stop)
	<-r.done
	return r.Flush(ctx)
}

// Abandon ends Run and drops what is pending, unwritten: another replica
// owns the checkpoint now (a lost lease).
func (r *Recorder) Abandon() {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	r.pending, r.order = map[changeKey]*Entry{}, nil
	r.mu.Unlock()
}

// Flush writes pending changes. On failure they stay pending for the next flush.
func (r *Recorder) Flush(ctx context.Context) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	if len(r.order) == 0 {
		r.mu.Unlock()
		return nil
	}
	changes := make([]Change, 0, len(r.order))
	for _, k := range r.order {
		changes = append(changes, Change{Sink: k.sink, Rule: k.rule, Key: k.key, Entry: r.pending[k]})
	}
	r.pending, r.order = map[changeKey]*Entry{}, nil
	r.mu.Unlock()
	if err := r.store.Apply(ctx, changes); err != nil {
		r.logger.Error("writing the checkpoint failed; will retry", "changes", len(changes), "error", err)
		r.mu.Lock()
		for _, c := range changes { // keep newer changes that arrived meanwhile
			k := changeKey{c.Sink, c.Rule, c.Key}
			if _, newer := r.pending[k]; !newer {
				r.pending[k] = c.Entry
				r.order = append(r.order, k)
			}
		}
		r.mu.Unlock()
		return err
	}
	return nil
}

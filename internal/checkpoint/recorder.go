package checkpoint

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// Recorder writes what sinks acknowledged into a Store, in batches: it keeps
// the latest change per store key and flushes every interval, so checkpoint
// lag is bounded by the interval.
//
// Before an incarnation of an object (uid, stamp) that the store does
// not hold durably is first sent to a sink, Intend writes it durably as
// pending: should the bridge die before the acknowledgement reaches the
// store, and the object be deleted or replaced meanwhile, the restart still
// knows the sink may hold it and delivers its deletion. An incarnation
// counts as durable only once the write that holds it succeeded.
type Recorder struct {
	store    Store
	interval time.Duration
	logger   *slog.Logger
	// fencing is what every write runs under (Fencing); nil: unfenced.
	fencing Fencing

	flushMu sync.Mutex // one flush at a time, so that newer changes land last
	mu      sync.Mutex
	changes map[changeKey]change // unwritten: the latest value per store key
	order   []changeKey
	durable map[changeKey]uint64  // object key -> incarnation acknowledged in the store
	maybe   map[changeKey][]Entry // object key -> pending incarnations (as written or being written)
	// queued counts the changes queued; written is what queued counted
	// when the last successful write took what was pending: every change
	// counted up to it is durable.
	queued, written uint64
	// abandoned: another replica owns the checkpoint; nothing is written
	// any more, so no intent becomes durable.
	abandoned bool

	stop chan struct{}
	done chan struct{}
}

type changeKey struct{ sink, rule, key string }

// change is an unwritten value: entry nil deletes (only a key holding
// ifUID, when set).
type change struct {
	entry *Entry
	ifUID string
}

// Fencing is the ownership a recorder writes under (shards.Scope). Fence
// is checked before every write: while it fails (this replica may no
// longer own what it records) nothing is written, so a replica that was
// paused past its lease never overwrites its successor's checkpoint. Hold
// bounds each write by the holding its fence check passed under: a write
// is cut short when that holding lapses, so it cannot land after another
// replica took over.
type Fencing interface {
	Fence() error
	Hold(ctx context.Context) (context.Context, context.CancelFunc)
}

var incSeed = maphash.MakeSeed()

// incarnation names an incarnation by what its ids are made of: its uid
// and stamp (event.Stamp).
func incarnation(uid string, stamp int64) uint64 {
	var h maphash.Hash
	h.SetSeed(incSeed)
	h.WriteString(uid)
	var b [8]byte
	for i := range b {
		b[i] = byte(stamp >> (8 * i))
	}
	h.Write(b[:])
	return h.Sum64() | 1 // never 0: 0 means none
}

// NewRecorder returns a recorder flushing into store every interval, under
// fencing (nil: unfenced, a replica running alone); Run starts it.
func NewRecorder(store Store, interval time.Duration, logger *slog.Logger, fencing Fencing) *Recorder {
	return &Recorder{store: store, interval: interval, logger: logger, fencing: fencing,
		changes: map[changeKey]change{}, durable: map[changeKey]uint64{}, maybe: map[changeKey][]Entry{},
		stop: make(chan struct{}), done: make(chan struct{})}
}

// Known tells the recorder what the store holds of a sink's rule (as
// LoadView read it).
func (r *Recorder) Known(sink, rule string, view map[string]*Slot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, sl := range view {
		ck := changeKey{sink, rule, k}
		if sl.Acked != nil {
			r.durable[ck] = incarnation(sl.Acked.UID, sl.Acked.IDStamp())
		}
		if len(sl.Pending) > 0 {
			r.maybe[ck] = slices.Clone(sl.Pending)
		}
	}
}

// Intend durably records, before a batch is sent, the incarnations in it
// the store does not hold yet. An error means the batch must not be sent.
// Calls for different objects may overlap (they share writes); an
// object's (event.Key's) events are never in two batches at once (a
// delivery's claims), so its intents and acknowledgements come in its order.
func (r *Recorder) Intend(ctx context.Context, sink string, events []*event.Event) error {
	r.mu.Lock()
	if r.abandoned {
		r.mu.Unlock()
		return errAbandoned
	}
	var grown map[changeKey][]Entry
	for _, e := range events {
		// Entries, quiet ones too (a rule that sends only deletions must
		// still learn, after a crash, of an object it was about to record),
		// and sent deletions of objects that still exist (they may come back
		// unchanged: the restart must not take them for still held).
		leaving := e.Change == event.Deleted
		if leaving && (e.Quiet || e.Reason != event.ReasonUnmatched) {
			continue
		}
		k := changeKey{sink, e.Rule(), e.Subject} // the object key (ObjectKey)
		inc := incarnation(e.UID(), e.Stamp)
		if !leaving && r.durable[k] == inc {
			continue
		}
		list, ok := grown[k]
		if !ok {
			list = r.maybe[k]
		}
		if slices.ContainsFunc(list, func(p Entry) bool { return p.Leaving == leaving && incarnation(p.UID, p.IDStamp()) == inc }) {
			continue
		}
		if grown == nil {
			grown = map[changeKey][]Entry{}
		}
		grown[k] = append(slices.Clip(list), Entry{UID: string(e.Object().GetUID()), Namespace: e.Namespace(), Name: e.Name(), Entered: e.Entered, Stamp: ownStamp(e), Labels: e.Object().GetLabels(), Leaving: leaving})
	}
	for k, list := range grown {
		// A key that holds nothing takes its one intent inline (an entry
		// without resourceVersion): the acknowledgement then overwrites one
		// key instead of writing one and deleting another.
		if r.durable[k] == 0 && len(r.maybe[k]) == 0 && len(list) == 1 && !list[0].Leaving {
			c, queued := r.changes[k]
			again := queued && c.entry != nil && c.entry.ResourceVersion == "" && // this intent, queued again after a failed write
				incarnation(c.entry.UID, c.entry.IDStamp()) == incarnation(list[0].UID, list[0].IDStamp())
			if !queued || again {
				list[0].Inline = true
				r.put(k, change{entry: &Entry{UID: list[0].UID, Namespace: list[0].Namespace, Name: list[0].Name, Labels: list[0].Labels, Entered: list[0].Entered, Stamp: list[0].Stamp}})
				continue
			}
		}
		r.put(changeKey{k.sink, k.rule, PendingKey(k.key)}, change{entry: &Entry{Pending: list}})
	}
	mine := r.queued
	r.mu.Unlock()
	if len(grown) == 0 {
		return nil
	}
	if err := r.flushThrough(ctx, mine); err != nil {
		return err
	}
	r.mu.Lock()
	for k, list := range grown {
		r.maybe[k] = list
	}
	r.mu.Unlock()
	return nil
}

// Acked records events a sink acknowledged (or that were handled without
// being sent: quiet transitions, dead-lettered events), in order. Safe for
// concurrent use.
func (r *Recorder) Acked(sink string, events []*event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var resolved map[changeKey][]string // uids this batch settled, per key
	for _, e := range events {
		k := changeKey{sink, e.Rule(), e.Subject} // the object key (ObjectKey)
		if e.Change == event.Deleted {
			r.put(k, change{ifUID: e.UID()})
		} else {
			o := e.Object()
			r.put(k, change{entry: &Entry{UID: string(o.GetUID()), ResourceVersion: o.GetResourceVersion(), Namespace: e.Namespace(), Name: e.Name(), Labels: o.GetLabels(), Entered: e.Entered, Stamp: ownStamp(e)}})
		}
		if len(r.maybe[k]) > 0 {
			if resolved == nil {
				resolved = map[changeKey][]string{}
			}
			resolved[k] = append(resolved[k], e.UID())
		}
	}
	// Pending incarnations of the uids this batch delivered or deleted are
	// settled: consumers key by uid, and the batch told them its last state.
	for k, uids := range resolved {
		list := slices.DeleteFunc(slices.Clone(r.maybe[k]), func(p Entry) bool { return slices.Contains(uids, p.UID) })
		if len(list) == len(r.maybe[k]) {
			continue
		}
		// The incarnation the key now holds stays durable without a new
		// intent: the store keeps its intent until the write that replaces it
		// with the acknowledged entry (queued before the intent's removal).
		if c := r.changes[k]; c.entry != nil && slices.ContainsFunc(r.maybe[k], func(p Entry) bool {
			return !p.Leaving && incarnation(p.UID, p.IDStamp()) == incarnation(c.entry.UID, c.entry.IDStamp())
		}) {
			r.durable[k] = incarnation(c.entry.UID, c.entry.IDStamp())
		}
		pk := changeKey{k.sink, k.rule, PendingKey(k.key)}
		switch {
		case len(list) == 0 && len(r.maybe[k]) == 1 && r.maybe[k][0].Inline:
			delete(r.maybe, k) // the key's own write replaced it
		case len(list) == 0:
			delete(r.maybe, k)
			r.put(pk, change{})
		default:
			r.maybe[k] = list
			r.put(pk, change{entry: &Entry{Pending: list}})
		}
	}
}

// ownStamp is e's stamp as an Entry stores it: 0 when it is the entry
// time (most incarnations), so that the checkpoint stays as small.
func ownStamp(e *event.Event) int64 {
	if e.Stamp == e.Entered {
		return 0
	}
	return e.Stamp
}

// put queues a write; the caller holds mu.
func (r *Recorder) put(k changeKey, c change) {
	if _, ok := r.changes[k]; !ok {
		r.order = append(r.order, k)
	}
	r.changes[k] = c
	r.queued++
}

// Lag is how many acknowledged changes wait to be written.
func (r *Recorder) Lag() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.changes)
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
	r.changes, r.order, r.abandoned = map[changeKey]change{}, nil, true
	r.mu.Unlock()
}

// errAbandoned is every write's error once the recorder was abandoned: an
// intent queued before was dropped unwritten, and its batch must not go.
var errAbandoned = errors.New("checkpoint abandoned: another replica owns it")

// Flush writes pending changes, in order, in one Apply. On failure they stay
// pending for the next flush.
func (r *Recorder) Flush(ctx context.Context) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	return r.flush(ctx)
}

// flushThrough returns once every change queued up to the count upTo is
// durable: at once when a write that took them succeeded meanwhile, else
// by writing what is pending. So the intents of batches sent at once share
// one write (a group commit): the first to get its turn writes them all,
// the others find theirs written; acknowledgements queued meanwhile do not
// make each of them write again.
func (r *Recorder) flushThrough(ctx context.Context, upTo uint64) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	done := r.written >= upTo
	r.mu.Unlock()
	if done {
		return nil
	}
	return r.flush(ctx)
}

// flush is Flush; the caller holds flushMu.
func (r *Recorder) flush(ctx context.Context) error {
	r.mu.Lock()
	if r.abandoned {
		r.mu.Unlock()
		return errAbandoned
	}
	if len(r.order) == 0 {
		r.mu.Unlock()
		return nil
	}
	upTo := r.queued
	changes := make([]Change, 0, len(r.order))
	for _, k := range r.order {
		c := r.changes[k]
		changes = append(changes, Change{Sink: k.sink, Rule: k.rule, Key: k.key, Entry: c.entry, IfUID: c.ifUID})
	}
	r.changes, r.order = map[changeKey]change{}, nil
	r.mu.Unlock()
	err := error(nil)
	if r.fencing != nil {
		var release context.CancelFunc
		ctx, release = r.fencing.Hold(ctx)
		defer release()
		err = r.fencing.Fence()
	}
	if err == nil {
		err = r.store.Apply(ctx, changes)
	}
	if err != nil {
		r.logger.Error("writing the checkpoint failed; will retry", "changes", len(changes), "error", err)
		r.mu.Lock()
		var newer []changeKey
		for _, c := range changes { // keep newer changes that arrived meanwhile
			k := changeKey{c.Sink, c.Rule, c.Key}
			if _, ok := r.changes[k]; !ok {
				r.changes[k] = change{entry: c.Entry, ifUID: c.IfUID}
				newer = append(newer, k)
			}
		}
		r.order = append(newer, r.order...) // the failed ones keep their place before newer ones
		r.mu.Unlock()
		return err
	}
	r.mu.Lock()
	r.written = upTo
	for _, c := range changes {
		if len(c.Key) > 0 && c.Key[0] == 0 {
			continue
		}
		k := changeKey{c.Sink, c.Rule, c.Key}
		if c.Entry == nil {
			delete(r.durable, k) // conditional or not: at worst an intent more
		} else {
			r.durable[k] = incarnation(c.Entry.UID, c.Entry.IDStamp())
		}
	}
	r.mu.Unlock()
	return nil
}

// Forget drops what the recorder knows of the (sink, rule) pairs keep
// rejects (a reload removed them), so its memory stays bounded by the
// objects of the configured rules. Their store entries stay.
func (r *Recorder) Forget(keep func(sink, rule string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.durable {
		if !keep(k.sink, k.rule) {
			delete(r.durable, k)
		}
	}
	for k := range r.maybe {
		if !keep(k.sink, k.rule) {
			delete(r.maybe, k)
		}
	}
}

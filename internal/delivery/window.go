package delivery

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/internal/queue"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// The update window (sink updateWindow): a group whose change was just
// acknowledged waits it out parked, without events; its next events are
// folded into it and sent when the window ends.
//
// Per object (no key), the group is the object: the latest state wins, and
// an urgent event (an added, a deleted, a replay) ends the wait at once, so
// that a consumer applying events by uid misses none.
//
// Per key, the group is every object whose first event gave that key (or,
// for an object created again under the name of one deleted whose events
// the group may still hold, that one's group: one name is never out in two
// batches), and one message stands for them all: of what the window held,
// the latest event of an object still present (else the latest deletion)
// is sent; the others are quiet: acknowledged (recorded as delivered, in
// each object's order) but never sent. Nothing is urgent, so a key sends
// at most one message per window; nothing is dropped or held longer than
// one window. A consumer applying events by uid would miss the objects
// coalesced away: config validation allows a key only on a sink of
// messages for people.

// keyPrefix starts the queue group of a key: object keys never hold a NUL.
const keyPrefix = "\x00"

func isKeyed(group string) bool { return strings.HasPrefix(group, keyPrefix) }

// updateWindow is the groups waiting out the window. mu orders Offer's put
// and lookup against a throttle's take and insert, so that an urgent event
// is never left behind a window.
type updateWindow struct {
	length  time.Duration // 0: none
	key     func(*event.Event) (string, error)
	maxKeys int

	mu      sync.Mutex
	waiting map[string]*batch // by group
	keys    int               // of waiting, the keys
	// pinned is each object's group (by queue key), from its first event
	// to its deletion: an object never moves between groups, whose order
	// the queue keeps per group, even if its key changes.
	pinned map[string]string
	// left is, by event.Key (rule, namespace, name), the group of an
	// object whose deletion was offered: one created again under its name
	// joins that group while it may still hold the deleted one's events
	// (group), so that a sink never has events of one Key in two batches
	// at once (two groups' batches go in any order, and the checkpoint
	// records an object by its name). leftSweep is the size at which the
	// names of idle groups are dropped.
	left      map[string]string
	leftSweep int
	// overflow counts windows not opened for want of room (maxKeys),
	// keyErrors keys that failed (the object is then its own group).
	overflow, keyErrors uint64
	lastKeyErr          time.Time // logged at most every errLogEvery
}

// errLogEvery is how often an expression failing on events (a key, a
// mute's where) is logged at most.
const errLogEvery = 10 * time.Second

// set sets the window; key nil: per object.
func (w *updateWindow) set(cfg config.UpdateWindow, key func(*event.Event) (string, error)) {
	w.length = cfg.Every.D()
	if w.length == 0 {
		return
	}
	w.waiting = map[string]*batch{}
	if key != nil {
		w.key, w.maxKeys, w.pinned, w.left = key, cfg.KeysOrDefault(), map[string]string{}, map[string]string{}
	}
}

// group returns ev's queue group; mu is held.
func (d *Delivery) group(ev *event.Event) string {
	w := &d.window
	if w.key == nil {
		return ev.Key()
	}
	qk := ev.QueueKey()
	g, ok := w.pinned[qk]
	if !ok {
		if g, ok = w.left[ev.Key()]; ok {
			delete(w.left, ev.Key())
			ok = d.queue.Busy(g)
		}
	}
	if !ok {
		k, err := w.key(ev)
		if err == nil {
			g = keyPrefix + k
		} else {
			g = ev.Key()
			w.keyErrors++
			if now := d.clock.Now(); now.Sub(w.lastKeyErr) >= errLogEvery {
				w.lastKeyErr = now
				d.logger.Warn("updateWindow key failed; the object has a window of its own", "object", ev.Subject, "error", err, "failures", w.keyErrors)
			}
		}
		w.pinned[qk] = g
	}
	if ev.Change == event.Deleted {
		delete(w.pinned, qk)
		d.leave(ev.Key(), g)
	}
	return g
}

// leftSweepMin is the fewest names left that a sweep looks at.
const leftSweepMin = 1024

// leave remembers the group of an object deleted; mu is held. The names
// of groups that hold nothing any more are dropped once they have doubled
// since the last sweep: memory stays bounded by the objects whose events
// are queued, out or in a window.
func (d *Delivery) leave(name, g string) {
	w := &d.window
	w.left[name] = g
	if len(w.left) < w.leftSweep {
		return
	}
	for name, g := range w.left {
		if !d.queue.Busy(g) {
			delete(w.left, name)
		}
	}
	w.leftSweep = max(2*len(w.left), leftSweepMin)
}

// urgent says whether e ends an object's update window at once: only
// updates wait (and transitions the rule does not send).
func urgent(e *event.Event) bool { return !e.Quiet && (e.Change != event.Updated || e.Replay != "") }

// waits says whether a group whose events were all taken waits out the
// window: a key, once it sent a message; an object, unless the last
// change sent was its deletion.
func (w *updateWindow) waits(o object) bool {
	if w.length == 0 {
		return false
	}
	for i := len(o.events) - 1; i >= 0; i-- {
		if e := o.events[i]; !e.Quiet {
			return isKeyed(o.group) || e.Change != event.Deleted
		}
	}
	return false
}

// forget forgets b's window: it left the parking.
func (w *updateWindow) forget(b *batch) {
	w.mu.Lock()
	if w.waiting[b.throttled] == b {
		delete(w.waiting, b.throttled)
		if isKeyed(b.throttled) {
			w.keys--
		}
	}
	w.mu.Unlock()
	b.throttled = ""
}

// fold folds o's events as the queue does, each object's; a key's are
// then one message (oneMessage) when they are about to be sent (send):
// until then what a window holds keeps each object's own change, so that
// the message says "added" for an object added in the window.
func (d *Delivery) fold(o *object, send bool) {
	if !isKeyed(o.group) {
		o.events = d.counts.fold(o.events)
		return
	}
	if len(o.events) < 2 {
		return
	}
	// Each object's events together, in its order; objects ordered by
	// their last event.
	last := make(map[string]int, len(o.events))
	for i, e := range o.events {
		last[e.QueueKey()] = i
	}
	events := slices.Clone(o.events)
	slices.SortStableFunc(events, func(a, b *event.Event) int { return cmp.Compare(last[a.QueueKey()], last[b.QueueKey()]) })
	o.events = d.counts.fold(events)
	if send {
		d.oneMessage(o.events)
	}
}

// oneMessage makes a key's folded events (each object's together, objects
// by their last event) one message: the latest event to send of an object
// still present, else the latest deletion, is the one sent; the others
// become quiet (acknowledged, never sent).
func (d *Delivery) oneMessage(events []*event.Event) {
	gone := make(map[string]bool, len(events)) // by object: its last event is its deletion
	for i := len(events) - 1; i >= 0; i-- {
		if k := events[i].QueueKey(); !hasKey(gone, k) {
			gone[k] = events[i].Change == event.Deleted
		}
	}
	sent := -1
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		if e.Quiet {
			continue
		}
		if !gone[e.QueueKey()] {
			sent = i
			break
		}
		if sent < 0 {
			sent = i
		}
	}
	var quieted uint64
	for i, e := range events {
		if i != sent && !e.Quiet {
			events[i] = e.WithQuiet(true)
			quieted++
			d.logger.Debug("request withheld", "reason", "window", "event", e.ID, "change", string(e.Change), "subject", e.Subject, "into", events[sent].Subject)
		}
	}
	d.counts.windowed.Add(quieted)
}

// gather moves the events queued behind a throttled batch's group into
// it, folded, and reports whether one is urgent; window.mu is held.
func (d *Delivery) gather(b *batch, items []queue.Item[*event.Event]) (urgentNow bool) {
	o := &b.objects[0]
	items = d.queue.TakeFrom(o.claim, items[:0])
	if len(items) == 0 {
		return false
	}
	before := len(o.events)
	for _, it := range items {
		o.events = append(o.events, it.Value)
		urgentNow = urgentNow || urgent(it.Value)
	}
	d.fold(o, false)
	d.counts.inFlight.Add(int64(len(o.events) - before)) // the items left the queue for the batch
	b.prepared = d.hooks.BeforeSend == nil
	return urgentNow && !isKeyed(o.group)
}

// throttle parks the acknowledged groups for the update window, with the
// events queued behind them meanwhile; due at once if one of those is
// urgent. A key finding maxKeys windows open gets none: released, its
// next events go as they come.
func (d *Delivery) throttle(objects []object, now time.Time) {
	d.window.mu.Lock()
	defer d.window.mu.Unlock()
	var items []queue.Item[*event.Event]
	for _, o := range objects {
		if isKeyed(o.group) {
			if d.window.keys >= d.window.maxKeys {
				d.window.overflow++
				d.queue.Release(o.claim)
				continue
			}
			d.window.keys++
		}
		b := &batch{objects: []object{{claim: o.claim, group: o.group}}, prepared: true, throttled: o.group}
		due := now.Add(d.window.length)
		if d.gather(b, items) {
			due = now
		}
		d.window.waiting[b.throttled] = b
		d.parking.put(b, due)
	}
}

func hasKey(m map[string]bool, k string) bool { _, ok := m[k]; return ok }

// counts returns the windows not opened for want of room and the
// keys that failed.
func (w *updateWindow) counts() (overflow, keyErrors uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overflow, w.keyErrors
}

package delivery

import (
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/internal/queue"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// The update window (sink updateWindow): an object whose change was just
// acknowledged waits it out parked, without events; its next updates are
// folded into it (the latest state wins) and sent when the window ends, or
// at once when an urgent event arrives (Offer folds them in as they come).

// updateWindow is the objects waiting out the window, by event key. mu
// orders Offer's put and lookup against a throttle's take and insert, so
// that an urgent event is never left behind a window.
type updateWindow struct {
	length  time.Duration // 0: none
	mu      sync.Mutex
	waiting map[string]*batch
}

// set sets the window's length; 0: none.
func (w *updateWindow) set(length time.Duration) {
	w.length = length
	if length > 0 {
		w.waiting = map[string]*batch{}
	}
}

// urgent says whether e ends an update window at once: only updates wait
// (and transitions the rule does not send).
func urgent(e *event.Event) bool { return !e.Quiet && (e.Change != event.Updated || e.Replay != "") }

// waits says whether an object whose events were all taken waits out the
// window: its last change sent was not a deletion.
func (w *updateWindow) waits(o object) bool {
	if w.length == 0 {
		return false
	}
	for i := len(o.events) - 1; i >= 0; i-- {
		if e := o.events[i]; !e.Quiet {
			return e.Change != event.Deleted
		}
	}
	return false
}

// forget forgets b's window: it left the parking.
func (w *updateWindow) forget(b *batch) {
	w.mu.Lock()
	if w.waiting[b.throttled] == b {
		delete(w.waiting, b.throttled)
	}
	w.mu.Unlock()
	b.throttled = ""
}

// gather moves the events queued behind a throttled batch's object into
// it, folded (the latest state wins), and reports whether one is urgent;
// window.mu is held.
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
	o.events = d.counts.fold(o.events)
	d.counts.inFlight.Add(int64(len(o.events) - before)) // the items left the queue for the batch
	b.prepared = d.hooks.BeforeSend == nil
	return urgentNow
}

// throttle parks the acknowledged objects for the update window, with
// the events queued behind them meanwhile; due at once if one of those
// is urgent.
func (d *Delivery) throttle(objects []object, now time.Time) {
	d.window.mu.Lock()
	defer d.window.mu.Unlock()
	var items []queue.Item[*event.Event]
	for _, o := range objects {
		b := &batch{objects: []object{{claim: o.claim}}, prepared: true, throttled: o.events[0].Key()}
		due := now.Add(d.window.length)
		if d.gather(b, items) {
			due = now
		}
		d.window.waiting[b.throttled] = b
		d.parking.put(b, due)
	}
}

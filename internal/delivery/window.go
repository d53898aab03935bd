package delivery

import (
	"time"

	"github.com/kubebridge/kubebridge/internal/queue"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// The update window (sink updateWindow): an object whose change was just
// acknowledged waits it out parked, without events; its next updates are
// folded into it (the latest state wins) and sent when the window ends, or
// at once when an urgent event arrives (Offer folds them in as they come).

// urgent says whether e ends an update window at once: only updates wait
// (and transitions the rule does not send).
func urgent(e *event.Event) bool { return !e.Quiet && (e.Change != event.Updated || e.Replay != "") }

// hold moves the events queued behind a throttled batch's object into it,
// folded (the latest state wins), and reports whether one is urgent;
// windowMu is held.
func (d *Delivery) hold(b *batch, items []queue.Item[*event.Event]) (urgentNow bool) {
	o := &b.objects[0]
	items = d.queue.TakeFrom(o.hold, items[:0])
	if len(items) == 0 {
		return false
	}
	before := len(o.events)
	for _, it := range items {
		o.events = append(o.events, it.Value)
		urgentNow = urgentNow || urgent(it.Value)
	}
	var coalesced, cancelled uint64
	o.events, coalesced, cancelled = event.Fold(o.events)
	d.coalesced.Add(coalesced)
	d.cancelled.Add(cancelled)
	d.inFlight.Add(int64(len(o.events) - before)) // the items left the queue for the batch
	b.prepared = d.hooks.BeforeSend == nil
	return urgentNow
}

// throttle parks the acknowledged objects for the update window, with
// the events queued behind them meanwhile; due at once if one of those
// is urgent.
func (d *Delivery) throttle(objects []object, now time.Time) {
	d.windowMu.Lock()
	defer d.windowMu.Unlock()
	var items []queue.Item[*event.Event]
	for _, o := range objects {
		b := &batch{objects: []object{{hold: o.hold}}, prepared: true, throttled: o.events[0].Key()}
		due := now.Add(d.window)
		if d.hold(b, items) {
			due = now
		}
		d.throttled[b.throttled] = b
		d.parking.put(b, due)
	}
}

// unthrottle forgets b's window: it left the parking.
func (d *Delivery) unthrottle(b *batch) {
	d.windowMu.Lock()
	if d.throttled[b.throttled] == b {
		delete(d.throttled, b.throttled)
	}
	d.windowMu.Unlock()
	b.throttled = ""
}

// throttles says whether an object whose events were all taken waits out
// the window: its last change sent was not a deletion.
func (d *Delivery) throttles(o object) bool {
	if d.window == 0 || d.closing.Load() {
		return false
	}
	for i := len(o.events) - 1; i >= 0; i-- {
		if e := o.events[i]; !e.Quiet {
			return e.Change != event.Deleted
		}
	}
	return false
}

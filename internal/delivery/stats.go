package delivery

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubebridge/kubebridge/internal/queue"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// Stats are a delivery's counts.
type Stats struct {
	Delivered, Failed, Retried, DeadLettered uint64
	Queue                                    queue.Stats // Coalesced and Cancelled include what parked objects folded
	Pending                                  int         // queued, in flight or parked
	Capacity                                 int
	Parked                                   int           // objects parked (failed, waiting for their retry)
	OldestParked                             time.Duration // how long the oldest parked object has waited
	Throttled                                int           // objects (or keys) waiting out the update window (acknowledged; their next updates held)
	Held                                     int           // events a mute holds now (included in Pending)
	Muted                                    uint64        // events a mute ever held
	MuteWhereErrors                          uint64        // events a mute's where failed on (held)
	Failing                                  bool          // the destination fails as a whole: probed one batch at a time
	DestinationErrors                        map[string]uint64
	Window                                   WindowStats // an updateWindow key's counts
}

// WindowStats count what an updateWindow key did.
type WindowStats struct {
	// Coalesced counts events coalesced into another object's message
	// (acknowledged, never sent), Overflow keys sent without a window
	// (maxKeys were waiting), KeyErrors objects whose key failed (a
	// window of their own).
	Coalesced, Overflow, KeyErrors uint64
}

// counters are what a delivery counts as it goes; Stats reads them.
type counters struct {
	delivered, failed, retried, deadLettered atomic.Uint64
	coalesced, cancelled                     atomic.Uint64 // folded into a parked object's retry
	windowed                                 atomic.Uint64 // coalesced into a key's message (updateWindow.key)
	inFlight                                 atomic.Int64  // events taken from the queue, not yet settled (parked included)

	mu       sync.Mutex
	destErrs map[string]uint64 // failed attempts by Destination reason
}

// destination counts failed attempts by their Destination reasons.
func (c *counters) destination(reasons ...string) {
	if len(reasons) == 0 {
		return
	}
	c.mu.Lock()
	for _, r := range reasons {
		c.destErrs[r]++
	}
	c.mu.Unlock()
}

// fold folds an object's events (event.Fold), counting what merged and
// what cancelled out as the queue counts its own.
func (c *counters) fold(events []*event.Event) []*event.Event {
	events, coalesced, cancelled := event.Fold(events)
	c.coalesced.Add(coalesced)
	c.cancelled.Add(cancelled)
	return events
}

// Stats returns the delivery's counts.
func (d *Delivery) Stats() Stats {
	parked, oldest, throttled := d.parking.stats(d.clock.Now())
	c := &d.counts
	c.mu.Lock()
	dest := make(map[string]uint64, len(c.destErrs))
	for k, v := range c.destErrs {
		dest[k] = v
	}
	c.mu.Unlock()
	overflow, keyErrors := d.window.counts()
	q := d.queue.Stats()
	q.Coalesced += c.coalesced.Load()
	q.Cancelled += c.cancelled.Load()
	return Stats{Delivered: c.delivered.Load(), Failed: c.failed.Load(), Retried: c.retried.Load(), DeadLettered: c.deadLettered.Load(),
		Pending: d.Pending(), Queue: q, Capacity: d.queue.Capacity(),
		Parked: parked, OldestParked: oldest, Throttled: throttled, Window: WindowStats{Coalesced: c.windowed.Load(), Overflow: overflow, KeyErrors: keyErrors}, Failing: d.gate.isFailing(), DestinationErrors: dest,
		Held: d.held(), Muted: d.muted(), MuteWhereErrors: d.muteWhereErrors()}
}

// muteWhereErrors counts the events a mute's where failed on.
func (d *Delivery) muteWhereErrors() uint64 {
	if d.mute == nil {
		return 0
	}
	return d.mute.whereErrors.Load()
}

// muted counts the events a mute ever held.
func (d *Delivery) muted() uint64 {
	if d.mute == nil {
		return 0
	}
	return d.mute.total.Load()
}

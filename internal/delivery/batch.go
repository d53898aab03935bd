package delivery

import (
	"time"

	"github.com/kubebridge/kubebridge/internal/queue"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// object is one queue group's share of a batch (an object's, or a window
// key's objects'): its events, in order, and the queue's claim on the
// group while they are out.
type object struct {
	events []*event.Event
	claim  queue.Claim[*event.Event]
	group  string // its queue group: the object's key, or its window key's
}

// batch is what one attempt sends: whole objects. A batch that failed is
// parked, and keeps what its retries need.
type batch struct {
	objects  []object
	prepared bool      // BeforeSend took its events
	failures int       // attempts that reached the destination and failed
	since    time.Time // first such failure, less the time spent not reaching it (maxElapsed)
	parkedAt time.Time // when its objects were first parked
	refused  bool      // refused permanently (no dead-letter to take it): retried at maxInterval
	wide     bool      // failed as the destination as a whole does: the next probe, whenever due
	err      error     // the last failure
	// throttled is the object's key while it waits out the update window
	// (acknowledged; what it holds arrived since).
	throttled string
	slot      int // its index in the parking's heap, while parked
}

func (b *batch) events() []*event.Event {
	if len(b.objects) == 1 {
		return b.objects[0].events
	}
	out := make([]*event.Event, 0, b.size())
	for _, o := range b.objects {
		out = append(out, o.events...)
	}
	return out
}

func (b *batch) size() (n int) {
	for _, o := range b.objects {
		n += len(o.events)
	}
	return n
}

// split halves a batch of several objects; each half keeps its history.
func (b *batch) split() (*batch, *batch) {
	h := len(b.objects) / 2
	x, y := *b, *b
	x.objects = b.objects[:h:h]
	y.objects = b.objects[h:]
	return &x, &y
}

package delivery

import (
	"maps"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// The counters count what folding merged and cancelled as the queue
// does, and failed attempts by Destination reason.
func TestCounters(t *testing.T) {
	c := counters{destErrs: map[string]uint64{}}
	out := c.fold([]*event.Event{freshAdded("a", "1"), ev("a", "2", event.Updated), ev("a", "3", event.Updated), freshAdded("b", "1"), ev("b", "2", event.Deleted)})
	if len(out) != 1 || c.coalesced.Load() != 2 || c.cancelled.Load() != 2 {
		t.Errorf("fold: %d events, coalesced %d, cancelled %d; want 1, 2, 2", len(out), c.coalesced.Load(), c.cancelled.Load())
	}
	c.destination("not_found", "forbidden", "not_found")
	c.destination()
	if want := map[string]uint64{"not_found": 2, "forbidden": 1}; !maps.Equal(c.destErrs, want) {
		t.Errorf("destination errors %v, want %v", c.destErrs, want)
	}
}

// An object waits out the window after a change it sent, not after a
// deletion (quiet events aside), and never without a window.
func TestUpdateWindowWaits(t *testing.T) {
	var w updateWindow
	w.set(config.UpdateWindow{Every: config.Duration(time.Second)}, nil)
	obj := func(evs ...*event.Event) object { return object{events: evs} }
	if !w.waits(obj(ev("a", "1", event.Added), ev("a", "2", event.Deleted).WithQuiet(true))) {
		t.Error("an object whose last change sent was an added does not wait")
	}
	if w.waits(obj(ev("a", "1", event.Updated), ev("a", "2", event.Deleted))) {
		t.Error("a deleted object waits out the window")
	}
	var none updateWindow
	none.set(config.UpdateWindow{}, nil)
	if none.waits(obj(ev("a", "1", event.Updated))) {
		t.Error("an object waits without a window")
	}
}

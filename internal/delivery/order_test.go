package delivery

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// batches is a sink that records each Send's events (name@version) and
// fails, once each, the events fail names, retryably.
type batches struct {
	mu      sync.Mutex
	fail    map[string]bool
	ordered bool
	sends   [][]string
	took    []string
}

func (s *batches) Send(_ context.Context, evs []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sent []string
	errs := make([]error, len(evs))
	for i, e := range evs {
		id := e.Name() + "@" + e.Object().GetResourceVersion()
		sent = append(sent, id)
		if s.fail[id] {
			delete(s.fail, id)
			errs[i] = errors.New("500")
			continue
		}
		s.took = append(s.took, id)
	}
	s.sends = append(s.sends, sent)
	return sinks.Outcome(errs)
}
func (s *batches) Close(context.Context) error { return nil }
func (s *batches) Ordered() bool               { return s.ordered }

func (s *batches) record() (sends [][]string, took []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sends), slices.Clone(s.took)
}

// A batch holds at most one event of each object: an object's next event
// is sent once the destination took the one before it, and not while that
// one is to be retried; other objects' events go on meanwhile.
func TestBatchHoldsOneEventOfEachObject(t *testing.T) {
	s := &batches{fail: map[string]bool{"a@2": true}}
	d := New(Options{Config: sinkConfig(), Sink: s})
	for _, e := range []*event.Event{ev("a", "1", event.Updated), ev("a", "2", event.Updated), ev("b", "1", event.Updated), ev("a", "3", event.Updated), ev("b", "2", event.Updated)} {
		d.Offer(e)
	}
	stop := run(t, d)
	defer stop()
	waitFor(t, func() bool { return d.Pending() == 0 })
	sends, took := s.record()
	for _, send := range sends {
		seen := map[string]bool{}
		for _, id := range send {
			name := id[:1]
			if seen[name] {
				t.Errorf("a Send with two events of %s: %v", name, send)
			}
			seen[name] = true
		}
	}
	if want := []string{"a@1", "b@1", "b@2", "a@2", "a@3"}; !slices.Equal(took, want) {
		t.Errorf("took %v, want %v (sends %v)", took, want, sends)
	}
	if i := slices.IndexFunc(sends, func(send []string) bool { return slices.Contains(send, "a@3") }); i >= 0 && slices.ContainsFunc(sends[i:], func(send []string) bool { return slices.Contains(send, "a@2") && !slices.Contains(send, "a@3") }) {
		t.Errorf("a@3 sent before a@2 was taken: %v", sends)
	}
}

// An Ordered sink gets an object's events together, in order.
func TestOrderedSinkGetsAnObjectsEventsTogether(t *testing.T) {
	s := &batches{ordered: true}
	d := New(Options{Config: sinkConfig(), Sink: s})
	for _, e := range []*event.Event{ev("a", "1", event.Updated), ev("a", "2", event.Updated), ev("b", "1", event.Updated)} {
		d.Offer(e)
	}
	stop := run(t, d)
	defer stop()
	waitFor(t, func() bool { return d.Pending() == 0 })
	if sends, _ := s.record(); len(sends) != 1 || !slices.Equal(sends[0], []string{"a@1", "a@2", "b@1"}) {
		t.Errorf("sends %v, want one with a@1, a@2, b@1", sends)
	}
}

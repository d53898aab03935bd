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

// refusing is a sink that refuses some events for good: one by one
// (Outcome) or, when whole, any batch holding one as a whole.
type refusing struct {
	mu    sync.Mutex
	bad   map[string]bool
	whole bool
	took  []string
}

func id(e *event.Event) string { return e.Name() + "@" + e.Object().GetResourceVersion() }

func (s *refusing) Send(_ context.Context, evs []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(evs))
	for i, e := range evs {
		if s.bad[id(e)] {
			if s.whole {
				return sinks.Permanent(errors.New("refused"))
			}
			errs[i] = sinks.Permanent(errors.New("too large"))
		}
	}
	for i, e := range evs {
		if errs[i] == nil {
			s.took = append(s.took, id(e))
		}
	}
	return sinks.Outcome(errs)
}

func (s *refusing) Close(context.Context) error { return nil }

func (s *refusing) taken() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.took...)
}

type letters struct {
	mu  sync.Mutex
	got []string
}

func (l *letters) Put(_ context.Context, _ string, evs []*event.Event, _ error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		l.got = append(l.got, id(e))
	}
	return nil
}

func (l *letters) letters() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// An object's first event refused for good, alone in its turn: only it
// goes to the dead-letter; the object's later events reach the
// destination, so the consumer ends with its last state.
func TestARefusedEventDoesNotTakeTheObjectsLaterOnes(t *testing.T) {
	s, dl := &refusing{bad: map[string]bool{"a@1": true}}, &letters{}
	d := New(Options{Config: sinkConfig(), Sink: s, DeadLetter: dl})
	for _, rv := range []string{"1", "2", "3"} {
		d.Offer(ev("a", rv, event.Updated))
	}
	stop := run(t, d)
	defer stop()
	waitFor(t, func() bool { return slices.Contains(s.taken(), "a@3") })
	if got := dl.letters(); !slices.Equal(got, []string{"a@1"}) {
		t.Errorf("dead-lettered %v, want [a@1]", got)
	}
	if got := s.taken(); !slices.Equal(got, []string{"a@2", "a@3"}) {
		t.Errorf("took %v, want [a@2 a@3]", got)
	}
}

// A later turn refused as a whole for good: none of it is refused for
// that; the next attempt finds the event that caused it, alone.
func TestALaterTurnRefusedAsAWholeFindsItsCause(t *testing.T) {
	s, dl := &refusing{bad: map[string]bool{"b@2": true}, whole: true}, &letters{}
	d := New(Options{Config: sinkConfig(), Sink: s, DeadLetter: dl})
	for _, e := range []*event.Event{ev("a", "1", event.Updated), ev("a", "2", event.Updated), ev("b", "1", event.Updated), ev("b", "2", event.Updated)} {
		d.Offer(e)
	}
	stop := run(t, d)
	defer stop()
	waitFor(t, func() bool { return slices.Contains(s.taken(), "a@2") && len(dl.letters()) > 0 })
	if got := dl.letters(); !slices.Equal(got, []string{"b@2"}) {
		t.Errorf("dead-lettered %v, want [b@2]", got)
	}
}

package delivery

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// sent records what a sink was sent: "<name> <change> <rv>[ replay]".
type sent struct {
	mu  sync.Mutex
	got []string
}

func (s *sent) Send(_ context.Context, evs []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range evs {
		line := fmt.Sprintf("%s %s %s", e.Object().GetName(), e.Change, e.Object().GetResourceVersion())
		if e.Replay != "" {
			line += " replay"
		}
		s.got = append(s.got, line)
	}
	return nil
}
func (s *sent) Close(context.Context) error { return nil }

func (s *sent) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

func (s *sent) has(line string) func() bool {
	return func() bool { return slices.Contains(s.lines(), line) }
}

func replayOf(e *event.Event) *event.Event {
	return event.Build(e.RuleInfo(), event.Transition{Change: event.Updated, Object: e.Object(), Time: time.Now(), Replay: event.ReplayResync})
}

// With updateWindow, an object's updates after a sent change wait out the
// window and coalesce (the latest state is sent, once); other objects are
// not held; an added, a deleted or a replay is sent at once, never
// dropped; every taken event is acknowledged, in order; a drain does not
// wait out the windows.
func TestUpdateWindow(t *testing.T) {
	const window = 2 * time.Second
	cfg := sinkConfig()
	cfg.UpdateWindow = config.UpdateWindow{Every: config.Duration(window)}
	sink := &sent{}
	var ackMu sync.Mutex
	var acked []string
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		ackMu.Lock()
		defer ackMu.Unlock()
		for _, e := range evs {
			acked = append(acked, e.Object().GetName()+" "+e.Object().GetResourceVersion())
		}
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()

	d.Offer(ev("a", "1", event.Added))
	waitFor(t, sink.has("a added 1"))
	for _, rv := range []string{"2", "3", "4"} {
		d.Offer(ev("a", rv, event.Updated))
	}
	d.Offer(ev("b", "1", event.Added)) // another object: not held by a's window
	waitFor(t, sink.has("b added 1"))
	waitFor(t, func() bool { return d.Stats().Throttled == 2 }) // b's acknowledgement follows its send
	if s := d.Stats(); s.Throttled != 2 || s.Parked != 0 || s.Pending != 1 {
		t.Errorf("in the window: throttled %d, parked %d, pending %d; want 2, 0, 1 (a's updates folded)", s.Throttled, s.Parked, s.Pending)
	}
	if got := sink.lines(); len(got) != 2 {
		t.Fatalf("updates went out inside the window: %q", got)
	}
	clk.Step(window)
	waitFor(t, sink.has("a updated 4"))
	if got := sink.lines(); slices.Contains(got, "a updated 2") || slices.Contains(got, "a updated 3") {
		t.Errorf("updates in between were sent: %q", got)
	}

	// a is in its window again: an update waits, a deletion does not (and
	// takes the update's place): they go with no time passing.
	d.Offer(ev("a", "5", event.Updated))
	d.Offer(ev("a", "6", event.Deleted))
	waitFor(t, sink.has("a deleted 6"))
	// b's window: a replay goes at once.
	d.Offer(replayOf(ev("b", "2", event.Updated)))
	waitFor(t, sink.has("b updated 2 replay"))
	if slices.Contains(sink.lines(), "a updated 5") {
		t.Errorf("the update before the deletion was sent: %q", sink.lines())
	}

	// A drain sends what waits in a window without waiting it out.
	d.Offer(ev("b", "3", event.Updated))
	d.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited out the window")
	}
	if !sink.has("b updated 3")() {
		t.Errorf("drained: %q", sink.lines())
	}
	ackMu.Lock()
	defer ackMu.Unlock()
	want := []string{"a 1", "b 1", "a 4", "a 6", "b 2", "b 3"}
	var order []string
	for _, a := range acked {
		if !slices.Contains(order, a) {
			order = append(order, a)
		}
	}
	if !slices.Equal(order, want) && !slices.Equal(order, []string{"a 1", "b 1", "a 4", "b 2", "a 6", "b 3"}) {
		t.Errorf("acknowledged %q, want %q (per object in order)", acked, want)
	}
	if s := d.Stats(); s.Pending != 0 || s.Throttled != 0 {
		t.Errorf("after the drain: pending %d, throttled %d", s.Pending, s.Throttled)
	}
}

// Without a window nothing is held: the same updates are each sent.
func TestNoUpdateWindowSendsEveryUpdate(t *testing.T) {
	sink := &sent{}
	d := New(Options{Config: sinkConfig(), Sink: sink})
	stop := run(t, d)
	defer stop()
	d.Offer(ev("a", "1", event.Added))
	waitFor(t, sink.has("a added 1"))
	d.Offer(ev("a", "2", event.Updated))
	waitFor(t, sink.has("a updated 2"))
	d.Offer(ev("a", "3", event.Updated))
	waitFor(t, sink.has("a updated 3"))
}

// gated sends nothing until released.
type gated struct {
	sent
	release chan struct{}
	once    sync.Once
}

func (g *gated) Send(ctx context.Context, evs []*event.Event) error {
	g.once.Do(func() { <-g.release })
	return g.sent.Send(ctx, evs)
}

// Updates that queued while the object's change was still in flight wait
// out the window too, and coalesce: one request with the latest state. A
// busy object in its window holds one event, not the queue's capacity.
func TestUpdateWindowFoldsWhatQueuedInFlight(t *testing.T) {
	const window = time.Second
	cfg := sinkConfig()
	cfg.Queue.Capacity = 10
	cfg.UpdateWindow = config.UpdateWindow{Every: config.Duration(window)}
	sink := &gated{release: make(chan struct{})}
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: sink, Clock: clk})
	stop := run(t, d)
	defer stop()
	d.Offer(ev("a", "1", event.Added))
	waitFor(t, func() bool { return d.Stats().Pending == 1 && d.queue.Len() == 0 }) // taken, held in Send
	for _, rv := range []string{"2", "3", "4"} {
		d.Offer(ev("a", rv, event.Updated))
	}
	close(sink.release)
	waitFor(t, func() bool { return d.Stats().Throttled == 1 })
	clk.Step(window)
	waitFor(t, sink.has("a updated 4"))
	if got := sink.lines(); !slices.Equal(got, []string{"a added 1", "a updated 4"}) {
		t.Fatalf("sent %q, want the added and one update with the latest state", got)
	}
	waitFor(t, func() bool { return d.Stats().Throttled == 1 })
	for i := 5; i < 60; i++ { // far past the capacity
		d.Offer(ev("a", fmt.Sprint(i), event.Updated))
		if p := d.Stats().Pending; p > 1 {
			t.Fatalf("%d events pending for one object in its window", p)
		}
	}
	clk.Step(window)
	waitFor(t, sink.has("a updated 59"))
	if got := sink.lines(); !slices.Equal(got, []string{"a added 1", "a updated 4", "a updated 59"}) {
		t.Errorf("sent %q, want one update per window with the latest state", got)
	}
	if s := d.Stats(); s.Queue.Coalesced == 0 {
		t.Errorf("nothing counted as coalesced: %+v", s.Queue)
	}
}

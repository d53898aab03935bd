package delivery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// digests records each Send as one line: its events, "<name> <change>
// <rv>", joined by ", ".
type digests struct {
	mu  sync.Mutex
	got []string
}

func (s *digests) Send(_ context.Context, evs []*event.Event) error {
	var parts []string
	for _, e := range evs {
		parts = append(parts, fmt.Sprintf("%s %s %s", e.Object().GetName(), e.Change, e.Object().GetResourceVersion()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, strings.Join(parts, ", "))
	return nil
}
func (s *digests) Close(context.Context) error { return nil }
func (s *digests) Ordered() bool               { return true }

func (s *digests) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// acks records what OnAck was given, "<name> <rv>", in order.
type acks struct {
	mu  sync.Mutex
	got []string
}

func (a *acks) hook(evs []*event.Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range evs {
		a.got = append(a.got, e.Object().GetName()+" "+e.Object().GetResourceVersion())
	}
}

func (a *acks) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// A digest is one batch per period: each object once, its latest state
// (an added that was updated stays added); an object created and deleted
// within the period is not in it; everything in it is acknowledged
// together, and what arrives after it was sent waits for the next period.
func TestDigestIsOneBatchPerPeriod(t *testing.T) {
	cfg := sinkConfig()
	cfg.Digest = &config.Digest{Every: config.Duration(time.Minute), Max: 50}
	sink := &digests{}
	var acked acks
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, Hooks: Hooks{OnAck: acked.hook}})

	d.Offer(freshAdded("a", "1"))
	d.Offer(ev("b", "1", event.Updated))
	d.Offer(ev("a", "2", event.Updated))
	d.Offer(freshAdded("c", "1"))
	d.Offer(ev("c", "2", event.Deleted))
	d.Offer(ev("b", "2", event.Updated))
	d.Offer(ev("e", "1", event.Deleted))
	stop := run(t, d) // one take holds them all
	defer stop()
	waitFor(t, func() bool { return d.queue.Len() == 0 && clk.HasWaiters() })
	clk.Step(59 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if got := sink.sent(); len(got) != 0 {
		t.Fatalf("sent before the period ended: %q", got)
	}
	clk.Step(time.Second)
	waitFor(t, func() bool { return len(sink.sent()) == 1 && d.Stats().Pending == 0 })
	if got, want := sink.sent()[0], "a added 2, b updated 2, e deleted 1"; got != want {
		t.Errorf("digest %q, want %q", got, want)
	}
	if got, want := acked.list(), []string{"a 2", "b 2", "e 1"}; !slices.Equal(got, want) {
		t.Errorf("acknowledged %q, want %q", got, want)
	}

	d.Offer(ev("a", "3", event.Updated))
	waitFor(t, func() bool { return d.queue.Len() == 0 })
	time.Sleep(20 * time.Millisecond) // the period's timer is set right after the take
	if got := sink.sent(); len(got) != 1 {
		t.Fatalf("the next period's change went at once: %q", got)
	}
	stepUntil(t, clk, time.Minute, func() bool { return len(sink.sent()) == 2 })
	if got := sink.sent()[1]; got != "a updated 3" {
		t.Errorf("second digest %q", got)
	}
}

// A closing delivery sends the period's digest without waiting it out.
func TestDigestIsSentAtClose(t *testing.T) {
	cfg := sinkConfig()
	cfg.Digest = &config.Digest{Every: config.Duration(time.Hour), Max: 50}
	sink := &digests{}
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: sink, Clock: clk})
	done := make(chan struct{})
	go func() { defer close(done); d.Run(context.Background()) }()
	d.Offer(ev("a", "1", event.Added))
	d.Offer(ev("b", "1", event.Added))
	waitFor(t, func() bool { return d.queue.Len() == 0 })
	d.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited out the period")
	}
	if got := sink.sent(); !slices.Equal(got, []string{"a added 1, b added 1"}) {
		t.Errorf("sent %q", got)
	}
}

// everyDay mutes from..to UTC every day.
func everyDay(from, to string) config.MuteSchedule {
	s, err := (&config.Mute{Windows: []config.MuteWindow{{From: from, To: to}}}).Schedule()
	if err != nil {
		panic(err)
	}
	return s
}

// During a mute window the matching events are held, each object's
// coalesced; what is still true when it ends is sent (an object created
// and deleted within it sends nothing); the others flow; an object with
// events held keeps its later ones behind them, whatever they match; the
// counts say what is held.
func TestMuteHoldsThenSendsWhatIsStillTrue(t *testing.T) {
	clk := fakeClock() // 13:46:40 UTC
	mute := &Mute{Schedule: everyDay("13:00", "14:00"), Matches: func(e *event.Event) (bool, error) { return e.Object().GetName() != "loud", nil }}
	sink := &sent{}
	var acked acks
	d := New(Options{Config: sinkConfig(), Sink: sink, Clock: clk, Mute: mute, Hooks: Hooks{OnAck: acked.hook}})
	stop := run(t, d)
	defer stop()

	d.Offer(freshAdded("a", "1"))
	d.Offer(ev("a", "2", event.Updated))
	d.Offer(freshAdded("b", "1"))
	d.Offer(ev("b", "2", event.Deleted))
	d.Offer(ev("c", "1", event.Updated))
	d.Offer(ev("loud", "1", event.Added))
	waitFor(t, sink.has("loud added 1"))
	if s := d.Stats(); s.Held != 2 || s.Muted != 5 || s.Pending != 2 {
		t.Errorf("held %d, muted %d, pending %d; want 2 (a, c), 5, 2", s.Held, s.Muted, s.Pending)
	}
	clk.Step(13*time.Minute + 19*time.Second) // 13:59:59
	time.Sleep(20 * time.Millisecond)
	if got := sink.lines(); !slices.Equal(got, []string{"loud added 1"}) {
		t.Fatalf("sent during the window: %q", got)
	}
	clk.Step(time.Second)
	waitFor(t, func() bool { return len(acked.list()) == 3 })
	if got := sink.lines(); !slices.Equal(got, []string{"loud added 1", "a added 2", "c updated 1"}) && !slices.Equal(got, []string{"loud added 1", "c updated 1", "a added 2"}) {
		t.Errorf("sent %q, want a's latest state and c's, not b", got)
	}
	if s := d.Stats(); s.Held != 0 || s.Pending != 0 {
		t.Errorf("after the window: held %d, pending %d", s.Held, s.Pending)
	}
	d.Offer(ev("a", "3", event.Updated)) // 14:00: no longer muted
	waitFor(t, sink.has("a updated 3"))
}

// An event the mute's where fails on (a label its object lacks) is held,
// as holding loses nothing and sending it would break the quiet; it is
// counted, and sent when the window ends.
func TestMuteHoldsWhatWhereFailsOn(t *testing.T) {
	clk := fakeClock() // 13:46:40 UTC
	mute := &Mute{Schedule: everyDay("13:00", "14:00"), Matches: func(e *event.Event) (bool, error) {
		if e.Object().GetName() == "unlabelled" {
			return false, errors.New("no such key: team")
		}
		return false, nil
	}}
	sink := &sent{}
	d := New(Options{Config: sinkConfig(), Sink: sink, Clock: clk, Mute: mute})
	stop := run(t, d)
	defer stop()
	d.Offer(ev("unlabelled", "1", event.Updated))
	d.Offer(ev("loud", "1", event.Updated))
	waitFor(t, sink.has("loud updated 1"))
	if s := d.Stats(); s.Held != 1 || s.MuteWhereErrors != 1 {
		t.Errorf("held %d, where errors %d; want the unlabelled object's event held and counted", s.Held, s.MuteWhereErrors)
	}
	if got := sink.lines(); !slices.Equal(got, []string{"loud updated 1"}) {
		t.Errorf("sent during the window: %q", got)
	}
	clk.Step(13*time.Minute + 20*time.Second) // 14:00
	waitFor(t, sink.has("unlabelled updated 1"))
}

// Names churned during a window (created and deleted, as Pods are) cost
// nothing once they cancelled out: what a mute keeps is per object held,
// and a name held again after it cancelled out is sent once.
func TestMuteChurnIsBounded(t *testing.T) {
	clk := fakeClock() // 13:46:40 UTC
	sink := &sent{}
	d := New(Options{Config: sinkConfig(), Sink: sink, Clock: clk, Mute: &Mute{Schedule: everyDay("13:00", "14:00")}})
	stop := run(t, d)
	defer stop()
	for i := range 10_000 {
		name := fmt.Sprint("p", i)
		d.Offer(freshAdded(name, "1"))
		d.Offer(ev(name, "2", event.Deleted))
	}
	d.Offer(freshAdded("p7", "3"))
	d.mute.mu.Lock()
	held, order := len(d.mute.held), len(d.mute.order)
	d.mute.mu.Unlock()
	if held != 1 || order > 130 {
		t.Errorf("after 10,000 names churned: %d objects held, %d keys kept; want 1 and a few", held, order)
	}
	clk.Step(14 * time.Minute)
	waitFor(t, sink.has("p7 added 3"))
	time.Sleep(20 * time.Millisecond)
	if got := sink.lines(); len(got) != 1 {
		t.Errorf("sent %d requests, want the one object still there: %q", len(got), got[:min(len(got), 5)])
	}
}

// Adjoining windows are one: nothing goes out between them. A closing
// delivery sends nothing that is held (the next start recomputes it from
// the checkpoint: it was never acknowledged).
func TestMuteAcrossAdjoiningWindowsAndClose(t *testing.T) {
	clk := fakeClock() // 13:46:40 UTC
	s, err := (&config.Mute{Windows: []config.MuteWindow{{From: "13:00", To: "14:00"}, {From: "14:00", To: "15:00"}}}).Schedule()
	if err != nil {
		t.Fatal(err)
	}
	sink := &sent{}
	d := New(Options{Config: sinkConfig(), Sink: sink, Clock: clk, Mute: &Mute{Schedule: s}})
	done := make(chan struct{})
	go func() { defer close(done); d.Run(context.Background()) }()
	d.Offer(ev("a", "1", event.Updated))
	clk.Step(30 * time.Minute) // 14:16:40
	time.Sleep(20 * time.Millisecond)
	if got := sink.lines(); len(got) != 0 {
		t.Fatalf("sent between adjoining windows: %q", got)
	}
	d.Close()
	<-done
	if got := sink.lines(); len(got) != 0 {
		t.Errorf("a close sent what was held: %q", got)
	}
	if s := d.Stats(); s.Pending != 1 {
		t.Errorf("left undelivered: %d, want 1", s.Pending)
	}
}

// A muted sink with a digest sends what was held as one digest when the
// window ends, at once (not a period later).
func TestMuteEndsInOneDigest(t *testing.T) {
	clk := fakeClock() // 13:46:40 UTC
	cfg := sinkConfig()
	cfg.Digest = &config.Digest{Every: config.Duration(5 * time.Minute), Max: 50}
	sink := &digests{}
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, Mute: &Mute{Schedule: everyDay("13:00", "13:50")}})
	stop := run(t, d)
	defer stop()
	for _, name := range []string{"a", "b", "c"} {
		d.Offer(ev(name, "1", event.Updated))
	}
	d.Offer(ev("b", "2", event.Updated))
	clk.Step(3*time.Minute + 20*time.Second) // 13:50
	waitFor(t, func() bool { return len(sink.sent()) == 1 })
	if got := sink.sent()[0]; got != "a updated 1, b updated 2, c updated 1" {
		t.Errorf("digest %q", got)
	}
	// The next period waits as any does.
	d.Offer(ev("a", "2", event.Updated))
	waitFor(t, func() bool { return d.queue.Len() == 0 })
	time.Sleep(20 * time.Millisecond)
	if got := sink.sent(); len(got) != 1 {
		t.Fatalf("the period after the window did not wait: %q", got)
	}
	stepUntil(t, clk, 5*time.Minute, func() bool { return len(sink.sent()) == 2 })
}

// A window that held many objects ends in one digest of all of them, at
// once, however the release's queueing and the take's waking interleave
// (the take woke on the first released event and waited out a period).
func TestMuteEndsInOneDigestOfManyObjects(t *testing.T) {
	clk := fakeClock() // 13:46:40 UTC
	cfg := sinkConfig()
	cfg.Queue.Capacity = 10000
	cfg.Digest = &config.Digest{Every: config.Duration(5 * time.Minute), Max: 50}
	sink := &digests{}
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, Mute: &Mute{Schedule: everyDay("13:00", "13:50")}})
	stop := run(t, d)
	defer stop()
	const n = 300
	for i := range n {
		d.Offer(ev(fmt.Sprint("o", i), "1", event.Updated))
	}
	clk.Step(3*time.Minute + 20*time.Second) // 13:50, and no step after
	sentAll := func() bool {
		total := 0
		for _, g := range sink.sent() {
			total += strings.Count(g, ",") + 1
		}
		return total == n
	}
	for deadline := time.Now().Add(3 * time.Second); !sentAll() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := sink.sent(); len(got) != 1 || !sentAll() {
		t.Errorf("at the window's end: %d digests sent, all %d objects: %v; want one digest of all, at once (queued %d)", len(got), n, sentAll(), d.queue.Len())
	}
}

// outage fails the first sends as a destination that is down does.
type outage struct {
	digests
	fails int
}

func (o *outage) Send(ctx context.Context, evs []*event.Event) error {
	o.digests.mu.Lock()
	f := o.fails > 0
	if f {
		o.fails--
	}
	o.digests.mu.Unlock()
	if f {
		return sinks.Unavailable(errors.New("connection refused"))
	}
	return o.digests.Send(ctx, evs)
}

// A period's digest that fails as a whole for an outage is retried whole,
// however many attempts fail: it was halved on each, and a few failed
// attempts made one message per object.
func TestDigestOutageRetriesThePeriodWhole(t *testing.T) {
	clk := fakeClock()
	cfg := sinkConfig()
	cfg.Digest = &config.Digest{Every: config.Duration(5 * time.Minute), Max: 50}
	sink := &outage{fails: 6}
	d := New(Options{Config: cfg, Sink: sink, Clock: clk})
	stop := run(t, d)
	defer stop()
	for i := range 16 {
		d.Offer(ev(fmt.Sprint("o", i), "1", event.Updated))
	}
	// Until all 16 went: between attempts they are parked, which Pending
	// does not count (the test passed on Pending alone only when the
	// first attempt was still in flight when it looked).
	stepUntil(t, clk, time.Second, func() bool {
		n := 0
		for _, m := range sink.sent() {
			n += strings.Count(m, ",") + 1
		}
		return n >= 16 && d.Pending() == 0
	})
	if got := sink.sent(); len(got) != 1 || strings.Count(got[0], ",") != 15 {
		t.Errorf("a period of 16 objects after 6 failed attempts went as %d messages: %q", len(got), got)
	}
}

// groupFails fails, once, the events of objects whose name starts with
// "b", with one error, as a digest's request for their group would.
type groupFails struct {
	digests
	failed bool
}

func (g *groupFails) Send(ctx context.Context, evs []*event.Event) error {
	errB := sinks.Unavailable(errors.New("503 for group b"))
	errs := make([]error, len(evs))
	var ok []*event.Event
	for i, e := range evs {
		if !g.failed && strings.HasPrefix(e.Object().GetName(), "b") {
			errs[i] = errB
			continue
		}
		ok = append(ok, e)
	}
	g.failed = true
	_ = g.digests.Send(ctx, ok)
	return sinks.Outcome(errs)
}

// The objects of a digest's group whose request failed are retried
// together, as one request again, not one by one.
func TestDigestRetriesAGroupTogether(t *testing.T) {
	cfg := sinkConfig()
	cfg.Digest = &config.Digest{Every: config.Duration(time.Minute), Max: 50}
	sink := &groupFails{}
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: sink, Clock: clk})
	for _, name := range []string{"a1", "b1", "a2", "b2", "b3"} {
		d.Offer(ev(name, "1", event.Updated))
	}
	stop := run(t, d)
	defer stop()
	waitFor(t, func() bool { return d.queue.Len() == 0 && clk.HasWaiters() })
	clk.Step(time.Minute)
	waitFor(t, func() bool { return d.Stats().Parked > 0 })
	if s := d.Stats(); s.Parked != 3 {
		t.Errorf("parked %d objects, want the group's 3", s.Parked)
	}
	for d.Stats().Pending > 0 {
		clk.Step(time.Second) // the retry's backoff
		time.Sleep(5 * time.Millisecond)
	}
	if got := sink.sent(); !slices.Equal(got, []string{"a1 updated 1, a2 updated 1", "b1 updated 1, b2 updated 1, b3 updated 1"}) {
		t.Errorf("sent %q, want the group retried as one request", got)
	}
}

// stepUntil steps clk by step until cond holds: a timer a goroutine sets
// after the test's last look is reached all the same.
func stepUntil(t *testing.T, clk *clocktesting.FakeClock, step time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		clk.Step(step)
		time.Sleep(2 * time.Millisecond)
	}
}

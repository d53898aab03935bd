package delivery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// flaky is a sink that fails its first n sends, then records.
type flaky struct {
	mu       sync.Mutex
	failures int
	err      error
	got      []string
	attempts int
}

func (f *flaky) Send(_ context.Context, evs []*event.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts++
	if f.failures > 0 {
		f.failures--
		return f.err
	}
	for _, e := range evs {
		f.got = append(f.got, e.ID)
	}
	return nil
}
func (f *flaky) Close(context.Context) error { return nil }

func (f *flaky) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func sinkConfig() config.Sink {
	return config.Sink{Name: "s", Queue: config.Queue{Capacity: 100},
		Retry: config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(5 * time.Millisecond)}}
}

func ev(name, rv string, change event.Change) *event.Event {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetUID(types.UID("u-" + name))
	u.SetResourceVersion(rv)
	return event.New(&event.Rule{Name: "r", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}, change, u, nil, time.Now())
}

// fakeClock is an engine clock that moves only when a test steps it.
func fakeClock() *clocktesting.FakeClock { return clocktesting.NewFakeClock(time.Unix(1_000_000, 0)) }

func run(t *testing.T, d *Delivery) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	return func() { cancel(); <-done }
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// A destination that fails as a whole (Unavailable) is retried until it
// takes everything, each object's events in order, its last state last;
// every event is reported to OnAck exactly once.
func TestRetriesUntilAcknowledgedInOrder(t *testing.T) {
	sink := &flaky{failures: 3, err: sinks.Unavailable(errors.New("connection refused"))}
	var acked sync.Map
	d := New(Options{Config: sinkConfig(), Sink: sink, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		for _, e := range evs {
			if _, dup := acked.LoadOrStore(e.ID, time.Since(e.Time)); dup {
				t.Errorf("%s acknowledged twice", e.ID)
			}
		}
	}}})
	stop := run(t, d)
	defer stop()
	last := map[string]string{}
	for i := range 20 {
		e := ev(fmt.Sprint("o", i%3), fmt.Sprint(i+1), event.Updated)
		last[e.Name()] = e.ID
		d.Offer(e)
	}
	waitFor(t, func() bool { return d.Pending() == 0 })
	seen := map[string]int{}
	for _, id := range sink.received() {
		parts := strings.Split(id, ".")
		rv, _ := strconv.Atoi(parts[2])
		if rv <= seen[parts[0]] {
			t.Errorf("%s after version %d", id, seen[parts[0]])
		}
		seen[parts[0]] = rv
	}
	got := sink.received()
	for name, id := range last {
		if !slices.Contains(got, id) {
			t.Errorf("%s: last state %s not delivered (got %v)", name, id, got)
		}
	}
	st := d.Stats()
	if st.Retried != 3 || st.Failed != 0 || int(st.Delivered) != len(got) || int(st.Delivered+st.Queue.Coalesced) != 20 {
		t.Errorf("stats %+v, delivered %d", st, len(got))
	}
	n := 0
	acked.Range(func(_, v any) bool {
		n++
		if v.(time.Duration) <= 0 {
			t.Errorf("latency %v", v)
		}
		return true
	})
	if n != len(got) {
		t.Errorf("OnAck saw %d events, want %d", n, len(got))
	}
}

// A permanent refusal without a dead-letter is never recorded as
// delivered: the object stays parked, counted, and is retried at
// maxInterval; other objects flow meanwhile. Once the destination takes
// it, it is acknowledged.
func TestPermanentRefusalWithoutDeadLetterStaysParked(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	s := &scripted{tries: map[string]int{}, outcome: func(e *event.Event, _ int) error {
		if e.Name() == "bad" && refuse.Load() {
			return sinks.Permanent(errors.New("400 bad request"))
		}
		return nil
	}}
	cfg := sinkConfig()
	cfg.Retry.MaxInterval = config.Duration(50 * time.Millisecond)
	var mu sync.Mutex
	var acked []string
	d := New(Options{Config: cfg, Sink: s, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			acked = append(acked, e.Name())
		}
	}}})
	ackedNames := func() string { mu.Lock(); defer mu.Unlock(); return fmt.Sprint(acked) }
	stop := run(t, d)
	defer stop()
	d.Offer(ev("bad", "1", event.Added))
	waitFor(t, func() bool { return d.Stats().Failed >= 1 })
	for i := range 5 {
		d.Offer(ev(fmt.Sprint("ok", i), "1", event.Added))
	}
	waitFor(t, func() bool { return strings.Count(ackedNames(), "ok") == 5 })
	st := d.Stats()
	if strings.Contains(ackedNames(), "bad") || st.Parked != 1 || st.Pending != 1 || st.Delivered != 5 || st.DeadLettered != 0 {
		t.Fatalf("a refusal was recorded as delivered, or others waited: acked %s, stats %+v", ackedNames(), st)
	}
	waitFor(t, func() bool { return d.Stats().Failed >= 2 }) // retried at maxInterval, counted again
	refuse.Store(false)
	waitFor(t, func() bool { return strings.Contains(ackedNames(), "bad") })
	if st := d.Stats(); st.Parked != 0 || st.Pending != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A newer state of a parked object replaces the refused one: its
// deletion is delivered instead of waiting forever behind a refusal.
func TestNewerStateReplacesAParkedRefusal(t *testing.T) {
	s := &scripted{tries: map[string]int{}, outcome: func(e *event.Event, _ int) error {
		if e.Change == event.Updated {
			return sinks.Permanent(errors.New("422 unprocessable"))
		}
		return nil
	}}
	cfg := sinkConfig()
	cfg.Retry.MaxInterval = config.Duration(20 * time.Millisecond)
	var mu sync.Mutex
	var acked []string
	d := New(Options{Config: cfg, Sink: s, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			acked = append(acked, string(e.Change))
		}
	}}})
	stop := run(t, d)
	defer stop()
	d.Offer(ev("a", "1", event.Added))
	d.Offer(ev("a", "2", event.Updated))
	waitFor(t, func() bool { return d.Stats().Parked == 1 })
	d.Offer(ev("a", "3", event.Deleted))
	waitFor(t, func() bool { return d.Pending() == 0 })
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(acked) != "[added deleted]" || fmt.Sprint(s.took) != "[a@1 a@3]" {
		t.Errorf("acked %v, took %v", acked, s.took)
	}
}

type panicky struct{ flaky }

func (p *panicky) Send(ctx context.Context, evs []*event.Event) error {
	p.mu.Lock()
	first := p.attempts == 0
	p.attempts++
	p.mu.Unlock()
	if first {
		panic("boom")
	}
	return p.flaky.Send(ctx, evs)
}

func TestPanickingSinkIsRetried(t *testing.T) {
	sink := &panicky{}
	d := New(Options{Config: sinkConfig(), Sink: sink})
	stop := run(t, d)
	defer stop()
	d.Offer(ev("a", "1", event.Added))
	waitFor(t, func() bool { return len(sink.received()) == 1 })
}

// Close drains what is queued, then Run returns.
func TestCloseDrains(t *testing.T) {
	sink := &flaky{}
	d := New(Options{Config: sinkConfig(), Sink: sink})
	for i := range 50 {
		d.Offer(ev(fmt.Sprint("o", i), "1", event.Added))
	}
	d.Close()
	d.Run(context.Background())
	if len(sink.received()) != 50 {
		t.Errorf("drained %d of 50", len(sink.received()))
	}
}

// freshAdded is the added of an object the sink's view held nothing of.
func freshAdded(name, rv string) *event.Event {
	e := ev(name, rv, event.Added)
	return event.Build(e.RuleInfo(), event.Transition{Change: event.Added, Object: e.Object(), Time: e.Time, Entered: e.Entered, Fresh: true})
}

// scripted is a sink whose answer for each event is decided by a function;
// it records what the destination took.
type scripted struct {
	mu      sync.Mutex
	outcome func(e *event.Event, attempt int) error
	tries   map[string]int
	took    []string
}

func (s *scripted) Send(_ context.Context, evs []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(evs))
	failed := false
	for i, e := range evs {
		s.tries[e.ID]++
		if errs[i] = s.outcome(e, s.tries[e.ID]); errs[i] == nil {
			s.took = append(s.took, e.Name()+"@"+e.Object().GetResourceVersion())
		} else {
			failed = true
		}
	}
	if failed {
		return &sinks.EventErrors{Errs: errs}
	}
	return nil
}
func (s *scripted) Close(context.Context) error { return nil }

type deadLetters struct {
	mu  sync.Mutex
	got []string
}

func (d *deadLetters) Put(_ context.Context, _ string, evs []*event.Event, _ error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range evs {
		d.got = append(d.got, e.Name())
	}
	return nil
}

// One bad event never fails its neighbours: the acknowledged ones count,
// the refused one goes to the dead-letter, the failing one alone is
// retried; quiet events are never sent; OnAck reports every event once
// it is settled.
func TestPerEventOutcomes(t *testing.T) {
	s := &scripted{tries: map[string]int{}, outcome: func(e *event.Event, attempt int) error {
		switch {
		case e.Name() == "huge":
			return sinks.Permanent(errors.New("too large"))
		case e.Name() == "flaky" && attempt < 3:
			return errors.New("try again")
		}
		return nil
	}}
	dl := &deadLetters{}
	var acked []string
	d := New(Options{Config: sinkConfig(), Sink: s, DeadLetter: dl, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		for _, e := range evs {
			acked = append(acked, e.Name())
		}
	}}})
	d.Offer(ev("a", "1", event.Added))
	d.Offer(ev("huge", "1", event.Added))
	d.Offer(ev("flaky", "1", event.Added))
	d.Offer(ev("quiet", "1", event.Added).WithQuiet(true))
	d.Offer(ev("flaky", "2", event.Updated).WithQuiet(true)) // behind flaky@1
	d.Offer(ev("b", "1", event.Added))
	d.Close()
	d.Run(context.Background())
	if got := fmt.Sprint(s.took); got != "[a@1 b@1 flaky@1]" {
		t.Errorf("destination took %s", got)
	}
	if s.tries[ev("a", "1", event.Added).ID] > 1 {
		t.Error("an acknowledged event was sent again")
	}
	if fmt.Sprint(dl.got) != "[huge]" {
		t.Errorf("dead-letter got %v", dl.got)
	}
	// Per object, in order; an object retried is reported once it is taken
	// (a quiet event behind it too).
	if fmt.Sprint(acked) != "[a huge quiet b flaky flaky]" {
		t.Errorf("OnAck got %v, want every event once, each object's in order", acked)
	}
	if st := d.Stats(); st.Delivered != 3 || st.Failed != 1 || st.DeadLettered != 1 {
		t.Errorf("stats %+v", st)
	}
}

// A replaced object's deleted and the new one's added are never merged,
// even when the queue overflows.
func TestOverflowKeepsBothIncarnations(t *testing.T) {
	s := &scripted{tries: map[string]int{}, outcome: func(*event.Event, int) error { return nil }}
	cfg := sinkConfig()
	cfg.Queue.Capacity = 1
	d := New(Options{Config: cfg, Sink: s})
	d.Offer(ev("first", "1", event.Added)) // fills the ring
	old := ev("a", "5", event.Deleted)
	repl := ev("a", "6", event.Added)
	o := repl.Object().DeepCopy()
	o.SetUID("u-a2")
	repl = event.Build(repl.RuleInfo(), event.Transition{Change: event.Added, Object: o, Time: time.Now(), Entered: 2})
	d.Offer(old)
	d.Offer(repl)
	d.Close()
	d.Run(context.Background())
	if got := fmt.Sprint(s.took); got != "[first@1 a@5 a@6]" {
		t.Errorf("took %s: the old incarnation's deletion was merged away", got)
	}
}

type flakyDeadLetter struct {
	deadLetters
	failures int
}

func (f *flakyDeadLetter) Put(ctx context.Context, sink string, evs []*event.Event, cause error) error {
	f.mu.Lock()
	if f.failures > 0 {
		f.failures--
		f.mu.Unlock()
		return errors.New("dead-letter unreachable")
	}
	f.mu.Unlock()
	return f.deadLetters.Put(ctx, sink, evs, cause)
}

// A refused event counts as handled only once the dead-letter has it.
func TestDeadLetterRetriedUntilItTakes(t *testing.T) {
	s := &scripted{tries: map[string]int{}, outcome: func(*event.Event, int) error { return sinks.Permanent(errors.New("no")) }}
	dl := &flakyDeadLetter{failures: 3}
	acked := 0
	d := New(Options{Config: sinkConfig(), Sink: s, DeadLetter: dl, Hooks: Hooks{OnAck: func(evs []*event.Event) { acked += len(evs) }}})
	d.Offer(ev("bad", "1", event.Added))
	d.Close()
	d.Run(context.Background())
	if fmt.Sprint(dl.got) != "[bad]" || acked != 1 || d.Stats().DeadLettered != 1 {
		t.Errorf("dead-letter %v, acked %d, stats %+v", dl.got, acked, d.Stats())
	}

	// Cut short while the dead-letter is down: not acknowledged.
	dl = &flakyDeadLetter{failures: 1 << 30}
	acked = 0
	d = New(Options{Config: sinkConfig(), Sink: s, DeadLetter: dl, Hooks: Hooks{OnAck: func(evs []*event.Event) { acked += len(evs) }}})
	d.Offer(ev("bad", "1", event.Added))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	d.Run(ctx)
	if acked != 0 {
		t.Error("an event the dead-letter never took was recorded as handled")
	}
}

// nop acknowledges at once, in batches of its size (0: MaxBatch).
type nop struct{ batch int }

func (n nop) Send(context.Context, []*event.Event) error { return nil }
func (nop) Close(context.Context) error                  { return nil }

type nopBatcher struct{ nop }

func (n nopBatcher) Batching() (int, time.Duration) { return n.batch, 0 }

// BenchmarkDelivery is the delivery loop's own cost per event (queue,
// holds, limiter, batch goroutines, OnAck) into a sink that costs nothing,
// draining a queue of b.N events of 1,000 objects: one event per send (a
// webhook without batch) and full batches, adaptive and with one worker.
func BenchmarkDelivery(b *testing.B) {
	for _, c := range []struct {
		name    string
		sink    sinks.Sink
		workers int
	}{{"batch1", nopBatcher{nop{1}}, 0}, {"batch256", nop{}, 0}, {"batch1/workers1", nopBatcher{nop{1}}, 1}, {"batch256/workers1", nop{}, 1}} {
		b.Run(c.name, func(b *testing.B) {
			events := make([]*event.Event, 1000)
			for i := range events {
				events[i] = ev(fmt.Sprint("o", i), "1", event.Updated)
			}
			cfg := sinkConfig()
			cfg.Queue.Capacity = b.N
			cfg.Workers = c.workers
			d := New(Options{Config: cfg, Sink: c.sink, Hooks: Hooks{OnAck: func([]*event.Event) {}}})
			for i := range b.N {
				d.Offer(events[i%len(events)])
			}
			d.Close()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime()
			d.Run(context.Background())
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDeliveryOneByOne offers an event only once the previous one was
// acknowledged: the path of a live event at a quiet time (wake-ups
// included), per event.
func BenchmarkDeliveryOneByOne(b *testing.B) {
	e := ev("o", "1", event.Updated)
	acked := make(chan struct{}, 1)
	d := New(Options{Config: sinkConfig(), Sink: nopBatcher{nop{1}}, Hooks: Hooks{OnAck: func([]*event.Event) { acked <- struct{}{} }}})
	stop := make(chan struct{})
	go func() { defer close(stop); d.Run(context.Background()) }()
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		d.Offer(e)
		<-acked
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	d.Close()
	<-stop
}

// retry.maxElapsed dead-letters what the destination kept failing, never
// what it was not asked to take: time spent with the write-ahead intent
// failing or the fence closed does not count. With both failing for 10x
// maxElapsed, then a sink that fails once more and then takes everything,
// nothing is dead-lettered; a sink that keeps failing is dead-lettered
// after maxElapsed.
func TestMaxElapsedCountsOnlyAttemptsOnTheDestination(t *testing.T) {
	const maxElapsed = 20 * time.Millisecond
	blockedFor := func(d time.Duration) func() error {
		until := time.Now().Add(d)
		return func() error {
			if time.Now().Before(until) {
				return errors.New("blocked")
			}
			return nil
		}
	}
	for _, c := range []struct {
		name        string
		hooks       func() Hooks
		failures    int // sends the destination fails
		deadLetters string
	}{
		{"intent failing", func() Hooks {
			blocked := blockedFor(10 * maxElapsed)
			return Hooks{BeforeSend: func(context.Context, []*event.Event) error { return blocked() }}
		}, 1, "[]"},
		{"fence closed", func() Hooks { return Hooks{Fence: blockedFor(10 * maxElapsed)} }, 1, "[]"},
		// The fence closes after a first failed send: the gap does not count either.
		{"fence closed between sends", func() Hooks {
			var blocked func() error
			return Hooks{Fence: func() error {
				if blocked == nil { // the first attempt passes, the next ones wait
					blocked = blockedFor(10 * maxElapsed)
					return nil
				}
				return blocked()
			}}
		}, 1, "[]"},
		{"destination failing", func() Hooks { return Hooks{} }, 1 << 30, "[a]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := sinkConfig()
			cfg.Retry.MaxElapsed = config.Duration(maxElapsed)
			sink := &flaky{failures: c.failures, err: errors.New("503")}
			dl := &deadLetters{}
			d := New(Options{Config: cfg, Sink: sink, DeadLetter: dl, Hooks: c.hooks()})
			e := ev("a", "1", event.Added)
			d.Offer(e)
			d.Close()
			d.Run(context.Background())
			if got := fmt.Sprint(dl.got); got != c.deadLetters {
				t.Errorf("dead-lettered %s, want %s (the sink took %v after %d attempts)", got, c.deadLetters, sink.received(), sink.attempts)
			}
			if c.deadLetters == "[]" && fmt.Sprint(sink.received()) != "["+e.ID+"]" {
				t.Errorf("the sink took %v, want the event", sink.received())
			}
		})
	}
}

// slowSink blocks its first Send until ctx ends (a destination that hangs),
// then takes everything.
type slowSink struct {
	flaky
	started chan struct{}
	once    sync.Once
}

func (s *slowSink) Send(ctx context.Context, evs []*event.Event) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.started)
		<-ctx.Done()
		return ctx.Err()
	}
	return s.flaky.Send(ctx, evs)
}

// A send cut short because its hold lapsed (a shard's Lease not renewed
// in time) is not the destination's failure: nothing is counted failed,
// parked or dead-lettered; the batch waits while the fence is closed and
// is sent again under the new hold, once.
func TestSendCutByItsHoldWaitsForTheNextHold(t *testing.T) {
	var mu sync.Mutex
	hold, lapse := context.WithCancelCause(context.Background())
	open := true
	sink := &slowSink{started: make(chan struct{})}
	dl := &deadLetters{}
	var acked []string
	hooks := Hooks{
		Fence: func() error {
			mu.Lock()
			defer mu.Unlock()
			if !open {
				return errors.New("lapsed")
			}
			return nil
		},
		Hold: func(ctx context.Context) (context.Context, context.CancelFunc) {
			mu.Lock()
			h := hold
			mu.Unlock()
			ctx, cancel := context.WithCancelCause(ctx)
			stop := context.AfterFunc(h, func() { cancel(context.Cause(h)) })
			return ctx, func() { stop(); cancel(nil) }
		},
		OnAck: func(evs []*event.Event) {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				acked = append(acked, e.ID)
			}
		},
	}
	d := New(Options{Config: sinkConfig(), Sink: sink, DeadLetter: dl, Hooks: hooks})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	e := ev("a", "1", event.Added)
	d.Offer(e)
	<-sink.started
	mu.Lock()
	open = false
	mu.Unlock()
	lapse(errors.New("lease lapsed"))
	time.Sleep(30 * time.Millisecond) // the batch waits: fence closed
	if got := sink.received(); len(got) != 0 {
		t.Fatalf("sent %v while the fence was closed", got)
	}
	mu.Lock()
	open = true
	hold, lapse = context.WithCancelCause(context.Background())
	mu.Unlock()
	defer lapse(nil)
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.received()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	d.Close()
	<-done
	if got := fmt.Sprint(sink.received()); got != "["+e.ID+"]" {
		t.Errorf("the sink took %s after the hold was renewed, want [%s]", got, e.ID)
	}
	st := d.Stats()
	if st.Failed != 0 || st.Retried != 0 || st.Parked != 0 || len(dl.got) != 0 {
		t.Errorf("a send cut by its hold counted as the destination's failure: failed %d, retried %d, parked %d, dead-lettered %v", st.Failed, st.Retried, st.Parked, dl.got)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(acked) != "["+e.ID+"]" {
		t.Errorf("acknowledged %v, want the event once", acked)
	}
}

// A dead-letter write is a send: while the fence is closed (the first
// attempt passed it, then the lease lapsed before the refusal was
// dead-lettered) nothing is written there, data or not; the object waits
// parked and goes to the dead-letter once, when the fence opens.
func TestDeadLetterWaitsForTheFence(t *testing.T) {
	var open atomic.Bool
	open.Store(true)
	sink := &flaky{failures: 1 << 30, err: sinks.Permanent(errors.New("422"))}
	dl := &deadLetters{}
	fenceCalls := 0
	var mu sync.Mutex
	d := New(Options{Config: sinkConfig(), Sink: sink, DeadLetter: dl, Hooks: Hooks{Fence: func() error {
		mu.Lock()
		defer mu.Unlock()
		fenceCalls++
		if fenceCalls == 1 {
			return nil // the send passes; the lease lapses right after
		}
		if !open.Load() {
			return errors.New("lapsed")
		}
		return nil
	}}})
	open.Store(false)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	d.Offer(ev("a", "1", event.Added))
	time.Sleep(50 * time.Millisecond)
	dl.mu.Lock()
	early := fmt.Sprint(dl.got)
	dl.mu.Unlock()
	if early != "[]" {
		t.Fatalf("dead-lettered %s while the fence was closed", early)
	}
	open.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		dl.mu.Lock()
		n := len(dl.got)
		dl.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.Close()
	<-done
	if got := fmt.Sprint(dl.got); got != "[a]" {
		t.Errorf("dead-lettered %s once the fence opened, want [a] once", got)
	}
}

// A write the destination's fence refuses (a stale owner's: 409 from a
// receiver checking Kubebridge-Fence, a JetStream expectation) is neither
// delivered nor dead-lettered, even past retry.maxElapsed, and says the
// destination works: the others flow, the sink stays healthy.
func TestFencedRefusalIsNeverGivenUp(t *testing.T) {
	s := &scripted{tries: map[string]int{}, outcome: func(e *event.Event, _ int) error {
		if e.Name() == "stale" {
			return sinks.Fenced(errors.New("409 Conflict"))
		}
		return nil
	}}
	cfg := sinkConfig()
	cfg.Retry.MaxElapsed = config.Duration(5 * time.Millisecond)
	dl := &deadLetters{}
	d := New(Options{Config: cfg, Sink: s, DeadLetter: dl})
	stop := run(t, d)
	defer stop()
	d.Offer(ev("stale", "1", event.Added))
	waitFor(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.tries) == 1 })
	for i := range 5 {
		d.Offer(ev(fmt.Sprint("ok-", i), "1", event.Added))
	}
	waitFor(t, func() bool { return d.Stats().Delivered == 5 })
	time.Sleep(50 * time.Millisecond) // ten times maxElapsed
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if st := d.Stats(); len(dl.got) != 0 || st.DeadLettered != 0 || st.Parked != 1 || st.Failing || d.Healthy() != nil {
		t.Errorf("dead-lettered %v, stats %+v, healthy %v", dl.got, st, d.Healthy())
	}
}

package sinkstest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSink is a destination that fails as send says and records what it
// took; it reports an object in two Sends at once.
type fakeSink struct {
	t    *testing.T
	send func(call int, events []*event.Event) error

	mu       sync.Mutex
	calls    int
	inFlight map[string]bool
	got      []Received
	times    []time.Time
}

func (f *fakeSink) Send(_ context.Context, events []*event.Event) error {
	f.mu.Lock()
	f.calls++
	call := f.calls
	f.times = append(f.times, time.Now())
	keys := map[string]bool{}
	for _, e := range events {
		keys[e.Key()] = true
	}
	for k := range keys {
		if f.inFlight[k] {
			f.t.Errorf("%s is in two batches at once", k)
		}
		f.inFlight[k] = true
	}
	f.mu.Unlock()
	time.Sleep(time.Millisecond) // others overlap
	err := f.send(call, events)
	errs := outcomes(err, len(events))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, e := range events {
		delete(f.inFlight, e.Key())
		if errs[i] == nil {
			f.got = append(f.got, Received{ID: e.ID, Subject: e.Subject})
		}
	}
	return err
}

func (*fakeSink) Close(context.Context) error { return nil }

func (f *fakeSink) Received(testing.TB) []Received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}
func (*fakeSink) Down(testing.TB)    {}
func (*fakeSink) Up(testing.TB)      {}
func (*fakeSink) Restart(testing.TB) {}
func (*fakeSink) Refuse(testing.TB)  {}

func newFake(t *testing.T, send func(int, []*event.Event) error) *fakeSink {
	return &fakeSink{t: t, send: send, inFlight: map[string]bool{}}
}

func loopConfig(workers int) config.Sink {
	return config.Sink{Name: "fake", Workers: workers, Queue: config.Queue{Capacity: 100},
		Retry: config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(20 * time.Millisecond)}}
}

// Several workers, a destination that fails every third Send: every
// object's events arrive, in order, never one object in two Sends at once.
func TestDeliveryKeepsOrderThroughFailures(t *testing.T) {
	f := newFake(t, func(call int, _ []*event.Event) error {
		if call%3 == 0 {
			return errors.New("flaky")
		}
		return nil
	})
	d := Start(t, loopConfig(4), f, nil)
	src := NewSource(10)
	for i := range 1000 {
		d.Offer(src.Next(i % 30))
	}
	Check(t, src, WaitFor(t, src, f, 20*time.Second))
	if s := d.Stats(); s.Retried == 0 || s.Delivered < 30 {
		t.Errorf("stats %+v", s)
	}
}

// A batch refused permanently as a whole is sent again one by one: the
// culprit alone goes to the dead-letter, its neighbours are delivered.
func TestDeliverySplitsABatchRefusedAsAWhole(t *testing.T) {
	src := NewSource(10)
	var poison string
	f := newFake(t, func(_ int, events []*event.Event) error {
		for _, e := range events {
			if e.ID == poison {
				return sinks.Permanent(errors.New("one of these is bad"))
			}
		}
		return nil
	})
	dl := &RecordingDeadLetter{}
	cfg := loopConfig(1)
	first := src.Next(0)
	bad := src.Next(1)
	poison = bad.ID
	d := Start(t, cfg, f, dl)
	for _, e := range []*event.Event{first, bad, src.Next(2), src.Next(3)} {
		d.Offer(e)
	}
	if !poll(func() bool { return dl.count() == 1 && len(f.Received(t)) == 3 }) || dl.Events[0].ID != poison {
		t.Fatalf("dead-letter holds %d events, the destination %v", dl.count(), f.Received(t))
	}
	if s := d.Stats(); s.Failed != 1 || s.DeadLettered != 1 || s.Delivered != 3 {
		t.Errorf("stats %+v, want 3 delivered, 1 dead-lettered", s)
	}
}

// A Throttle holds the next attempt back for as long as it asks.
func TestDeliveryHonoursThrottle(t *testing.T) {
	f := newFake(t, func(call int, _ []*event.Event) error {
		if call == 1 {
			return sinks.Throttle(errors.New("slow down"), 200*time.Millisecond)
		}
		return nil
	})
	d := Start(t, loopConfig(1), f, nil)
	src := NewSource(10)
	d.Offer(src.Next(0))
	WaitFor(t, src, f, 10*time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.times) != 2 || f.times[1].Sub(f.times[0]) < 200*time.Millisecond {
		t.Errorf("attempts at %v: want the second 200ms after the first", f.times)
	}
}

func poll(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// While the destination as a whole fails, one batch at a time probes it,
// backing off; once one gets through, the workers all send again.
func TestDeliveryProbesADownDestination(t *testing.T) {
	var mu sync.Mutex
	sending, most, downCalls := 0, 0, 0
	f := newFake(t, func(int, []*event.Event) error { return nil })
	upAt := time.Now().Add(200 * time.Millisecond)
	d := Start(t, loopConfig(8), smallBatches(func(ctx context.Context, events []*event.Event) error {
		if time.Now().Before(upAt) {
			mu.Lock()
			downCalls++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			return sinks.Unavailable(errors.New("down"))
		}
		mu.Lock()
		sending++
		most = max(most, sending)
		mu.Unlock()
		defer func() {
			mu.Lock()
			sending--
			mu.Unlock()
		}()
		return f.Send(ctx, events)
	}), nil)
	src := NewSource(10)
	for i := range 400 {
		d.Offer(src.Next(i % 100))
	}
	Check(t, src, WaitFor(t, src, f, 10*time.Second))
	mu.Lock()
	defer mu.Unlock()
	// Unchecked, 8 workers sending 2 ms each would try some 800 times in
	// 200 ms; one probe at a time, backing off to 20 ms, about 20.
	if downCalls > 40 {
		t.Errorf("%d sends while the destination was down", downCalls)
	}
	if most < 2 {
		t.Errorf("at most %d sends at once once it was back", most)
	}
}

// smallBatches is a sink of batches of 5 events.
type smallBatches func(ctx context.Context, events []*event.Event) error

func (f smallBatches) Send(ctx context.Context, events []*event.Event) error { return f(ctx, events) }
func (smallBatches) Close(context.Context) error                             { return nil }
func (smallBatches) Batching() (int, time.Duration)                          { return 5, 0 }

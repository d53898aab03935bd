package delivery

import (
	"fmt"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// A rate limit holds events, never drops them: within a window no more
// than the burst plus the rate's share reach the sink (slow machines send
// fewer, never more), and every event arrives, each object's in order.
func TestRateLimitHoldsEvents(t *testing.T) {
	f := &flaky{}
	cfg := sinkConfig()
	cfg.RateLimit = &config.RateLimit{EventsPerSecond: 40, Burst: 4}
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: f, Clock: clk})
	var want []string
	for i := range 30 {
		e := ev(fmt.Sprint("o", i%5), fmt.Sprint(i+1), event.Updated)
		want = append(want, e.ID)
		d.Offer(e)
	}
	stop := run(t, d)
	defer stop()
	// The burst goes at once; then a batch waits for its tokens.
	waitFor(t, func() bool { return len(f.received()) == 4 && clk.HasWaiters() })
	var elapsed time.Duration // the engine's
	for len(f.received()) < 30 && elapsed < time.Minute {
		clk.Step(10 * time.Millisecond)
		elapsed += 10 * time.Millisecond
		time.Sleep(time.Millisecond) // the engine's turn
		if n, limit := len(f.received()), 4+int(40*elapsed.Seconds()); n > limit {
			t.Fatalf("%d events within %s, more than the burst and the rate allow (%d)", n, elapsed, limit)
		}
	}
	waitFor(t, func() bool { return len(f.received()) == 30 })
	got := f.received()
	// Per object, in the order offered.
	pos := map[string]int{}
	for i, id := range got {
		pos[id] = i
	}
	for i := 5; i < len(want); i++ {
		if pos[want[i]] < pos[want[i-5]] {
			t.Errorf("object %d: event %d arrived before event %d", i%5, i, i-5)
		}
	}
}

func TestRateLimitValidation(t *testing.T) {
	for _, r := range []config.RateLimit{{EventsPerSecond: 0}, {EventsPerSecond: -1}, {EventsPerSecond: 1, Burst: -1}} {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v: valid", r)
		}
	}
	if b := (&config.RateLimit{EventsPerSecond: 0.5}).BurstOrDefault(); b != 1 {
		t.Errorf("burst of 0.5/s = %d, want 1", b)
	}
}

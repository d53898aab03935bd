package backoff

import (
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

// next returns b's next n waits.
func next(b *Backoff, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = b.Next()
	}
	return out
}

func TestNextDoublesUpToMax(t *testing.T) {
	b := Backoff{Initial: 100 * ms, Max: time.Second}
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}
	if got := next(&b, len(want)); !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	for n, w := range want { // Wait(n) is the n-th wait, whatever the position
		if got := b.Wait(n + 1); got != w {
			t.Errorf("Wait(%d) = %s, want %s", n+1, got, w)
		}
	}
}

func TestReset(t *testing.T) {
	b := Backoff{Initial: 10 * ms, Max: 200 * ms}
	next(&b, 10)
	b.Reset()
	if got, want := next(&b, 3), []time.Duration{10 * ms, 20 * ms, 40 * ms}; !slices.Equal(got, want) {
		t.Errorf("after Reset, waits %v, want %v", got, want)
	}
}

func TestCopyKeepsItsOwnPosition(t *testing.T) {
	b := Backoff{Initial: ms, Max: time.Second}
	b.Next()
	c := b
	c.Next()
	if got := b.Next(); got != 2*ms {
		t.Errorf("the original's second wait = %s, want 2ms (the copy moved it)", got)
	}
}

func TestBounds(t *testing.T) {
	for _, c := range []struct {
		b    Backoff
		want []time.Duration
	}{
		{Backoff{}, []time.Duration{ms, ms, ms}}, // zero never spins
		{Backoff{Initial: 100 * time.Microsecond, Max: time.Second}, []time.Duration{ms, ms, ms, ms, 1600 * time.Microsecond}}, // a floor, not a start
		{Backoff{Initial: 2 * time.Second, Max: time.Second}, []time.Duration{time.Second, time.Second}},                       // Max caps Initial too
	} {
		if got := next(&c.b, len(c.want)); !slices.Equal(got, c.want) {
			t.Errorf("%+v: waits %v, want %v", c.b, got, c.want)
		}
	}
	// Many failures neither overflow nor pass Max.
	b := Backoff{Initial: ms, Max: 30 * time.Second}
	if w := b.Wait(1 << 20); w != 30*time.Second {
		t.Errorf("Wait(1<<20) = %s, want 30s", w)
	}
}

func TestJitterRange(t *testing.T) {
	for _, w := range []time.Duration{0, 1, 3, ms, time.Second} {
		lo, hi := w, time.Duration(0)
		for range 2000 {
			j := Jitter(w)
			if j < w/2 || j > w {
				t.Fatalf("Jitter(%s) = %s, outside [%s, %s]", w, j, w/2, w)
			}
			lo, hi = min(lo, j), max(hi, j)
		}
		// Spread over the range, not stuck at one end.
		if w >= ms && (lo > w/2+w/8 || hi < w-w/8) {
			t.Errorf("Jitter(%s) drew only [%s, %s]", w, lo, hi)
		}
	}
}

// Package backoff spaces the attempts at something that keeps failing: a
// destination that is down, a parked object, a plugin that keeps crashing.
// The wait doubles per failure, from Initial up to Max, so that a long
// outage costs few attempts while a short one is retried soon; Jitter
// spreads the retries of things that failed together, so that they do not
// come back in step.
package backoff

import (
	"math/rand/v2"
	"time"
)

// floor is the shortest wait: an interval of zero (a config built without
// its defaults) must not make a busy loop.
const floor = time.Millisecond

// Backoff is exponential backoff without jitter: the wait after the first
// failure is Initial, doubled per failure after that, never more than Max
// and never less than a millisecond. The zero position is ready to use; a
// copy carries its own position.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration

	failures int // Next's calls since Reset
}

// Wait is the wait after failure n (n >= 1): Initial doubled n-1 times,
// capped at Max. It does not move the position.
func (b Backoff) Wait(n int) time.Duration {
	w := b.Initial
	for i := 1; i < n && w < b.Max; i++ {
		w *= 2
	}
	return max(min(w, b.Max), floor)
}

// Next counts one more failure and returns the wait after it.
func (b *Backoff) Next() time.Duration {
	b.failures++
	return b.Wait(b.failures)
}

// Reset starts over: the next wait is Initial again (it worked for long
// enough, or it recovered).
func (b *Backoff) Reset() { b.failures = 0 }

// Jitter draws a wait uniformly from [w/2, w] ("equal jitter"): retries
// that failed at once spread over half their wait, and none comes sooner
// than half of it.
func Jitter(w time.Duration) time.Duration { return w/2 + rand.N(w/2+1) }

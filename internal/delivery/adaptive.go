package delivery

import (
	"context"
	"errors"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Adaptive concurrency, after Vector's adaptive request concurrency (its
// controller.rs), itself after TCP congestion control: AIMD on round-trip
// times. The limit starts at 1. Sends are grouped in windows of one
// (smoothed) round trip; at the end of each window the mean RTT of its
// successful sends is compared with an EWMA of the previous windows':
//
//   - the limit grows by 1 when it was reached in the window (there was more
//     to send than it allowed), nothing pushed back, and the mean RTT did not
//     rise above the EWMA: the destination took more without slowing down;
//   - it shrinks to 90% (at least by 1) when the destination pushed back (a
//     retryable failure: 429, 503, a timeout, a refused connection) or the
//     mean RTT rose beyond the EWMA plus 2.5 deviations: more concurrency
//     only queues requests at the destination, or overloads it.
//
// Vector's defaults are kept (initial 1, decrease ratio 0.9, EWMA alpha 0.4,
// deviation scale 2.5): they come from its simulations. Two differences: an
// RTT equal to the EWMA is not a rise (Vector's >= shrinks a perfectly
// steady destination whenever the limit was not reached); and, as TCP's
// slow start, the limit doubles instead of growing by 1 until its first
// decrease: from 1, +1 per round trip takes a 20 ms receiver a second to
// reach the 50 requests in flight that 1,000 events/s need, and the backlog
// built meanwhile is seconds of latency (measured: p99 0.9 s at 1,000/s;
// docs/benchmarks.md).
const (
	arcDecreaseRatio  = 0.9
	arcEWMAAlpha      = 0.4
	arcDeviationScale = 2.5
)

// sendOutcome is what a send tells the limiter.
type sendOutcome int

const (
	sendIgnored      sendOutcome = iota // no RTT, no push-back: cut by ctx, or refused permanently
	sendOK                              // acknowledged: its RTT counts
	sendBackPressure                    // failed retryably: the destination is down, busy or slow
)

// outcomeOf classifies a Send's result for the limiter. Only the
// destination's push-back (Unavailable, Throttle, network errors and
// timeouts) lowers the limit: a refusal or failure of one object's payload
// (Permanent, or a plain error such as a 500 for that payload) says
// nothing about load, and a misconfigured destination (Destination) is
// probed one batch at a time anyway.
func outcomeOf(ctx context.Context, err error) sendOutcome {
	switch {
	case err == nil:
		return sendOK
	case ctx.Err() != nil:
		return sendIgnored
	}
	var each *sinks.EventErrors
	if errors.As(err, &each) {
		acked := false
		for _, e := range each.Errs {
			switch {
			case e == nil:
				acked = true
			case pushesBack(e):
				return sendBackPressure
			}
		}
		if acked {
			return sendOK
		}
		return sendIgnored
	}
	if pushesBack(err) {
		return sendBackPressure
	}
	return sendIgnored
}

// pushesBack reports whether err says the destination is down, busy or
// slow: Unavailable, Throttle, a network error or a timeout.
func pushesBack(err error) bool {
	var ne net.Error
	return sinks.IsUnavailable(err) || sinks.IsThrottle(err) || errors.As(err, &ne) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// limiter bounds a delivery's concurrency: batches in flight (taken from
// the queue and not yet settled, including those waiting to retry) and
// sends in progress are each at most limit. A batch reserves its slot before
// it is taken, so at a low limit the queue keeps filling the next batch;
// each attempt of a batch takes a send permit, so retries after an outage
// also respect a limit that fell meanwhile. Fixed (workers), limit is max.
type limiter struct {
	mu       sync.Mutex
	adaptive bool
	max      int
	limit    int
	slots    int           // batches reserved or in flight
	sending  int           // Send calls in progress
	waiting  int           // for a send permit
	wake     chan struct{} // closed, then replaced, when a send permit may be free
	slotFree chan struct{} // signalled (non-blocking) when a slot may be free
	now      func() time.Time

	rtt rttWindow
}

// rttWindow is the limiter's current window of round trips, and what
// the past ones left.
type rttWindow struct {
	past     ewmaVar       // RTT of past windows, nanoseconds
	sum      time.Duration // RTTs of this window's successful sends
	n        int           // how many
	pushback bool          // a send was pushed back
	reached  bool          // the limit was reached
	end      time.Time     // when the window ends (once past has a value)
	grown    bool          // the limit decreased once: slow start is over
}

func newLimiter(ceiling int, adaptive bool) *limiter {
	ceiling = min(max(ceiling, 1), 1<<16)
	l := &limiter{adaptive: adaptive, max: ceiling, limit: ceiling, wake: make(chan struct{}), slotFree: make(chan struct{}, 1), now: time.Now}
	if adaptive {
		l.limit = 1
	}
	return l
}

// reserve waits for a batch slot; alone says it is the only one (the
// limit is 1). One goroutine reserves at a time (the delivery's dispatcher).
func (l *limiter) reserve(ctx context.Context) (alone bool, err error) {
	for {
		l.mu.Lock()
		if l.slots < l.limit {
			l.slots++
			alone = l.limit == 1
			l.mu.Unlock()
			return alone, nil
		}
		l.mu.Unlock()
		select {
		case <-l.slotFree:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// unreserve frees a slot: its batch is settled (or was never taken).
func (l *limiter) unreserve() {
	l.mu.Lock()
	l.slots--
	l.mu.Unlock()
	l.signalSlot()
}

func (l *limiter) signalSlot() {
	select {
	case l.slotFree <- struct{}{}:
	default:
	}
}

// acquire waits for a send permit and returns the send's start time.
func (l *limiter) acquire(ctx context.Context) (time.Time, error) {
	l.mu.Lock()
	for l.sending >= l.limit {
		w := l.wake
		l.waiting++
		l.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			l.mu.Lock()
			l.waiting--
			l.mu.Unlock()
			return time.Time{}, ctx.Err()
		}
		l.mu.Lock()
		l.waiting--
	}
	l.sending++
	// Reached: every slot is taken (the one the dispatcher holds while it
	// waits for events included, so the limit may grow one past the
	// demand, as Vector's does) or every permit.
	if l.slots >= l.limit || l.sending >= l.limit {
		l.rtt.reached = true
	}
	start := l.now()
	l.mu.Unlock()
	return start, nil
}

// release returns a send permit with the send's outcome, and ends the RTT
// window (adjusting the limit) when it is over.
func (l *limiter) release(start time.Time, o sendOutcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sending--
	now := l.now()
	switch o {
	case sendOK:
		l.rtt.sum += max(now.Sub(start), 0)
		l.rtt.n++
	case sendBackPressure:
		l.rtt.pushback = true
	}
	grew := false
	switch {
	case !l.rtt.past.ok:
		// No reference yet: the first successful sends make one. Push-back
		// before that changes nothing: the limit is at its initial value.
		if l.rtt.n > 0 {
			l.rtt.past.update(float64(l.rtt.sum / time.Duration(l.rtt.n)))
			l.newWindow(now)
		}
	case !now.Before(l.rtt.end):
		if l.adaptive {
			before := l.limit
			l.adjust()
			grew = l.limit > before
		}
		if l.rtt.n > 0 {
			l.rtt.past.update(float64(l.rtt.sum / time.Duration(l.rtt.n)))
		}
		l.newWindow(now)
	}
	if l.waiting > 0 { // a permit is free
		close(l.wake)
		l.wake = make(chan struct{})
	}
	if grew {
		defer l.signalSlot()
	}
}

func (l *limiter) newWindow(now time.Time) {
	l.rtt.end = now.Add(time.Duration(l.rtt.past.mean))
	l.rtt.sum, l.rtt.n, l.rtt.pushback, l.rtt.reached = 0, 0, false, false
}

// adjust is the AIMD step at the end of a window; mu is held.
func (l *limiter) adjust() {
	// Means in whole nanoseconds: equal round trips compare equal.
	rtt, measured := 0.0, l.rtt.n > 0
	if measured {
		rtt = float64(l.rtt.sum / time.Duration(l.rtt.n))
	}
	switch {
	case l.limit < l.max && l.rtt.reached && !l.rtt.pushback && measured && rtt <= l.rtt.past.mean:
		if l.rtt.grown {
			l.limit++
		} else {
			l.limit = min(2*l.limit, l.max) // slow start
		}
	case l.limit > 1 && (l.rtt.pushback || (measured && rtt > l.rtt.past.mean+arcDeviationScale*math.Sqrt(l.rtt.past.variance))):
		l.limit = max(int(float64(l.limit)*arcDecreaseRatio), 1)
		l.rtt.grown = true
	case l.rtt.pushback:
		l.rtt.grown = true // at 1 already: no doubling into a destination that pushes back
	}
}

// concurrency returns the current limit and the sends in progress.
func (l *limiter) concurrency() (limit, inFlight int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit, l.sending
}

// ewmaVar is an exponentially weighted moving mean and variance.
type ewmaVar struct {
	mean, variance float64
	ok             bool
}

func (e *ewmaVar) update(x float64) {
	if !e.ok {
		e.mean, e.variance, e.ok = x, 0, true
		return
	}
	d := x - e.mean
	inc := arcEWMAAlpha * d
	e.mean += inc
	e.variance = (1 - arcEWMAAlpha) * (e.variance + d*inc)
}

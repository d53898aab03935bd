package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// gate is the destination's health as the delivery sees it. While it
// fails as a whole, one batch at a time probes it, backing off between
// probes; any attempt it answers (an acknowledgement, or a permanent
// refusal) opens the gate again.
type gate struct {
	backoff backoff.Backoff // between probes; set by New
	clock   clock.Clock

	mu      sync.Mutex
	failing bool
	since   time.Time
	probeAt time.Time
	wait    time.Duration // the current probe's backoff; 0 while one object's failure
	active  int           // batches being delivered
	lastErr error         // the destination's last failure while failing

	// probeNew says the next probe of a failing destination is a new
	// object from the queue, not a parked batch (the dispatcher's alone).
	probeNew bool
}

// turn waits until the dispatcher may start a batch: at once while the
// gate is open, else once nothing is in flight and the probe is due.
func (g *gate) turn(ctx context.Context, kick <-chan struct{}) error {
	for {
		g.mu.Lock()
		if !g.failing {
			g.mu.Unlock()
			return nil
		}
		wait := time.Hour // until a batch ends
		if g.active == 0 {
			wait = g.probeAt.Sub(g.clock.Now())
			if wait <= 0 {
				g.mu.Unlock()
				return nil
			}
		}
		g.mu.Unlock()
		t := g.clock.NewTimer(wait)
		select {
		case <-kick:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
	}
}

func (g *gate) begin() {
	g.mu.Lock()
	g.active++
	g.mu.Unlock()
}

func (g *gate) end() {
	g.mu.Lock()
	g.active--
	g.mu.Unlock()
}

// idle reports whether no batch is being delivered.
func (g *gate) idle() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.active == 0
}

// health is the destination's failure while it fails as a whole (not
// one object's).
func (g *gate) health(now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.failing || g.wait == 0 {
		return nil
	}
	// The class, not the error: /readyz is open, and an error may quote
	// what the receiver answered.
	for_ := now.Sub(g.since).Round(time.Second)
	if reason, ok := sinks.DestinationReason(g.lastErr); ok {
		return fmt.Errorf("the destination refuses the sink's requests (%s) for %s", reason, for_)
	}
	return fmt.Errorf("the destination fails for %s", for_)
}

func (g *gate) isFailing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failing
}

// ok records that the destination answered.
func (g *gate) ok(now time.Time, logger *slog.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failing {
		g.failing = false
		if g.wait == 0 {
			return // one object's failure, not the destination's
		}
		logger.Info("the destination takes events again", "failingFor", now.Sub(g.since).Round(time.Millisecond))
	}
}

// fail records that the destination failed as a whole, or may have (wide
// false: one object's first attempt failed without saying why): the next
// probe is due after a backoff (at least delay, a Retry-After), doubled per
// failed probe; after an ambiguous first failure it is due at once (one
// other object tells whether the destination works).
func (g *gate) fail(now time.Time, err error, wide bool, delay time.Duration, logger *slog.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.failing && !wide {
		g.failing, g.since, g.wait, g.probeAt = true, now, 0, now
		return
	}
	if !g.failing || g.wait == 0 { // announced once, when it is more than one object's failure
		if !g.failing {
			g.since = now
		}
		g.backoff.Reset()
		g.wait = g.backoff.Next()
		attrs := []any{"error", err, "retryIn", g.wait}
		if reason, ok := sinks.DestinationReason(err); ok {
			attrs = append(attrs, "reason", reason)
			logger.Warn("the destination refuses the sink's requests ("+reason+"): check the sink's url, route and credentials; events are kept and retried, one batch at a time", attrs...)
		} else {
			logger.Warn("the destination fails; events are kept and retried, one batch at a time", attrs...)
		}
	} else {
		g.wait = g.backoff.Next()
	}
	g.failing, g.lastErr = true, err
	g.probeAt = now.Add(backoff.Jitter(g.wait))
	if d := min(delay, max(g.backoff.Max, g.wait)); now.Add(d).After(g.probeAt) {
		g.probeAt = now.Add(d)
	}
}

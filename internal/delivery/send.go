package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// sender makes the writes to the destination: a send within the rate
// limit and the concurrency limit, a dead-letter put, each under the
// fence and bounded by the hold (Hooks). It decides nothing about what to
// send or retry.
type sender struct {
	name       string
	sink       sinks.Sink
	deadLetter sinks.DeadLetter
	rate       *rate.Limiter // rateLimit: nil for none
	limiter    *limiter
	fence      func() error
	hold       func(ctx context.Context) (context.Context, context.CancelFunc)
	logger     *slog.Logger
	clock      clock.Clock
}

// deadLetterTimeout bounds one write to a dead-letter.
const deadLetterTimeout = 10 * time.Second

// putDeadLetter hands refused events to the dead-letter. One that refuses
// them too (too large, unencodable) gets their envelopes without data, so
// that one event never stalls it.
func (s *sender) putDeadLetter(ctx context.Context, events []*event.Event, cause error) error {
	ctx, cancel := context.WithTimeout(ctx, deadLetterTimeout) // a dead-letter that hangs is a failing one
	defer cancel()
	// A dead-letter write is a send: fenced, and bounded by its hold (a
	// failure here parks the events, retried, never lost).
	ctx, release, err := s.fenced(ctx)
	defer release()
	if err != nil {
		s.logger.Warn("events refused permanently; not written to the dead-letter while the fence is closed: parked", "events", len(events), "first", events[0].ID, "error", err)
		return err
	}
	err = s.deadLetter.Put(ctx, s.name, events, cause)
	if err != nil && ctx.Err() == nil {
		bare := make([]*event.Event, len(events))
		for i, e := range events {
			bare[i] = e.WithoutData()
		}
		if err2 := s.deadLetter.Put(ctx, s.name, bare, fmt.Errorf("%w (data left out: the dead-letter refused it: %v)", cause, err)); err2 == nil {
			err = nil
		} else {
			err = fmt.Errorf("%w; without data: %w", err, err2)
		}
	}
	if err != nil {
		s.logger.Error("events refused permanently; writing them to the dead-letter failed: parked", "events", len(events), "first", events[0].ID, "error", cause, "deadLetterError", err)
		return err
	}
	s.logger.Warn("events refused permanently; sent to the dead-letter", "events", len(events), "first", events[0].ID, "error", cause)
	return nil
}

// fenced is what a write to a destination (a send, a dead-letter put)
// runs under: ctx bounded by the hold (Hooks.Hold), taken before the fence
// (Hooks.Fence) is checked, so that a lapse after the check still cuts the
// write. err is the closed fence's; release ends the hold either way.
func (s *sender) fenced(ctx context.Context) (_ context.Context, release context.CancelFunc, err error) {
	release = func() {}
	if s.hold != nil {
		ctx, release = s.hold(ctx)
	}
	if s.fence != nil {
		if err := s.fence(); err != nil {
			return ctx, release, err
		}
	}
	return ctx, release, nil
}

// fenceRecheck bounds the wait of a batch the fence stopped: a lapsed
// shard resumes within it of its renewal.
const fenceRecheck = 250 * time.Millisecond

// send makes one attempt: a send permit (the concurrency limit, which the
// attempt's outcome adjusts), the fence, then the sink. reached says
// whether the sink was asked.
func (s *sender) send(ctx context.Context, events []*event.Event) (reached bool, _ error) {
	if s.rate != nil {
		// Held, never dropped: the batch waits for its tokens (a refused
		// batch split in parts takes a token per event again).
		if err := s.tokens(ctx, min(len(events), s.rate.Burst())); err != nil {
			return false, err
		}
	}
	start, err := s.limiter.acquire(ctx)
	if err != nil {
		return false, err
	}
	outcome := sendIgnored
	defer func() { s.limiter.release(start, outcome) }()
	sctx, release, err := s.fenced(ctx)
	defer release()
	if err != nil {
		return false, err
	}
	err = s.safeSend(sctx, events)
	if err != nil && sctx.Err() != nil && ctx.Err() == nil {
		// The hold lapsed mid-send: the batch waits for the fence to open
		// again (the destination may have taken it: sent again then, under
		// the same ids).
		return false, fmt.Errorf("send cut short: %w", context.Cause(sctx))
	}
	outcome = outcomeOf(ctx, err)
	return true, err
}

// tokens waits, on the engine's clock, for n tokens of the rate limit
// (n at most its burst).
func (s *sender) tokens(ctx context.Context, n int) error {
	now := s.clock.Now()
	r := s.rate.ReserveN(now, n)
	if !r.OK() {
		return fmt.Errorf("rate limit: %d events at once exceed its burst", n)
	}
	wait := r.DelayFrom(now)
	if wait <= 0 {
		return nil
	}
	t := s.clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		r.CancelAt(s.clock.Now())
		return ctx.Err()
	}
}

// safeSend turns a panicking sink into an error, so one bad sink cannot
// take the bridge down.
func (s *sender) safeSend(ctx context.Context, batch []*event.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errors.New("sink panicked: " + fmtAny(p))
		}
	}()
	return s.sink.Send(ctx, batch)
}

func fmtAny(v any) string {
	if err, ok := v.(error); ok {
		return err.Error()
	}
	if s, ok := v.(string); ok {
		return s
	}
	return "non-error value"
}

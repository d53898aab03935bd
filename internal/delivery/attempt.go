package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// attempt sends the batch's events that are not quiet, once the intent is
// written and the fence open, and returns each event's outcome (errs[i]
// for events[i]; nil for quiet ones; errs nil: all settled) and, when the
// sink failed the batch as a whole, that error. ok is false when ctx ended
// first.
func (d *Delivery) attempt(ctx context.Context, b *batch, events []*event.Event) (errs []error, whole error, ok bool) {
	send := loud(events)
	if !d.batching.ordered && len(send) > len(b.objects) && !oneEach(b) {
		return d.inTurns(ctx, b, events)
	}
	ok, err := d.reach(ctx, b, events, send)
	if !ok {
		return nil, nil, false
	}
	return spread(events, send, err), wholeError(err, len(send)), true
}

// loud returns events without the quiet ones (events itself when none
// is).
func loud(events []*event.Event) []*event.Event {
	for i, e := range events {
		if e.Quiet {
			send := make([]*event.Event, i, len(events))
			copy(send, events[:i])
			for _, e := range events[i+1:] {
				if !e.Quiet {
					send = append(send, e)
				}
			}
			return send
		}
	}
	return events
}

// oneEach says whether no object of b has more than one event to send.
func oneEach(b *batch) bool {
	for _, o := range b.objects {
		n := 0
		for _, e := range o.events {
			if !e.Quiet {
				n++
			}
		}
		if n > 1 {
			return false
		}
	}
	return true
}

// inTurns sends a batch holding several events of an object (a retry with
// the events queued behind it, a take of an object's consecutive events)
// in turns, each with at most one event of each object, as Send's contract
// says: an object's next event goes in the turn after the destination took
// the one before it or refused it for good; after any other failure its
// later events are not sent. A first turn of several events failed as a
// whole fails the batch as a whole, as one send would (a permanent
// refusal is then split to find its cause); a turn of one event refused
// for good is that event's refusal.
func (d *Delivery) inTurns(ctx context.Context, b *batch, events []*event.Event) (errs []error, whole error, ok bool) {
	errs = make([]error, len(events))
	next := make([]int, len(b.objects)) // index in events of each object's next event; its end once done
	ends := make([]int, len(b.objects))
	off := 0
	for k, o := range b.objects {
		next[k], ends[k] = off, off+len(o.events)
		off = ends[k]
	}
	var turn []*event.Event
	var of []int // the object of each event of the turn
	failed := false
	for first := true; ; first = false {
		turn, of = turn[:0], of[:0]
		for k := range next {
			for next[k] < ends[k] && events[next[k]].Quiet { // never sent: settled
				next[k]++
			}
			if next[k] < ends[k] {
				turn, of = append(turn, events[next[k]]), append(of, k)
			}
		}
		if len(turn) == 0 {
			break
		}
		ok, err := d.reach(ctx, b, events, turn)
		if !ok {
			return nil, nil, false
		}
		whole := wholeError(err, len(turn))
		switch {
		case whole == nil:
		case len(turn) == 1 && sinks.IsPermanent(err):
			// One event refused for good: its own refusal, however the
			// sink said it; the object's next events go on.
		case first:
			return spread(events, loud(events), err), err, true
		case sinks.IsPermanent(err):
			// A later turn refused as a whole for good: one of its events
			// is the cause, which the next attempt (a first turn, split
			// when refused as a whole) finds; none is refused for it now.
			err = fmt.Errorf("not sent: the events were refused together, retried apart: %v", err)
		}
		each := spread(turn, turn, err)
		for j, k := range of {
			i := next[k]
			next[k]++
			if each == nil || each[j] == nil {
				continue
			}
			errs[i], failed = each[j], true
			if sinks.IsPermanent(each[j]) {
				continue // refused for good: the object's next events go on
			}
			held := fmt.Errorf("not sent: an earlier event of the object failed: %w", each[j])
			for ; next[k] < ends[k]; next[k]++ {
				if !events[next[k]].Quiet {
					errs[next[k]] = held
				}
			}
		}
	}
	if !failed {
		return nil, nil, true
	}
	return errs, nil, true
}

// reach sends send (events without the quiet ones) once the write-ahead
// intent for events is written and the fence is open, the batch waiting in
// its slot meanwhile: neither is the destination's failure. ok is false
// when ctx ended first.
func (d *Delivery) reach(ctx context.Context, b *batch, events, send []*event.Event) (ok bool, err error) {
	waits := d.retry.backoff // from Initial: this batch's own waits while it cannot be sent
	var logged time.Time
	for tries := 1; ; tries++ {
		var err error
		start := d.clock.Now()
		if !b.prepared {
			if err = d.hooks.BeforeSend(ctx, events); err == nil {
				b.prepared = true
			}
		}
		if err == nil {
			if len(send) == 0 {
				return true, nil // all quiet: nothing to send, all settled
			}
			var reached bool
			if reached, err = d.sender.send(ctx, send); reached {
				return ctx.Err() == nil || err == nil, err
			}
		}
		if ctx.Err() != nil {
			return false, nil
		}
		// Not the destination's failure: the batch waits in its slot.
		if tries == 1 || d.clock.Since(logged) >= 30*time.Second {
			logged = d.clock.Now()
			d.logger.Warn("not sending yet; waiting", "attempt", tries, "events", len(send), "error", err)
		}
		wait := backoff.Jitter(waits.Next())
		if b.prepared {
			// The fence (or the hold) stopped it: it opens again at a
			// renewal, and the fence is a cheap check, so look often.
			wait = min(wait, fenceRecheck)
		}
		t := d.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.C():
		}
		if !b.since.IsZero() {
			b.since = b.since.Add(d.clock.Since(start)) // maxElapsed counts the destination's failures only
		}
	}
}

// spread maps a Send's result for send (events without the quiet ones)
// back onto events.
func spread(events, send []*event.Event, err error) []error {
	if err == nil {
		return nil // all delivered
	}
	errs := make([]error, len(events))
	var each *sinks.EventErrors
	per := errors.As(err, &each) && len(each.Errs) == len(send)
	j := 0
	for i, e := range events {
		if j < len(send) && send[j] == e {
			if per {
				errs[i] = each.Errs[j]
			} else {
				errs[i] = err
			}
			j++
		}
	}
	return errs
}

// wholeError returns err when it is not per event.
func wholeError(err error, n int) error {
	var each *sinks.EventErrors
	if err == nil || (errors.As(err, &each) && len(each.Errs) == n) {
		return nil
	}
	return err
}

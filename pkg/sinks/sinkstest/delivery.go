package sinkstest

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Delivery is the kit's own delivery loop around a sink: what the
// bridge's engine promises a sink (the Sink contract), in few lines, so
// that a sink is tested against the contract without the bridge's runtime.
// It keeps order per object: a batch holds one event of each object (an
// Ordered sink's, an object's pending events together), and an object is
// never in two batches in flight; it runs as many Sends at once as the sink's config allows
// (config.Sink.InFlight); it retries failed events with exponential
// backoff from the config's retry settings, waiting at least what a
// Throttle asks; it sends the events of a batch refused permanently as a
// whole one by one until the culprit is alone; it hands Permanent events
// to the dead-letter (without one it keeps them, retried at the retry
// maxInterval); while the destination as a whole fails (Unavailable,
// Throttle, a network error, a Destination refusal) it sends one batch at
// a time, backing off, until one gets through; and past the queue's
// capacity it coalesces each object's pending events (event.Coalesce), so
// memory is bounded by objects.
//
// It is not the bridge's engine (no adaptive concurrency, rate limit,
// update window, checkpoint or batching wait): what it measures is the
// sink.
type Delivery struct {
	sink     sinks.Sink
	dl       sinks.DeadLetter
	name     string
	capacity int
	maxBatch int
	ordered  bool // the sink is sinks.Ordered: an object's events go together
	retry    config.Retry
	wake     chan struct{} // work may be ready; one token wakes one worker

	mu       sync.Mutex
	keys     []string                  // objects with pending events, roughly in arrival order
	listed   map[string]bool           // keys holds the object
	pending  map[string][]*event.Event // per object, in order, not in flight
	busy     map[string]bool           // objects with a batch in flight
	parked   map[string]parking        // objects waiting out a backoff
	queued   int                       // events in pending
	inFlight int                       // events in batches in flight
	down     int                       // the destination's failures in a row (0: up)
	probeAt  time.Time                 // while down, when the next batch may go
	probing  bool                      // while down, a batch is in flight
	stats    Stats
}

type parking struct {
	until    time.Time
	failures int
}

// Stats counts what a Delivery did.
type Stats struct {
	Delivered    int // events the sink acknowledged
	Retried      int // events that failed retryably (each attempt)
	Failed       int // events refused permanently
	DeadLettered int // events the dead-letter took
	Coalesced    int // pending events merged into a newer one past the capacity
}

// Start runs a Delivery of the events offered to it into sink, configured
// by cfg's queue, retry and concurrency settings, until the test ends;
// then it stops and closes the sink. dl may be nil.
func Start(t testing.TB, cfg config.Sink, sink sinks.Sink, dl sinks.DeadLetter) *Delivery {
	d := &Delivery{sink: sink, dl: dl, name: cfg.Name, capacity: cfg.Queue.Capacity, maxBatch: sinks.MaxBatch, retry: cfg.Retry,
		wake: make(chan struct{}, 1), listed: map[string]bool{}, pending: map[string][]*event.Event{},
		busy: map[string]bool{}, parked: map[string]parking{}}
	if d.capacity <= 0 {
		d.capacity = config.DefaultQueueCapacity
	}
	if b, ok := sink.(sinks.Batcher); ok {
		if n, _ := b.Batching(); n > 0 {
			d.maxBatch = n
		}
	}
	if o, ok := sink.(sinks.Ordered); ok {
		d.ordered = o.Ordered()
	}
	workers, _ := cfg.InFlight()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.work(ctx)
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = sink.Close(context.Background())
	})
	return d
}

// Offer queues e behind the object's pending events.
func (d *Delivery) Offer(e *event.Event) {
	d.mu.Lock()
	k := e.Key()
	evs := d.pending[k]
	if last := len(evs) - 1; d.queued >= d.capacity && last >= 0 && evs[last].QueueKey() == e.QueueKey() {
		merged, keep := event.Coalesce(evs[last], e)
		d.stats.Coalesced++
		if keep {
			evs[last] = merged
		} else { // a fresh added and its deletion cancel out
			evs = evs[:last]
			d.queued--
			d.stats.Coalesced++
		}
		d.pending[k] = evs
	} else {
		d.enqueue(k, e)
	}
	d.mu.Unlock()
	d.signal()
}

// Pending is how many events are queued or in flight.
func (d *Delivery) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queued + d.inFlight
}

// Stats returns the counts so far.
func (d *Delivery) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// enqueue appends evs to k's pending events; d.mu is held.
func (d *Delivery) enqueue(k string, evs ...*event.Event) {
	d.pending[k] = append(d.pending[k], evs...)
	d.queued += len(evs)
	d.list(k)
}

// list makes sure keys holds k; d.mu is held.
func (d *Delivery) list(k string) {
	if !d.listed[k] {
		d.listed[k] = true
		d.keys = append(d.keys, k)
	}
}

func (d *Delivery) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// work sends batches until ctx ends.
func (d *Delivery) work(ctx context.Context) {
	for {
		batch, next, probe := d.take(time.Now())
		if batch == nil {
			wait := time.Hour // until an Offer or a settled batch wakes it
			if !next.IsZero() {
				wait = time.Until(next)
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-d.wake:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		d.signal() // there may be more for another worker
		d.send(ctx, batch, probe)
	}
}

// take returns the next batch: the first pending event of each object
// neither in flight nor parked (all its pending events for an Ordered
// sink), up to maxBatch; next is when the first parked object is due when
// none is ready. While the destination is down it is one batch at a
// time, the probe.
func (d *Delivery) take(now time.Time) (batch []*event.Event, next time.Time, probe bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down > 0 {
		if d.probing {
			return nil, time.Time{}, false // the probe's outcome wakes the workers
		}
		if now.Before(d.probeAt) {
			return nil, d.probeAt, false
		}
	}
	kept := d.keys[:0]
	for _, k := range d.keys {
		evs := d.pending[k]
		if len(evs) == 0 {
			delete(d.pending, k)
			delete(d.listed, k)
			continue
		}
		kept = append(kept, k)
		if d.busy[k] || len(batch) == d.maxBatch {
			continue
		}
		if p, ok := d.parked[k]; ok && now.Before(p.until) {
			if next.IsZero() || p.until.Before(next) {
				next = p.until
			}
			continue
		}
		n := 1
		if d.ordered {
			n = min(len(evs), d.maxBatch-len(batch))
		}
		batch = append(batch, evs[:n]...)
		d.pending[k] = evs[n:]
		d.busy[k] = true
	}
	d.keys = kept
	d.queued -= len(batch)
	d.inFlight += len(batch)
	if d.down > 0 && len(batch) > 0 {
		d.probing, probe = true, true
	}
	return batch, next, probe
}

// send sends batch and settles each event's outcome.
func (d *Delivery) send(ctx context.Context, batch []*event.Event, probe bool) {
	err := d.sink.Send(ctx, batch)
	if ctx.Err() != nil {
		d.settle(batch, outcomes(ctx.Err(), len(batch)), probe)
		return
	}
	if sinks.IsPermanent(err) && len(batch) > 1 && !isPerEvent(err, len(batch)) {
		// Refused as a whole: one of them is the culprit. Each alone, in
		// order; an object whose event fails keeps its later ones behind.
		errs := make([]error, len(batch))
		failed := map[string]bool{}
		for i, e := range batch {
			if failed[e.Key()] {
				errs[i] = errBehind
				continue
			}
			errs[i] = outcomes(d.sink.Send(ctx, batch[i:i+1]), 1)[0]
			if errs[i] != nil && !sinks.IsPermanent(errs[i]) {
				failed[e.Key()] = true
			}
		}
		d.settle(batch, errs, probe)
		return
	}
	d.settle(batch, outcomes(err, len(batch)), probe)
}

// errBehind is the outcome of an event not sent because an earlier event
// of its object failed.
var errBehind = errors.New("behind a failed event of its object")

// outcomes is err as one outcome per event of a batch of n.
func outcomes(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var ee *sinks.EventErrors
	if errors.As(err, &ee) && len(ee.Errs) == n {
		copy(errs, ee.Errs)
		return errs
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

func isPerEvent(err error, n int) bool {
	var ee *sinks.EventErrors
	return errors.As(err, &ee) && len(ee.Errs) == n
}

// settle records the outcome of batch: acknowledged events are done,
// Permanent ones go to the dead-letter, the others (and the later events
// of their objects) go back in front of their objects' pending events,
// which wait out a backoff.
func (d *Delivery) settle(batch []*event.Event, errs []error, probe bool) {
	var delivered, retried, failed, deadLettered int
	var throttle time.Duration
	down := false                       // the destination as a whole failed
	back := map[string][]*event.Event{} // per failed object, in order
	kept := map[string]bool{}           // failed objects with an event refused for good and no dead-letter taking it
	for i, e := range batch {
		k, err := e.Key(), errs[i]
		if _, behind := back[k]; behind {
			back[k] = append(back[k], e)
			continue
		}
		switch {
		case err == nil:
			delivered++
			continue
		case sinks.IsPermanent(err):
			failed++
			if d.dl != nil {
				if d.dl.Put(context.Background(), d.name, []*event.Event{e}, err) == nil {
					deadLettered++
					continue
				}
			}
			kept[k] = true
		default:
			retried++
			throttle = max(throttle, sinks.ThrottleDelay(err))
			down = down || destinationWide(err)
		}
		if e.Fresh { // it may have landed: never cancel it out with a deletion
			e = e.WithFresh(false)
		}
		back[k] = append(back[k], e)
	}

	d.mu.Lock()
	now := time.Now()
	if probe {
		d.probing = false
	}
	switch {
	case delivered > 0:
		d.down = 0
	case down:
		d.down++
		d.probeAt = now.Add(max(d.backoff(d.down), throttle))
	}
	d.inFlight -= len(batch)
	d.stats.Delivered += delivered
	d.stats.Retried += retried
	d.stats.Failed += failed
	d.stats.DeadLettered += deadLettered
	for _, e := range batch {
		k := e.Key()
		delete(d.busy, k)
		if _, ok := back[k]; !ok {
			delete(d.parked, k) // it worked: the next failure backs off from the start
		}
	}
	for k, evs := range back {
		p := d.parked[k]
		p.failures++
		wait := max(d.backoff(p.failures), throttle)
		if kept[k] {
			wait = d.backoff(math.MaxInt)
		}
		p.until = now.Add(wait)
		d.parked[k] = p
		queued := len(d.pending[k])
		evs = append(evs, d.pending[k]...)
		if d.queued+len(evs)-queued > d.capacity { // past capacity the retried events fold with the newer ones
			var coalesced, cancelled uint64
			evs, coalesced, cancelled = event.Fold(evs)
			d.stats.Coalesced += int(coalesced + cancelled)
		}
		d.pending[k] = evs
		d.queued += len(evs) - queued
		d.list(k)
	}
	d.mu.Unlock()
	d.signal()
}

// destinationWide says whether err is a failure of the destination as a
// whole rather than of the events sent.
func destinationWide(err error) bool {
	var ne net.Error
	_, dest := sinks.DestinationReason(err)
	return sinks.IsUnavailable(err) || sinks.IsThrottle(err) || errors.As(err, &ne) || (dest && !sinks.IsObjectTarget(err))
}

// backoff is the wait after an object's n-th failure in a row: the retry's
// initial interval doubled per failure, up to its max interval.
func (d *Delivery) backoff(n int) time.Duration {
	w, limit := d.retry.InitialInterval.D(), d.retry.MaxInterval.D()
	if w <= 0 {
		w = config.DefaultInitialInterval
	}
	if limit <= 0 {
		limit = config.DefaultMaxInterval
	}
	for i := 1; i < n && w < limit; i++ {
		w *= 2
	}
	return max(min(w, limit), time.Millisecond)
}

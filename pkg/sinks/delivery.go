package sinks

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/queue"
)

// MaxBatch is the most events handed to one Send when the sink does not
// say otherwise (see Batcher).
const MaxBatch = 256

// Batcher is implemented by sinks that want batches of their own size,
// waiting up to maxWait for a batch to fill (a webhook's batch mode).
type Batcher interface {
	Batching() (maxEvents int, maxWait time.Duration)
}

// DeadLetter receives events a sink refused permanently, with the error.
type DeadLetter interface {
	Put(ctx context.Context, sink string, events []*event.Event, cause error) error
}

// Delivery owns one sink's queue and the batches in flight from it to the
// sink: batches in queue order, retried with exponential backoff and
// jitter until acknowledged; permanent refusals go to the dead-letter. The
// informer side only calls Offer, which never blocks.
//
// Quiet events (transitions the rule does not send) pass through the queue
// like the others, so that OnAck reports every transition in order, but are
// never handed to the sink. OnAck reports a batch once every event in it
// was acknowledged or dead-lettered; events of a batch that fared
// differently (EventErrors) are settled one by one, and only the failed
// ones are retried.
//
// Several batches may be in flight at once: as many as the sink's fixed
// workers, or an adaptive number (see limiter) up to its concurrency.max.
// Order per object holds because taking a batch holds its objects
// (event.Key) in the queue until the batch is settled: no other batch gets
// an event of theirs meanwhile, and the queue keeps each object's events in
// order (they still coalesce while they wait).
type Delivery struct {
	Name string

	queue      *queue.Queue[*event.Event]
	limiter    *limiter
	sink       Sink
	retry      config.Retry
	batchMax   int
	batchWait  time.Duration
	deadLetter DeadLetter
	logger     *slog.Logger

	// OnAck, when set before Run, is called after each acknowledged batch with
	// its events (checkpoints; latency metrics: now minus each event's Time).
	// Batches in flight at once call it concurrently; it must be quick.
	OnAck func(events []*event.Event)
	// BeforeSend, when set before Run, is called once with a whole batch
	// (quiet events included) before it is first sent; while it fails, the
	// batch is retried with backoff, never dead-lettered (the destination
	// was not asked).
	BeforeSend func(ctx context.Context, events []*event.Event) error
	// Fence, when set before Run, is checked before every send attempt; while
	// it fails (e.g. this replica may not be the leader), nothing is sent and
	// the batch waits, as with BeforeSend, until the fence opens or Run's
	// context ends (the bridge cancels it when the lease is lost).
	Fence func() error

	delivered, failed, retried, deadLettered atomic.Uint64
	inFlight                                 atomic.Int64 // events taken from the queue, not yet settled
	done                                     chan struct{}
	runOnce                                  sync.Once
}

// NewDelivery prepares delivery of cfg's queue into sink; Run starts it.
// deadLetter may be nil (refusals are then logged and counted only).
func NewDelivery(cfg config.Sink, sink Sink, deadLetter DeadLetter, logger *slog.Logger) *Delivery {
	d := &Delivery{
		Name:       cfg.Name,
		queue:      queue.New(cfg.Queue.Capacity, Coalesce),
		limiter:    newLimiter(cfg.InFlight()),
		sink:       sink,
		retry:      cfg.Retry,
		batchMax:   MaxBatch,
		deadLetter: deadLetter,
		logger:     logger.With("sink", cfg.Name),
		done:       make(chan struct{}),
	}
	if b, ok := sink.(Batcher); ok {
		d.batchMax, d.batchWait = b.Batching()
		d.batchMax = max(d.batchMax, 1)
	}
	return d
}

// Coalesce merges a pending event with a newer one for the same
// incarnation of an object (the queue never merges two uids: a replaced
// object's deleted and the new one's added both stay). The newer state
// wins, but an object the consumer has not been sent yet stays added, and
// a change that was to be sent is not made quiet by a newer one that is
// not (e.g. an update outside the rule's changed paths). A fresh added
// (the sink held nothing of the object) and its deletion cancel out: keep
// is false and neither is sent. Items in the queue were never attempted (a
// batch being retried is held by the delivery, not queued), so neither the
// consumer nor the checkpoint misses anything.
func Coalesce(pending, newer *event.Event) (merged *event.Event, keep bool) {
	if pending.Change == event.Added && pending.Fresh && newer.Change == event.Deleted {
		return nil, false
	}
	if pending.Change == event.Added && newer.Change == event.Updated && !pending.Quiet {
		return event.Build(newer.RuleInfo(), event.Transition{Change: event.Added, Object: newer.Object(), Time: newer.Time,
			Entered: pending.Entered, Replay: newer.Replay, Fresh: pending.Fresh}), true
	}
	// What merges into a pending event that is not a fresh added is not
	// fresh either: a deletion queued before it (the object left the view,
	// then came back) must still reach the consumer.
	if newer.Fresh && !(pending.Change == event.Added && pending.Fresh) {
		newer = newer.WithFresh(false)
	}
	if pending.Change == newer.Change && newer.Quiet && !pending.Quiet {
		return newer.WithQuiet(false), true
	}
	return newer, true
}

// Offer enqueues an event. It never blocks.
func (d *Delivery) Offer(ev *event.Event) { d.queue.OfferIn(ev.Key, ev.QueueKey, ev) }

// Close stops accepting events; Run drains what is queued, then returns.
func (d *Delivery) Close() { d.queue.Close() }

// Stats are a delivery's counts.
type Stats struct {
	Delivered, Failed, Retried, DeadLettered uint64
	Queue                                    queue.Stats
	Pending                                  int // queued or in flight
	Capacity                                 int
}

// Stats returns the delivery's counts.
func (d *Delivery) Stats() Stats {
	return Stats{Delivered: d.delivered.Load(), Failed: d.failed.Load(), Retried: d.retried.Load(), DeadLettered: d.deadLettered.Load(),
		Pending: d.Pending(), Queue: d.queue.Stats(), Capacity: d.queue.Capacity()}
}

// Pending counts events not yet acknowledged: queued or in flight.
func (d *Delivery) Pending() int { return d.queue.Len() + int(d.inFlight.Load()) }

// Concurrency returns how many sends may be in progress at once now (fixed
// with workers, else adapting between 1 and concurrency.max) and how many
// are.
func (d *Delivery) Concurrency() (limit, inFlight int) { return d.limiter.concurrency() }

// Run delivers until ctx ends or the queue is closed and drained, then
// returns. A batch cut short by ctx is not acknowledged: it stays counted as
// pending and is never counted as delivered.
func (d *Delivery) Run(ctx context.Context) {
	d.runOnce.Do(func() {
		defer close(d.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		work, quit := make(chan batch), make(chan struct{})
		defer close(quit)
		var buf []queue.Item[*event.Event]
		for {
			// The slot first: while none is free the queue keeps filling
			// the next batch.
			alone, err := d.limiter.reserve(ctx)
			if err != nil {
				return
			}
			b, err := d.take(ctx, &buf)
			if err != nil {
				d.limiter.unreserve()
				return
			}
			d.inFlight.Add(int64(len(b.events)))
			if alone { // one at a time: nothing to hand it to
				d.run(ctx, b)
				continue
			}
			select {
			case work <- b: // an idle worker
			default:
				wg.Add(1)
				go func() {
					defer wg.Done()
					d.worker(ctx, b, work, quit)
				}()
			}
		}
	})
}

// workerIdle is how long a worker without a batch waits for one before it
// ends: the workers of a sink that was busy do not stay forever.
const workerIdle = 30 * time.Second

// worker runs batches until it has been idle for workerIdle or Run ends.
// Workers live on so that a batch does not pay for a new goroutine and its
// stack growth; there are at most about as many as batches were in flight
// at once.
func (d *Delivery) worker(ctx context.Context, b batch, work <-chan batch, quit <-chan struct{}) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		d.run(ctx, b)
		idle.Reset(workerIdle)
		select {
		case b = <-work:
		case <-idle.C:
			return
		case <-quit:
			return
		case <-ctx.Done():
			return
		}
	}
}

// run delivers a batch and frees its slot and, once it is acknowledged,
// its objects. A batch cut by ctx stays pending, its objects held.
func (d *Delivery) run(ctx context.Context, b batch) {
	defer d.limiter.unreserve()
	if d.deliver(ctx, b.events) {
		d.inFlight.Add(-int64(len(b.events)))
		d.queue.Release(b.holds...)
	}
}

// Done is closed when Run has returned.
func (d *Delivery) Done() <-chan struct{} { return d.done }

// batch is a batch in flight: its events, and its holds on their objects.
type batch struct {
	events []*event.Event
	holds  []queue.Hold[*event.Event]
}

// take waits for a batch, then waits up to batchWait for a partial one to
// fill. An error means the queue is closed and drained, or ctx ended.
func (d *Delivery) take(ctx context.Context, buf *[]queue.Item[*event.Event]) (batch, error) {
	var b batch
	add := func(items []queue.Item[*event.Event]) {
		for _, it := range items {
			b.events = append(b.events, it.Value)
			if it.Holds() {
				b.holds = append(b.holds, it.Hold)
			}
		}
	}
	items, err := d.queue.TakeHeld(ctx, d.batchMax, *buf)
	*buf = items
	if err != nil {
		return b, err
	}
	size := len(items)
	if d.batchWait > 0 {
		size = min(d.batchMax, MaxBatch) // room to fill, not a huge batch's worth
	}
	b.events = make([]*event.Event, 0, size)
	add(items)
	if d.batchWait > 0 && len(b.events) < d.batchMax {
		wctx, cancel := context.WithTimeout(ctx, d.batchWait)
		for len(b.events) < d.batchMax {
			more, err := d.queue.TakeHeld(wctx, d.batchMax-len(b.events), *buf)
			*buf = more
			if err != nil {
				break
			}
			add(more)
		}
		cancel()
	}
	return b, nil
}

// deliver sends one batch until each of its events is acknowledged or
// permanently refused, or ctx ends (then it returns false and nothing of
// the batch is reported to OnAck).
func (d *Delivery) deliver(ctx context.Context, batch []*event.Event) bool {
	pending := batch // what is left to send, quiet events left out
	for i, e := range batch {
		if e.Quiet {
			pending = make([]*event.Event, i, len(batch))
			copy(pending, batch[:i])
			for _, e := range batch[i+1:] {
				if !e.Quiet {
					pending = append(pending, e)
				}
			}
			break
		}
	}
	wait := d.retry.InitialInterval.D()
	// A dead-letter says the destination would not take the events, so only
	// the destination's own failures lead there: a permanent refusal, or
	// failing for longer than maxElapsed. That time counts the stretches of
	// attempts that reached the sink, each from its first attempt; attempts
	// stopped before it (the write-ahead intent not written, the fence
	// closed) keep the batch waiting without counting, since the
	// destination was never asked meanwhile.
	var refusing time.Duration
	var stretch time.Time // start of the current stretch; zero when the last attempt did not reach the sink
	prepared := d.BeforeSend == nil
	for attempt := 1; !prepared || len(pending) > 0; attempt++ {
		var err error
		at, reached := time.Now(), false
		if !prepared {
			if err = d.BeforeSend(ctx, batch); err == nil {
				prepared = true
				if len(pending) == 0 {
					break
				}
			}
		}
		if prepared && err == nil {
			reached, err = d.send(ctx, pending)
		}
		if err == nil {
			d.delivered.Add(uint64(len(pending)))
			break
		}
		if ctx.Err() != nil {
			return false
		}
		switch {
		case reached && stretch.IsZero():
			stretch = at
		case !reached && !stretch.IsZero():
			refusing += at.Sub(stretch)
			stretch = time.Time{}
		}
		var each *EventErrors
		if errors.As(err, &each) && len(each.Errs) == len(pending) {
			var ok bool
			if pending, err, ok = d.settle(ctx, pending, each.Errs); !ok {
				return false
			}
			if len(pending) == 0 {
				break
			}
		}
		if reached && (IsPermanent(err) || (d.retry.MaxElapsed > 0 && refusing+time.Since(stretch) > d.retry.MaxElapsed.D())) {
			if !d.refuse(ctx, pending, err) {
				return false
			}
			break
		}
		d.retried.Add(1)
		delay := wait/2 + rand.N(wait/2+1) // jitter: [wait/2, wait]
		var te throttleError
		if errors.As(err, &te) && te.delay > delay {
			delay = min(te.delay, max(d.retry.MaxInterval.D(), wait)) // a Retry-After never parks the sink longer than its own backoff would
		}
		if attempt == 1 || attempt%10 == 0 {
			d.logger.Warn("delivery failed; retrying", "attempt", attempt, "events", len(pending), "retryIn", delay, "error", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		wait = min(2*wait, d.retry.MaxInterval.D())
	}
	if d.OnAck != nil {
		d.OnAck(batch)
	}
	return true
}

// settle counts the acknowledged events of a partly failed send, hands the
// permanently refused ones to the dead-letter, and returns the ones to
// retry (in order) with their first error; ok is false when ctx ended.
func (d *Delivery) settle(ctx context.Context, events []*event.Event, errs []error) (retry []*event.Event, _ error, ok bool) {
	var refused []*event.Event
	var retryErr, refusedErr error
	for i, e := range events {
		switch err := errs[i]; {
		case err == nil:
			d.delivered.Add(1)
		case IsPermanent(err):
			refused = append(refused, e)
			if refusedErr == nil {
				refusedErr = err
			}
		default:
			retry = append(retry, e)
			if retryErr == nil {
				retryErr = err
			}
		}
	}
	if len(refused) > 0 && !d.refuse(ctx, refused, refusedErr) {
		return nil, nil, false
	}
	return retry, retryErr, true
}

// refuse hands permanently refused events to the dead-letter. A dead-letter
// that cannot take them is retried with backoff (they count as handled only
// once it has them); it returns false only when ctx ends first.
func (d *Delivery) refuse(ctx context.Context, batch []*event.Event, cause error) bool {
	d.failed.Add(uint64(len(batch)))
	if d.deadLetter == nil {
		d.logger.Error("events refused permanently and dropped (no deadLetter configured)", "events", len(batch), "first", batch[0].ID, "error", cause)
		return true
	}
	wait := d.retry.InitialInterval.D()
	for attempt := 1; ; attempt++ {
		err := d.deadLetter.Put(ctx, d.Name, batch, cause)
		if err == nil {
			break
		}
		if attempt == 1 || attempt%10 == 0 {
			d.logger.Error("events refused permanently; writing them to the dead-letter failed, retrying", "events", len(batch), "first", batch[0].ID, "error", cause, "deadLetterError", err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, d.retry.MaxInterval.D())
	}
	d.deadLettered.Add(uint64(len(batch)))
	d.logger.Warn("events refused permanently; sent to the dead-letter", "events", len(batch), "first", batch[0].ID, "error", cause)
	return true
}

// send makes one attempt: a send permit (the concurrency limit, which the
// attempt's outcome adjusts), the fence, then the sink. reached says
// whether the sink was asked.
func (d *Delivery) send(ctx context.Context, events []*event.Event) (reached bool, _ error) {
	start, err := d.limiter.acquire(ctx)
	if err != nil {
		return false, err
	}
	outcome := sendIgnored
	defer func() { d.limiter.release(start, outcome) }()
	if d.Fence != nil {
		if err := d.Fence(); err != nil {
			return false, err
		}
	}
	err = d.safeSend(ctx, events)
	outcome = outcomeOf(ctx, err)
	return true, err
}

// safeSend turns a panicking sink into an error, so one bad sink cannot
// take the bridge down.
func (d *Delivery) safeSend(ctx context.Context, batch []*event.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errors.New("sink panicked: " + fmtAny(p))
		}
	}()
	return d.sink.Send(ctx, batch)
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

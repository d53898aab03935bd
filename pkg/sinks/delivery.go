package sinks

import (
	"context"
	"errors"
	"hash/maphash"
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

// Delivery owns one sink's queue(s) and the workers that drain them into
// the sink: batches in queue order, retried with exponential backoff and
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
// With several workers, each has its own queue and an object's events
// always hash to the same one: a key is never in flight twice and order
// per object holds. Capacity is split evenly between the workers.
type Delivery struct {
	Name string

	shards     []*shard
	seed       maphash.Seed
	sink       Sink
	retry      config.Retry
	batchMax   int
	batchWait  time.Duration
	deadLetter DeadLetter
	logger     *slog.Logger

	// OnAck, when set before Run, is called after each acknowledged batch with
	// its events (checkpoints; latency metrics: now minus each event's Time).
	// It runs on the worker and must be quick.
	OnAck func(events []*event.Event)
	// BeforeSend, when set before Run, is called once with a whole batch
	// (quiet events included) before it is first sent; while it fails, the
	// batch is retried as if the sink had failed.
	BeforeSend func(ctx context.Context, events []*event.Event) error
	// Fence, when set before Run, is checked before every send attempt; while
	// it fails (e.g. this replica may not be the leader), nothing is sent.
	Fence func() error

	delivered, failed, retried, deadLettered atomic.Uint64
	done                                     chan struct{}
	runOnce                                  sync.Once
}

type shard struct {
	queue    *queue.Queue[*event.Event]
	inFlight atomic.Int64 // taken from the queue, not yet acknowledged
}

// NewDelivery prepares delivery of cfg's queue into sink; Run starts it.
// deadLetter may be nil (refusals are then logged and counted only).
func NewDelivery(cfg config.Sink, sink Sink, deadLetter DeadLetter, logger *slog.Logger) *Delivery {
	workers := max(cfg.Workers, 1)
	d := &Delivery{
		Name:       cfg.Name,
		seed:       maphash.MakeSeed(),
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
	for range workers {
		d.shards = append(d.shards, &shard{queue: queue.New(max(cfg.Queue.Capacity/workers, 1), Coalesce)})
	}
	return d
}

// Coalesce merges a pending event with a newer one for the same
// incarnation of an object (the queue never merges two uids: a replaced
// object's deleted and the new one's added both stay). The newer state
// wins, but an object the consumer has not been sent yet stays added, and
// a change that was to be sent is not made quiet by a newer one that is
// not (e.g. an update outside the rule's changed paths).
func Coalesce(pending, newer *event.Event) *event.Event {
	if pending.Change == event.Added && newer.Change == event.Updated && !pending.Quiet {
		return event.Build(newer.RuleInfo(), event.Transition{Change: event.Added, Object: newer.Object(), Time: newer.Time,
			Entered: pending.Entered, Replay: newer.Replay})
	}
	if pending.Change == newer.Change && newer.Quiet && !pending.Quiet {
		return newer.WithQuiet(false)
	}
	return newer
}

// Offer enqueues an event. It never blocks.
func (d *Delivery) Offer(ev *event.Event) {
	s := d.shards[0]
	if len(d.shards) > 1 {
		s = d.shards[maphash.String(d.seed, ev.Key)%uint64(len(d.shards))]
	}
	s.queue.Offer(ev.QueueKey, ev)
}

// Close stops accepting events; Run drains what is queued, then returns.
func (d *Delivery) Close() {
	for _, s := range d.shards {
		s.queue.Close()
	}
}

// Stats are a delivery's counts.
type Stats struct {
	Delivered, Failed, Retried, DeadLettered uint64
	Queue                                    queue.Stats // summed over workers
	Pending                                  int         // queued or in flight
	Capacity                                 int
}

// Stats returns the delivery's counts.
func (d *Delivery) Stats() Stats {
	st := Stats{Delivered: d.delivered.Load(), Failed: d.failed.Load(), Retried: d.retried.Load(), DeadLettered: d.deadLettered.Load(), Pending: d.Pending()}
	for _, s := range d.shards {
		q := s.queue.Stats()
		st.Queue.Offered += q.Offered
		st.Queue.Coalesced += q.Coalesced
		st.Queue.Taken += q.Taken
		st.Queue.Discarded += q.Discarded
		st.Capacity += s.queue.Capacity()
	}
	return st
}

// Pending counts events not yet acknowledged: queued or in flight.
func (d *Delivery) Pending() int {
	n := 0
	for _, s := range d.shards {
		n += s.queue.Len() + int(s.inFlight.Load())
	}
	return n
}

// Run delivers until ctx ends or the queues are closed and drained, then
// returns. A batch cut short by ctx is not acknowledged: it stays counted as
// pending and is never counted as delivered.
func (d *Delivery) Run(ctx context.Context) {
	d.runOnce.Do(func() {
		defer close(d.done)
		var wg sync.WaitGroup
		for _, s := range d.shards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.runShard(ctx, s)
			}()
		}
		wg.Wait()
	})
}

// Done is closed when Run has returned.
func (d *Delivery) Done() <-chan struct{} { return d.done }

func (d *Delivery) runShard(ctx context.Context, s *shard) {
	var buf []queue.Item[*event.Event]
	batch := make([]*event.Event, 0, d.batchMax)
	for {
		var err error
		buf, err = s.queue.TakeBatch(ctx, d.batchMax, buf)
		if err != nil {
			return
		}
		batch = batch[:0]
		for _, it := range buf {
			batch = append(batch, it.Value)
		}
		if d.batchWait > 0 && len(batch) < d.batchMax {
			batch = d.fill(ctx, s, batch, &buf)
		}
		s.inFlight.Store(int64(len(batch)))
		if !d.deliver(ctx, batch) {
			return // not acknowledged: stays pending
		}
		s.inFlight.Store(0)
	}
}

// fill waits up to batchWait for more events to join a partial batch.
func (d *Delivery) fill(ctx context.Context, s *shard, batch []*event.Event, buf *[]queue.Item[*event.Event]) []*event.Event {
	wctx, cancel := context.WithTimeout(ctx, d.batchWait)
	defer cancel()
	for len(batch) < d.batchMax {
		more, err := s.queue.TakeBatch(wctx, d.batchMax-len(batch), *buf)
		*buf = more
		if err != nil {
			break
		}
		for _, it := range more {
			batch = append(batch, it.Value)
		}
	}
	return batch
}

// deliver sends one batch until each of its events is acknowledged or
// permanently refused, or ctx ends (then it returns false and nothing of
// the batch is reported to OnAck).
func (d *Delivery) deliver(ctx context.Context, batch []*event.Event) bool {
	pending := make([]*event.Event, 0, len(batch))
	for _, e := range batch {
		if !e.Quiet {
			pending = append(pending, e)
		}
	}
	wait := d.retry.InitialInterval.D()
	start := time.Now()
	prepared := d.BeforeSend == nil
	for attempt := 1; !prepared || len(pending) > 0; attempt++ {
		var err error
		if !prepared {
			if err = d.BeforeSend(ctx, batch); err == nil {
				prepared = true
				if len(pending) == 0 {
					break
				}
			}
		}
		if prepared && d.Fence != nil {
			err = d.Fence()
		}
		if prepared && err == nil {
			err = d.safeSend(ctx, pending)
		}
		if err == nil {
			d.delivered.Add(uint64(len(pending)))
			break
		}
		if ctx.Err() != nil {
			return false
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
		if IsPermanent(err) || (d.retry.MaxElapsed > 0 && time.Since(start) > d.retry.MaxElapsed.D()) {
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

package sinks

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/queue"
)

// MaxBatch is the most events handed to one Send.
const MaxBatch = 256

// Delivery owns one sink's queue and the goroutine that drains it into the
// sink: batches in queue order, retried with exponential backoff and jitter
// until acknowledged. The informer side only calls Offer, which never blocks.
type Delivery struct {
	Name  string
	Queue *queue.Queue[*event.Event]

	sink   Sink
	retry  config.Retry
	logger *slog.Logger

	delivered, failed, retried atomic.Uint64
	inFlight                   atomic.Int64 // events taken from the queue, not yet acknowledged
	done                       chan struct{}
}

// NewDelivery prepares delivery of cfg's queue into sink; Run starts it.
func NewDelivery(cfg config.Sink, sink Sink, logger *slog.Logger) *Delivery {
	return &Delivery{
		Name:   cfg.Name,
		Queue:  queue.New(cfg.Queue.Capacity, Coalesce),
		sink:   sink,
		retry:  cfg.Retry,
		logger: logger.With("sink", cfg.Name),
		done:   make(chan struct{}),
	}
}

// Coalesce merges a pending event with a newer one for the same object: the
// newer state wins, but an object the consumer has not seen yet stays added.
func Coalesce(pending, newer *event.Event) *event.Event {
	if pending.Change == event.Added && newer.Change == event.Updated {
		return event.New(newer.RuleInfo(), event.Added, newer.Object(), nil, newer.Time)
	}
	return newer
}

// Offer enqueues an event. It never blocks.
func (d *Delivery) Offer(ev *event.Event) { d.Queue.Offer(ev.Key, ev) }

// Stats are a delivery's counts.
type Stats struct {
	Delivered, Failed, Retried uint64
	Queue                      queue.Stats
	Pending                    int // queued or in flight
}

// Stats returns the delivery's counts.
func (d *Delivery) Stats() Stats {
	return Stats{Delivered: d.delivered.Load(), Failed: d.failed.Load(), Retried: d.retried.Load(), Queue: d.Queue.Stats(), Pending: d.Pending()}
}

// Pending counts events not yet acknowledged: queued or in flight.
func (d *Delivery) Pending() int { return d.Queue.Len() + int(d.inFlight.Load()) }

// Run delivers until ctx ends or the queue is closed and drained. A batch
// cut short by ctx is not acknowledged: it is left undelivered, never
// counted as delivered.
func (d *Delivery) Run(ctx context.Context) {
	defer close(d.done)
	var buf []queue.Item[*event.Event]
	batch := make([]*event.Event, 0, MaxBatch)
	for {
		var err error
		buf, err = d.Queue.TakeBatch(ctx, MaxBatch, buf)
		if err != nil {
			return
		}
		batch = batch[:0]
		for _, it := range buf {
			batch = append(batch, it.Value)
		}
		d.inFlight.Store(int64(len(batch)))
		ok := d.deliver(ctx, batch)
		if ok {
			d.inFlight.Store(0)
		}
		if !ok {
			return // the batch stays counted as pending: it was not acknowledged
		}
	}
}

// CloseSink closes the sink; call it after Run has returned.
func (d *Delivery) CloseSink(ctx context.Context) error { return d.sink.Close(ctx) }

// Done is closed when Run has returned.
func (d *Delivery) Done() <-chan struct{} { return d.done }

// deliver sends one batch until it is acknowledged, permanently refused, or
// ctx ends (then it returns false).
func (d *Delivery) deliver(ctx context.Context, batch []*event.Event) bool {
	wait := d.retry.InitialInterval.D()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := d.safeSend(ctx, batch)
		if err == nil {
			d.delivered.Add(uint64(len(batch)))
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if IsPermanent(err) || (d.retry.MaxElapsed > 0 && time.Since(start) > d.retry.MaxElapsed.D()) {
			d.failed.Add(uint64(len(batch)))
			d.logger.Error("events not delivered: the sink refused them permanently", "events", len(batch), "first", batch[0].ID, "error", err)
			return true
		}
		d.retried.Add(1)
		delay := wait/2 + rand.N(wait/2+1) // jitter: [wait/2, wait]
		var te throttleError
		if errors.As(err, &te) && te.delay > delay {
			delay = te.delay
		}
		if attempt == 1 || attempt%10 == 0 {
			d.logger.Warn("delivery failed; retrying", "attempt", attempt, "events", len(batch), "retryIn", delay, "error", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		wait = min(2*wait, d.retry.MaxInterval.D())
	}
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

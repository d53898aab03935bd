// Package delivery is the engine between a sink's queue and the sink: one
// Delivery per sink takes batches from its bounded queue, sends them with a
// bounded concurrency (fixed, or adaptive), parks per object what fails and
// retries it with backoff, probes a destination failing as a whole, and
// reports what the destination acknowledged. It wraps a pkg/sinks Sink from
// outside, as the OpenTelemetry collector's exporterhelper wraps an
// exporter: a sink only sends and classifies its errors.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"k8s.io/utils/clock"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/internal/queue"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Delivery owns one sink's queue and what is taken from it until the sink
// acknowledges it. The informer side only calls Offer, which never blocks.
//
// Failure is per object, like order. A batch is sent once; what the sink
// acknowledged is reported to OnAck, and each object that failed is parked:
// its events leave the concurrency slot at once and wait for their own
// backoff, while the queue holds the object's later events behind them
// (they coalesce there, and are folded into the parked ones when those are
// retried: the newest state is what is retried). Other objects flow at the
// destination's speed. A parked batch of several objects that fails again
// is split in two (a digest's is retried whole, a message for people,
// unless refused), so an object the destination keeps refusing ends alone;
// a batch of several objects refused as a whole with a Permanent error is
// split at once, until the culprit is alone.
//
// What the destination took is acknowledged, and nothing else: a Permanent
// refusal goes to the dead-letter and counts as handled only once the
// dead-letter took it (a dead-letter that refuses the event gets it
// without data); without a dead-letter, or while it fails, the object stays
// parked, retried every retry maxInterval, never reported to OnAck.
//
// A destination failing as a whole (Unavailable, Throttle, Destination, a
// network error, or a first attempt failing) is not parked object by
// object: the delivery probes it with one batch at a time, backing off,
// until an attempt succeeds again; the rest waits in the queue. The probes
// take turns (what is due, a batch that failed so, a new object), so one
// object refused for reasons of its own never stands for the destination.
// A refusal about an object's own target (sinks.ObjectTarget: a 404 for a
// path built from its name) is that object's failure, not the
// destination's.
//
// With an update window, an object whose change was just acknowledged is
// parked the same way, without events, for the window: its next updates
// wait behind it and coalesce (the latest state wins), and are sent when
// the window ends; an added, a deleted or a replay ends the wait at once,
// so none is held back or dropped.
//
// Quiet events (transitions the rule does not send) pass through the queue
// like the others, so that OnAck reports every transition in order, but are
// never handed to the sink. Several batches may be in flight at once: as
// many as the sink's fixed workers, or an adaptive number (see limiter) up
// to its concurrency.max. Order per object holds because taking a batch
// claims its objects (event.Key) in the queue until they are settled, and
// a batch with several events of an object sends them in turns, one per
// Send, each once the one before it is settled (sinks.Sink's contract;
// an Ordered sink gets them together).
type Delivery struct {
	Name string

	queue    *queue.Queue[*event.Event]
	sender   *sender
	retry    retryPolicy
	batching batching
	logger   *slog.Logger
	hooks    Hooks

	gate    gate
	parking parking
	window  updateWindow
	mute    *muting // nil: never muted
	counts  counters

	kick  chan struct{} // wakes the dispatcher: a batch ended, an object parked or came due
	life  lifetime
	clock clock.WithDelayedExecution
}

// lifetime is a delivery's: Run once, Close, and Done when Run returned.
type lifetime struct {
	closing atomic.Bool
	done    chan struct{}
	once    sync.Once
}

// batching is how batches are taken from the queue.
type batching struct {
	max  int           // events per batch
	wait time.Duration // for a partial batch to fill
	// ordered: the sink is sinks.Ordered, and a batch sent at once may
	// hold several events of an object (else they go in turns).
	ordered bool
	// digest: the sink's digest; wait is its period, and what arrives
	// behind a batch's objects meanwhile is folded into them.
	digest bool
}

// maxDigestEvents bounds a digest's batch (all its groups): a period
// with more events sends them in more than one.
const maxDigestEvents = 10_000

// Options are what a delivery is built from.
type Options struct {
	// Config is the sink's config: name, queue, retry, concurrency, rate
	// limit and update window.
	Config config.Sink
	Sink   sinks.Sink
	// DeadLetter takes what the sink refuses permanently; nil: such
	// objects stay parked, retried every retry maxInterval, and counted.
	DeadLetter sinks.DeadLetter
	Logger     *slog.Logger // nil: discarded
	Hooks      Hooks
	// WindowKey is the update window's key (updateWindow.key); nil: a
	// window per object.
	WindowKey func(*event.Event) (string, error)
	// Mute holds events during the sink's mute windows; nil: never.
	Mute *Mute
	// Clock is the engine's time: retry backoff, the update window,
	// parked objects' due times, probes, the rate limit, a batch's wait
	// to fill. nil: the real clock (tests step a fake one).
	Clock clock.WithDelayedExecution
}

// Hooks connect a delivery to its host (the bridge's checkpoint and leader
// election); each may be nil. They are fixed at New, so that nothing can
// change them while Run calls them.
type Hooks struct {
	// BeforeSend writes the bridge's write-ahead intent to the checkpoint
	// before the destination may see the events: should the bridge die
	// before their acknowledgement is recorded, and an object be deleted
	// meanwhile, the restart still knows the sink may hold it and sends the
	// deletion. It gets a batch (quiet events included) before its first
	// send, and again when newer events were folded into a parked object;
	// while it fails, the batch waits in its slot with backoff, never parked
	// or dead-lettered (the destination was not asked).
	BeforeSend func(ctx context.Context, events []*event.Event) error
	// Fence is the leader fence: a replica that may no longer lead must not
	// send. It is checked before every send attempt; while it fails nothing
	// is sent and the batch waits, as with BeforeSend, until the fence opens
	// or Run's context ends (the bridge cancels it when the lease is lost).
	Fence func() error
	// Hold, when set, bounds each send by the hold it passed the fence
	// under: the context it returns ends when that hold lapses (a shard's
	// Lease not renewed in time), so that a send to a slow destination
	// cannot reach it after another replica took over. A send cut short
	// this way is not the destination's failure: the batch waits, as for
	// the fence, and is sent again once the hold is renewed.
	Hold func(ctx context.Context) (context.Context, context.CancelFunc)
	// OnAck gets the events the destination (or the dead-letter) took, each
	// object's in order: the bridge records them in the checkpoint and
	// observes their latency. Batches in flight at once call it
	// concurrently; it must be quick.
	OnAck func(events []*event.Event)
}

// New prepares delivery of o.Config's queue into o.Sink; Run starts it.
func New(o Options) *Delivery {
	cfg, sink, logger, clk := o.Config, o.Sink, o.Logger, o.Clock
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	retry := retryPolicy{Retry: cfg.Retry, backoff: backoff.Backoff{Initial: cfg.Retry.InitialInterval.D(), Max: cfg.Retry.MaxInterval.D()}}
	d := &Delivery{
		Name:     cfg.Name,
		queue:    queue.New(cfg.Queue.Capacity, event.Coalesce),
		retry:    retry,
		batching: batching{max: sinks.MaxBatch},
		logger:   logger.With("sink", cfg.Name),
		hooks:    o.Hooks,
		gate:     gate{backoff: retry.backoff, clock: clk},
		parking:  parking{clock: clk},
		counts:   counters{destErrs: map[string]uint64{}},
		kick:     make(chan struct{}, 1),
		life:     lifetime{done: make(chan struct{})},
		clock:    clk,
	}
	d.sender = &sender{name: cfg.Name, sink: sink, deadLetter: o.DeadLetter, limiter: newLimiter(cfg.InFlight()),
		fence: o.Hooks.Fence, hold: o.Hooks.Hold, logger: d.logger, clock: clk}
	d.sender.limiter.now = clk.Now
	if o, ok := sink.(sinks.Ordered); ok {
		d.batching.ordered = o.Ordered()
	}
	if b, ok := sink.(sinks.Batcher); ok {
		d.batching.max, d.batching.wait = b.Batching()
		d.batching.max = max(d.batching.max, 1)
	}
	if r := cfg.RateLimit; r != nil {
		burst := r.BurstOrDefault()
		d.sender.rate = rate.NewLimiter(rate.Limit(r.EventsPerSecond), burst)
		d.batching.max = min(d.batching.max, burst) // a batch takes its tokens at once
	}
	if dg := cfg.Digest; dg != nil {
		d.batching.max, d.batching.wait, d.batching.digest = maxDigestEvents, dg.Every.D(), true
	}
	d.parking.kick = d.signal
	d.window.set(cfg.UpdateWindow, o.WindowKey)
	if o.Mute != nil {
		d.mute = newMuting(o.Mute, clk, d.logger)
	}
	return d
}

// Offer enqueues an event, or holds it while the sink is muted. It never
// blocks.
func (d *Delivery) Offer(ev *event.Event) {
	if d.mute != nil {
		d.mute.offer(ev, d.counts.fold, d.offer)
		return
	}
	d.offer(ev)
}

// offer enqueues an event.
func (d *Delivery) offer(ev *event.Event) {
	if d.window.length == 0 {
		d.queue.OfferIn(ev.Key(), ev.QueueKey(), ev)
		return
	}
	d.window.mu.Lock()
	defer d.window.mu.Unlock()
	group := d.group(ev)
	d.queue.OfferIn(group, ev.QueueKey(), ev)
	b := d.window.waiting[group]
	switch {
	case b == nil:
	case !isKeyed(group) && urgent(ev):
		d.parking.expedite(b)
	default:
		// Folded into what waits at once, not left in the queue: a busy
		// object in a long window holds one event, never the queue's
		// capacity (which would make the other objects coalesce).
		d.gather(b, nil)
	}
}

// Close stops accepting events; Run drains what is queued and parked (an
// object refused permanently with nothing newer is left for the next
// start), then returns.
func (d *Delivery) Close() {
	if d.mute != nil {
		d.mute.close()
	}
	d.life.closing.Store(true)
	d.queue.Close()
	d.signal()
}

// Healthy reports why the delivery cannot deliver now, nil when it can:
// the destination failing as a whole (one object parked is not that), or
// the sink's own check (see HealthChecker).
func (d *Delivery) Healthy() error {
	if err := d.gate.health(d.clock.Now()); err != nil {
		return err
	}
	if hc, ok := d.sender.sink.(sinks.HealthChecker); ok {
		return hc.Healthy()
	}
	return nil
}

// Pending counts events not yet acknowledged: held by a mute, queued, in
// flight or parked.
func (d *Delivery) Pending() int { return d.queue.Len() + int(d.counts.inFlight.Load()) + d.held() }

// held counts the events a mute holds now.
func (d *Delivery) held() int {
	if d.mute == nil {
		return 0
	}
	return int(d.mute.count.Load())
}

// Concurrency returns how many sends may be in progress at once now (fixed
// with workers, else adapting between 1 and concurrency.max) and how many
// are.
func (d *Delivery) Concurrency() (limit, inFlight int) { return d.sender.limiter.concurrency() }

// Done is closed when Run has returned.
func (d *Delivery) Done() <-chan struct{} { return d.life.done }

func (d *Delivery) signal() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends or the queue is closed and drained, then
// returns. A batch cut short by ctx is not acknowledged: it stays counted as
// pending and is never counted as delivered.
func (d *Delivery) Run(ctx context.Context) {
	d.life.once.Do(func() {
		defer close(d.life.done)
		defer d.parking.stop()
		var wg sync.WaitGroup
		defer wg.Wait()
		if d.mute != nil {
			mctx, stop := context.WithCancel(ctx)
			defer stop() // before wg.Wait
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.mute.run(mctx, d.offer)
			}()
		}
		work, quit := make(chan *batch), make(chan struct{})
		defer close(quit)
		var buf []queue.Item[*event.Event]
		for {
			// While the destination fails as a whole, one batch at a time.
			if err := d.gate.turn(ctx, d.kick); err != nil {
				return
			}
			// The slot first: while none is free the queue keeps filling
			// the next batch.
			alone, err := d.sender.limiter.reserve(ctx)
			if err != nil {
				return
			}
			b, err := d.next(ctx, &buf)
			if err != nil {
				d.sender.limiter.unreserve()
				return
			}
			d.gate.begin()
			if alone || d.gate.isFailing() { // one at a time: nothing to hand it to
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
func (d *Delivery) worker(ctx context.Context, b *batch, work <-chan *batch, quit <-chan struct{}) {
	idle := d.clock.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		d.run(ctx, b)
		if !idle.Stop() {
			select { // a fake clock's timer keeps what it sent
			case <-idle.C():
			default:
			}
		}
		idle.Reset(workerIdle)
		select {
		case b = <-work:
		case <-idle.C():
			return
		case <-quit:
			return
		case <-ctx.Done():
			return
		}
	}
}

// run delivers a batch, then frees its slot and wakes the dispatcher.
func (d *Delivery) run(ctx context.Context, b *batch) {
	defer d.signal()
	defer d.gate.end()
	defer d.sender.limiter.unreserve()
	d.deliver(ctx, b)
}

// next returns the next batch: a parked one whose retry is due, else one
// from the queue. An error means ctx ended, or the queue is closed and
// everything was settled (or left parked as refused, with nothing newer).
func (d *Delivery) next(ctx context.Context, buf *[]queue.Item[*event.Event]) (*batch, error) {
	for {
		if d.life.closing.Load() {
			d.expediteRefused()
			d.parking.each(func(b *batch) bool { return b.throttled != "" }) // a drain does not wait out windows
		}
		// While the destination fails as a whole, the probes take turns: a
		// parked batch (due, else one that failed so, parked the longest
		// ago), then a new object from the queue, so that no object the
		// receiver refuses for reasons of its own (and whose retries come
		// due as often as the probes) stands for the whole destination.
		failing := d.gate.isFailing()
		if failing && d.gate.probeNew {
			if b, err := d.take(ctx, buf, 1, closedKick); err == nil {
				d.gate.probeNew = false
				return b, nil
			}
		}
		b := d.parking.due(d.clock.Now())
		if b == nil && failing {
			b = d.parking.probe()
		}
		if b != nil {
			d.gate.probeNew = failing
			fold := b.throttled != ""
			if fold {
				d.window.forget(b)
			}
			if b = d.refresh(b, fold); b != nil {
				return b, nil
			}
			continue
		}
		// Probing with a new object: one event, so that a destination
		// failing without saying so (500s to everything) costs one
		// object parked per probe, not a batch.
		n := d.batching.max
		if d.gate.isFailing() {
			n = 1
		}
		b, err := d.take(ctx, buf, n, d.kick)
		switch {
		case err == nil:
			d.gate.probeNew = false
			return b, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, queue.ErrClosed):
			if d.gate.idle() && d.parking.onlyRefused() && d.queue.Len() == 0 {
				return nil, err
			}
			select { // a batch still out may park, or a parked one come due
			case <-d.kick:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		// ErrStopped: an object parked or came due, or a batch ended.
	}
}

// closedKick stops a take at once when nothing can be taken: a probe
// that looks for a new object without waiting for one.
var closedKick = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// take waits for a batch from the queue (or for stop), then waits up to
// batchWait for a partial one to fill.
func (d *Delivery) take(ctx context.Context, buf *[]queue.Item[*event.Event], n int, stop <-chan struct{}) (*batch, error) {
	items, err := d.queue.TakeClaimedOr(ctx, n, *buf, stop)
	*buf = items
	if err != nil {
		return nil, err
	}
	b := &batch{prepared: d.hooks.BeforeSend == nil, objects: make([]object, 0, len(items))}
	add := func(items []queue.Item[*event.Event]) {
		// One backing array for the objects' first events: most objects
		// have one event per take (capped, so a second one reallocates
		// rather than overwrite its neighbour's).
		first := make([]*event.Event, len(items))
		for i, it := range items {
			if it.Claimed() {
				first[i] = it.Value
				b.objects = append(b.objects, object{claim: it.Claim, events: first[i : i+1 : i+1], group: it.Group})
				continue
			}
			// A group's items follow its claim within one take; a later
			// take never returns an item of a group this batch claims.
			for i := len(b.objects) - 1; i >= 0; i-- {
				if o := &b.objects[i]; o.group == it.Group {
					o.events = append(o.events, it.Value)
					break
				}
			}
		}
		n := len(items)
		for i := range b.objects { // a key's objects taken together are one message
			if o := &b.objects[i]; len(o.events) > 1 && isKeyed(o.group) {
				before := len(o.events)
				d.fold(o, true)
				n += len(o.events) - before
			}
		}
		d.counts.inFlight.Add(int64(n))
		clear(items) // the buffer is reused: it must not keep these events alive
	}
	add(items)
	if d.batching.wait > 0 && b.size() < n {
		// A digest's period ends early when a mute window ends (before
		// the period or during it): what it held, all queued by then,
		// goes at once, as one digest, with what the period had.
		var stop <-chan struct{}
		if d.batching.digest && d.mute != nil {
			stop = d.mute.ended
		}
		wctx, cancel := context.WithCancel(ctx)
		t := d.clock.AfterFunc(d.batching.wait, cancel)
		for b.size() < n {
			more, err := d.queue.TakeClaimedOr(wctx, n-b.size(), *buf, stop)
			*buf = more
			if errors.Is(err, queue.ErrStopped) && stop != closedKick {
				stop = closedKick // take what is queued, then go
				continue
			}
			if err != nil {
				break
			}
			add(more)
		}
		t.Stop()
		cancel()
	}
	if d.batching.digest {
		// What arrived behind the period's objects joins them, folded:
		// one event per object and period, the latest state.
		if b = d.refresh(b, true); b == nil {
			return nil, errCancelledOut
		}
	}
	return b, nil
}

// errCancelledOut is a take whose events all cancelled out (objects
// created and deleted within a digest's period): nothing to send.
var errCancelledOut = errors.New("the batch's events cancelled out")

// refresh joins the events queued behind a parked batch's objects to it,
// in order, so that the retry sends them too. They coalesce (the newest
// state is what is retried) when the object was refused permanently, whose
// payload a newer state replaces, when fold (an update window ended), or
// when more than the queue's capacity is pending, as the queue itself
// would. It returns nil when nothing is left to send (every object's
// events cancelled out, or none arrived during a window).
func (d *Delivery) refresh(b *batch, fold bool) *batch {
	kept := b.objects[:0]
	var items []queue.Item[*event.Event]
	for _, o := range b.objects {
		items = d.queue.TakeFrom(o.claim, items[:0])
		before := len(o.events)
		for _, it := range items {
			o.events = append(o.events, it.Value)
		}
		if fold || (len(items) > 0 && (isKeyed(o.group) || b.refused || d.Pending()+len(items) > d.queue.Capacity())) {
			d.fold(&o, true)
		}
		if len(items) > 0 {
			b.prepared, b.refused = d.hooks.BeforeSend == nil, false // new payload: intents, and a new chance
		}
		d.counts.inFlight.Add(int64(len(o.events) - before)) // the items left the queue for the batch
		if len(o.events) == 0 {
			d.queue.Release(o.claim)
			continue
		}
		kept = append(kept, o)
	}
	b.objects = kept
	if len(kept) == 0 {
		return nil
	}
	return b
}

// expediteRefused, once the delivery is closing, retries at once the
// refused objects that have newer events queued (the newer state may be
// taken); the others are left for the next start.
func (d *Delivery) expediteRefused() {
	d.parking.each(func(b *batch) bool {
		if !b.refused {
			return false
		}
		for _, o := range b.objects {
			if d.queue.HasItems(o.claim) {
				return true
			}
		}
		return false
	})
}

// deliver sends a batch once (waiting in its slot while the write-ahead
// intent or the fence fails), then settles each object: acknowledged,
// dead-lettered, or parked. A batch cut by ctx stays pending, its objects
// claimed.
func (d *Delivery) deliver(ctx context.Context, b *batch) {
	events := b.events()
	errs, whole, ok := d.attempt(ctx, b, events)
	if !ok {
		return
	}
	if whole != nil && sinks.IsPermanent(whole) && len(b.objects) > 1 {
		// Refused as a whole, but one of them is the cause: find it.
		x, y := b.split()
		d.deliver(ctx, x)
		d.deliver(ctx, y)
		return
	}
	d.settle(ctx, b, events, errs, whole)
}

// settle reports what the attempt delivered, hands permanent refusals to
// the dead-letter, and parks each object from its first event still to
// deliver on.
func (d *Delivery) settle(ctx context.Context, b *batch, events []*event.Event, errs []error, whole error) {
	now := d.clock.Now()
	type outcome struct {
		cut   int   // events[:cut] are settled (acknowledged or dead-lettered)
		dl    int   // index of the first dead-lettered event, -1 if none
		cause error // why events[cut:] are not
	}
	var outs []outcome // nil: every event was delivered (errs nil)
	if errs != nil {
		outs = make([]outcome, len(b.objects))
	}
	var toDL []*event.Event
	var dlCause, destErr, pushErr error
	var ownReasons []string // Destination reasons of refusals about objects' own targets
	acked, refused, plain, fenced := 0, 0, 0, 0
	expired := d.retry.expired(b.since, now)
	off := 0
	for i, o := range b.objects {
		out := outcome{cut: len(o.events), dl: -1}
		for j, e := range o.events {
			var err error
			if errs != nil {
				err = errs[off+j]
			}
			if err == nil {
				if !e.Quiet {
					acked++
				}
				continue
			}
			reason, dest := sinks.DestinationReason(err)
			switch {
			case dest && sinks.IsObjectTarget(err):
				// About this object's own target (a path built from its
				// name): its failure, not the destination's.
				dest = false
				plain++
				ownReasons = append(ownReasons, reason)
			case dest:
				destErr = err
			case pushesBack(err):
				pushErr = err
			case sinks.IsPermanent(err):
				refused++
			case sinks.IsFenced(err):
				// The destination's fence refused a stale write: it works, and
				// the event is not to be given up (whoever owns the object
				// now writes it): retried while this replica's fence is open.
				fenced++
			default:
				plain++
			}
			dlable := sinks.IsPermanent(err) || (expired && !dest && !sinks.IsFenced(err))
			if dlable && d.sender.deadLetter != nil {
				if out.dl < 0 {
					out.dl = j
				}
				toDL = append(toDL, e)
				if dlCause == nil {
					dlCause = err
					if !sinks.IsPermanent(err) {
						dlCause = fmt.Errorf("failing for longer than retry.maxElapsed (%s): %w", d.retry.MaxElapsed.D(), err)
					}
				}
				continue
			}
			out.cut, out.cause = j, err
			break
		}
		if outs != nil {
			outs[i] = out
		}
		off += len(o.events)
	}
	d.counts.failed.Add(uint64(refused))
	if len(toDL) > 0 {
		if err := d.sender.putDeadLetter(ctx, toDL, dlCause); err == nil {
			d.counts.deadLettered.Add(uint64(len(toDL)))
		} else {
			for i := range outs { // not taken: from the first of them on, parked
				if outs[i].dl >= 0 && outs[i].dl < outs[i].cut {
					outs[i].cut, outs[i].cause = outs[i].dl, fmt.Errorf("the dead-letter failed: %w (refused: %v)", err, dlCause)
				}
			}
		}
	}

	// What was taken, in order per object: when everything was, the
	// events themselves (b.events() is in that order).
	var done []*event.Event
	if outs == nil {
		done = events
	} else {
		done = make([]*event.Event, 0, len(events))
	}
	var park, throttle []object
	var causes []error // each parked object's
	release := releases.Get().(*[]queue.Claim[*event.Event])
	defer releases.Put(release)
	*release = (*release)[:0]
	var cause error
	delivered := 0
	for i, o := range b.objects {
		out := outcome{cut: len(o.events), dl: -1}
		if outs != nil {
			out = outs[i]
			done = append(done, o.events[:out.cut]...)
		}
		for _, e := range o.events[:out.cut] {
			if !e.Quiet && !slicesContains(toDL, e) {
				delivered++
			}
		}
		if out.cut == len(o.events) {
			if !d.life.closing.Load() && d.window.waits(o) { // a closing delivery does not wait out windows
				throttle = append(throttle, o)
			} else {
				*release = append(*release, o.claim)
			}
			continue
		}
		// Its own copy: o.events may share the take's array of first events,
		// which a parked object must not keep alive (the others' events,
		// acknowledged, and their objects).
		rest := slices.Clone(o.events[out.cut:])
		for k, e := range rest { // attempted: a deletion must not cancel it away any more
			if e.Fresh {
				rest[k] = e.WithFresh(false)
			}
		}
		park = append(park, object{events: rest, claim: o.claim, group: o.group})
		causes = append(causes, out.cause)
		if cause == nil {
			cause = out.cause
		}
	}
	d.counts.delivered.Add(uint64(delivered))
	d.counts.inFlight.Add(-int64(len(done)))
	if len(done) > 0 && d.hooks.OnAck != nil {
		d.hooks.OnAck(done) // before the objects are released: their next events are acknowledged after these
	}
	d.queue.Release(*release...)
	clear(*release) // pooled: it must not keep the groups alive
	if len(throttle) > 0 {
		d.throttle(throttle, now)
	}

	// The destination as a whole: it answered, or it failed. A refusal
	// about an object's own target is an answer too: objects named to be
	// refused, one after the other, must not make it look down.
	switch {
	case acked > 0 || refused > 0 || fenced > 0 || len(ownReasons) > 0:
		d.gate.ok(now, d.logger)
	case destErr != nil || pushErr != nil || (plain > 0 && b.failures == 0):
		fail := destErr
		if fail == nil {
			fail = pushErr
		}
		if fail == nil {
			fail = cause
		}
		d.gate.fail(now, fail, destErr != nil || pushErr != nil, sinks.ThrottleDelay(fail), d.logger)
	}
	if destErr != nil {
		reason, _ := sinks.DestinationReason(destErr)
		ownReasons = append(ownReasons, reason)
	}
	d.counts.destination(ownReasons...)
	if len(park) == 0 {
		return
	}
	d.counts.retried.Add(1)
	d.park(b, park, causes, cause, whole != nil, destErr != nil || pushErr != nil, now)
}

// releases is settle's scratch for the claims it releases.
var releases = sync.Pool{New: func() any { return new([]queue.Claim[*event.Event]) }}

func slicesContains(list []*event.Event, e *event.Event) bool {
	for _, x := range list {
		if x == e {
			return true
		}
	}
	return false
}

// park puts objects that failed back for a retry: each alone when the sink
// said which events failed, else the batch's objects together, split in
// two once they failed together before (a digest's, only once refused).
func (d *Delivery) park(b *batch, objects []object, causes []error, cause error, whole, wide bool, now time.Time) {
	failures := b.failures + 1
	since := b.since
	if since.IsZero() {
		since = now
	}
	parkedAt := b.parkedAt
	if parkedAt.IsZero() {
		parkedAt = now
	}
	refused := sinks.IsPermanent(cause)
	var units []*batch
	unit := func(objs []object) *batch {
		return &batch{objects: objs, prepared: true, failures: failures, since: since, parkedAt: parkedAt, refused: refused, wide: wide, err: cause}
	}
	switch {
	case !whole && d.batching.digest:
		// The objects of one digest request that failed (one group) are
		// retried together, as one request again; the others alone.
		together := map[error]int{}
		for i, o := range objects {
			if c := causes[i]; c != nil && reflect.ValueOf(c).Comparable() {
				if k, ok := together[c]; ok {
					units[k].objects = append(units[k].objects, o)
					continue
				}
				together[c] = len(units)
			}
			units = append(units, unit([]object{o}))
		}
	case !whole:
		for _, o := range objects {
			units = append(units, unit([]object{o}))
		}
	case len(objects) > 1 && b.failures > 0 && (refused || !d.batching.digest):
		// Halved, to find an object the destination keeps failing on. A
		// digest's period is one message for people: an outage retries
		// it whole, and only a refusal splits it.
		h := len(objects) / 2
		units = append(units, unit(objects[:h:h]), unit(objects[h:]))
	default:
		units = append(units, unit(objects))
	}
	wait := d.retry.wait(failures, cause)
	first := objects[0].events[0]
	switch {
	case refused && failures == 1:
		d.logger.Error("refused permanently and no deadLetter configured: parked, retried every maxInterval, never recorded as delivered",
			"objects", len(objects), "first", first.Key(), "id", first.ID, "error", cause)
	case failures == 1 || failures%10 == 0:
		d.logger.Warn("delivery failed; parked, retrying alone", "objects", len(objects), "first", first.Key(), "failures", failures, "retryIn", wait, "error", cause)
	}
	for _, u := range units {
		d.parking.put(u, now.Add(backoff.Jitter(wait)))
	}
}

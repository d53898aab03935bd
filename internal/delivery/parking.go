package delivery

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// parking holds the batches that failed until their retry is due. They
// hold no concurrency slot meanwhile; their objects stay held in the queue.
// Its timer kicks the dispatcher when the earliest is due; every kick only
// makes the dispatcher look again (due, then the queue), so a kick taken by
// another wait loses nothing.
type parking struct {
	mu      sync.Mutex
	h       parkHeap
	objects int
	timer   *time.Timer // kicks the dispatcher when the earliest retry is due
	armed   time.Time
	kick    func()
}

type parked struct {
	b   *batch
	due time.Time
}

type parkHeap []parked

func (h parkHeap) Len() int           { return len(h) }
func (h parkHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h parkHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].b.slot, h[j].b.slot = i, j
}
func (h *parkHeap) Push(x any) {
	p := x.(parked)
	p.b.slot = len(*h)
	*h = append(*h, p)
}
func (h *parkHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = parked{}
	*h = old[:len(old)-1]
	return x
}

// put parks b until due.
func (p *parking) put(b *batch, due time.Time) {
	p.mu.Lock()
	heap.Push(&p.h, parked{b, due})
	if b.throttled == "" {
		p.objects += len(b.objects)
	}
	p.arm()
	p.mu.Unlock()
}

// due removes and returns the parked batch whose retry is the most
// overdue, nil if none is due at now. probing, it returns a batch that
// failed as the destination as a whole does even before it is due.
func (p *parking) due(now time.Time, probing bool) *batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.h) == 0 {
		return nil
	}
	i := 0
	if p.h[0].due.After(now) {
		i = -1
		if probing {
			for j, x := range p.h {
				if x.b.wide && (i < 0 || x.due.Before(p.h[i].due)) {
					i = j
				}
			}
		}
		if i < 0 {
			return nil
		}
	}
	x := heap.Remove(&p.h, i).(parked)
	if x.b.throttled == "" {
		p.objects -= len(x.b.objects)
	}
	p.arm()
	return x.b
}

// expedite makes b due at once, if it is still parked.
func (p *parking) expedite(b *batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := b.slot; i < len(p.h) && p.h[i].b == b && p.h[i].due.After(time.Now()) {
		p.h[i].due = time.Now()
		heap.Fix(&p.h, i)
		p.arm()
	}
}

// each makes due at once the batches f picks.
func (p *parking) each(f func(*batch) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	now := time.Now()
	for i := range p.h {
		if p.h[i].due.After(now) && f(p.h[i].b) {
			p.h[i].due, changed = now, true
		}
	}
	if changed {
		heap.Init(&p.h)
		p.arm()
	}
}

// onlyRefused reports whether every parked batch (if any) was refused
// permanently: what a closing delivery leaves for the next start.
func (p *parking) onlyRefused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.h {
		if !x.b.refused {
			return false
		}
	}
	return true
}

// stats returns the objects parked (failed) and how long the oldest has
// waited, and the objects waiting out an update window.
func (p *parking) stats(now time.Time) (objects int, oldest time.Duration, throttled int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.h {
		if x.b.throttled != "" {
			throttled++
			continue
		}
		oldest = max(oldest, now.Sub(x.b.parkedAt))
	}
	return p.objects, oldest, throttled
}

// arm sets the timer to the earliest retry; mu is held.
func (p *parking) arm() {
	if len(p.h) == 0 {
		return
	}
	at := p.h[0].due
	if p.timer != nil && at.Equal(p.armed) {
		return
	}
	p.armed = at
	d := time.Until(at)
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.kick)
		return
	}
	p.timer.Reset(d)
}

// stop stops the timer (Run ended).
func (p *parking) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
	}
}

// gate is the destination's health as the delivery sees it. While it
// fails as a whole, one batch at a time probes it, backing off between
// probes; any attempt it answers (an acknowledgement, or a permanent
// refusal) opens the gate again.
type gate struct {
	backoff backoff.Backoff // between probes; set by New

	mu      sync.Mutex
	failing bool
	since   time.Time
	probeAt time.Time
	wait    time.Duration // the current probe's backoff; 0 while one object's failure
	active  int           // batches being delivered
	lastErr error         // the destination's last failure while failing
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
			wait = time.Until(g.probeAt)
			if wait <= 0 {
				g.mu.Unlock()
				return nil
			}
		}
		g.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-kick:
		case <-t.C:
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

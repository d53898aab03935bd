package delivery

import (
	"container/heap"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// parking holds the batches that failed until their retry is due. They
// hold no concurrency slot meanwhile; their objects stay held in the queue.
// Its timer kicks the dispatcher when the earliest is due; every kick only
// makes the dispatcher look again (due, then the queue), so a kick taken by
// another wait loses nothing.
type parking struct {
	clock   clock.WithDelayedExecution
	mu      sync.Mutex
	h       parkHeap
	objects int
	timer   clock.Timer // kicks the dispatcher when the earliest retry is due
	armed   time.Time
	kick    func()
	seq     uint64 // puts so far: orders the probes (probe)
}

type parked struct {
	b   *batch
	due time.Time
	seq uint64 // when it was put, among puts
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
	p.seq++
	heap.Push(&p.h, parked{b, due, p.seq})
	if b.throttled == "" {
		p.objects += len(b.objects)
	}
	p.arm()
	p.mu.Unlock()
}

// due removes and returns the parked batch whose retry is the most
// overdue, nil if none is due at now.
func (p *parking) due(now time.Time) *batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.h) == 0 || p.h[0].due.After(now) {
		return nil
	}
	return p.remove(0)
}

// probe removes and returns, before it is due, the batch that failed as
// the destination as a whole does and was parked the longest ago: probes
// go round the batches that failed so, rather than asking the one that
// failed last again and again (that one may be refused for its own
// reasons, and would stand for the whole destination forever).
func (p *parking) probe() *batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := -1
	for j, x := range p.h {
		if x.b.wide && (i < 0 || x.seq < p.h[i].seq) {
			i = j
		}
	}
	if i < 0 {
		return nil
	}
	return p.remove(i)
}

// remove takes the batch at i off the heap; mu is held.
func (p *parking) remove(i int) *batch {
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
	now := p.clock.Now()
	if i := b.slot; i < len(p.h) && p.h[i].b == b && p.h[i].due.After(now) {
		p.h[i].due = now
		heap.Fix(&p.h, i)
		p.arm()
	}
}

// each makes due at once the batches f picks.
func (p *parking) each(f func(*batch) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	now := p.clock.Now()
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
	d := at.Sub(p.clock.Now())
	if d <= 0 {
		p.kick() // due already (a fake clock's timer would wait for a step)
		return
	}
	p.armed = at
	if p.timer == nil {
		p.timer = p.clock.AfterFunc(d, p.kick)
		return
	}
	select { // a fake clock's timer keeps what it sent, and would block on it
	case <-p.timer.C():
	default:
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

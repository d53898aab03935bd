package delivery

import (
	"container/heap"
	"sync"
	"time"
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

// Package queue is the bounded, coalescing buffer between the informer and a
// sink's delivery worker.
//
// Guarantees:
//
//   - Offer never blocks and never fails: the informer's handler only hands off.
//   - While no more than Capacity items are pending, every item is kept and
//     Take returns them in the order they were offered.
//   - Beyond Capacity, the queue degrades to per-key coalescing: an item whose
//     key already waits in the overflow replaces that item's value (through the
//     Merge function, in place, so its position is kept); other items are
//     appended. Memory is then bounded by Capacity plus the number of distinct
//     keys, not by the number of offers. Coalesce counts what was merged away.
//   - Order per key is always kept: an item never overtakes an earlier item
//     with the same key.
//   - Nothing is dropped silently: an item leaves the queue only through Take.
//
// Items offered after Close are discarded and counted; Take drains what is
// left, then reports ErrClosed.
package queue

import (
	"context"
	"errors"
	"sync"
)

// ErrClosed is returned by Take once the queue is closed and empty.
var ErrClosed = errors.New("queue closed")

// Merge combines a pending value with a newer one for the same key. It
// returns what is kept: the newer state, adjusted so that a consumer that
// missed the older value still ends in the right state (e.g. added then
// updated stays added).
type Merge[T any] func(pending, newer T) T

// Latest is the Merge that keeps the newer value.
func Latest[T any](_, newer T) T { return newer }

// Queue is a bounded FIFO with per-key coalescing on overflow. The zero
// value is not usable; call New. It is safe for concurrent use.
type Queue[T any] struct {
	mu       sync.Mutex
	capacity int
	merge    Merge[T]

	// ring holds the first (oldest) items, in order: at most capacity.
	ring       []item[T]
	head, size int

	// overflow holds what does not fit, in order, at most one item per key.
	overflow    map[string]*node[T]
	first, last *node[T]
	free        *node[T] // recycled nodes

	ready    chan struct{} // signalled (non-blocking) when an item arrives
	closed   bool
	closedCh chan struct{} // closed by Close, wakes every waiter

	stats Stats
}

// Stats are counts since the queue was made.
type Stats struct {
	Offered   uint64 // items offered while open
	Coalesced uint64 // items merged into a pending item with the same key
	Taken     uint64
	Discarded uint64 // offered after Close
}

type item[T any] struct {
	key   string
	value T
}

type node[T any] struct {
	item[T]
	prev, next *node[T]
}

// New returns a queue that keeps up to capacity items in order. merge
// combines items of one key on overflow; nil means Latest.
func New[T any](capacity int, merge Merge[T]) *Queue[T] {
	if capacity < 1 {
		capacity = 1
	}
	if merge == nil {
		merge = Latest[T]
	}
	initial := min(capacity, 64)
	return &Queue[T]{
		capacity: capacity,
		merge:    merge,
		ring:     make([]item[T], initial),
		overflow: map[string]*node[T]{},
		ready:    make(chan struct{}, 1),
		closedCh: make(chan struct{}),
	}
}

// Offer adds an item. It never blocks.
func (q *Queue[T]) Offer(key string, value T) {
	q.mu.Lock()
	if q.closed {
		q.stats.Discarded++
		q.mu.Unlock()
		return
	}
	q.stats.Offered++
	switch n, pending := q.overflow[key]; {
	case pending:
		n.value = q.merge(n.value, value)
		q.stats.Coalesced++
	case q.first == nil && q.size < q.capacity:
		q.pushRing(item[T]{key, value})
	default:
		q.pushOverflow(item[T]{key, value})
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *Queue[T]) pushRing(it item[T]) {
	if q.size == len(q.ring) {
		grown := make([]item[T], min(2*len(q.ring), q.capacity))
		n := copy(grown, q.ring[q.head:])
		copy(grown[n:], q.ring[:q.head])
		q.ring, q.head = grown, 0
	}
	q.ring[(q.head+q.size)%len(q.ring)] = it
	q.size++
}

func (q *Queue[T]) pushOverflow(it item[T]) {
	n := q.free
	if n != nil {
		q.free = n.next
		n.next = nil
	} else {
		n = &node[T]{}
	}
	n.item = it
	n.prev = q.last
	if q.last != nil {
		q.last.next = n
	} else {
		q.first = n
	}
	q.last = n
	q.overflow[it.key] = n
}

// popOverflow removes the oldest overflow item; the caller holds mu.
func (q *Queue[T]) popOverflow() item[T] {
	n := q.first
	q.first = n.next
	if q.first != nil {
		q.first.prev = nil
	} else {
		q.last = nil
	}
	delete(q.overflow, n.key)
	it := n.item
	var zero item[T]
	n.item, n.prev, n.next = zero, nil, q.free
	q.free = n
	return it
}

// TryTake removes and returns the oldest item, if there is one.
func (q *Queue[T]) TryTake() (key string, value T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	it, ok := q.takeLocked()
	return it.key, it.value, ok
}

func (q *Queue[T]) takeLocked() (item[T], bool) {
	if q.size == 0 {
		return item[T]{}, false
	}
	it := q.ring[q.head]
	q.ring[q.head] = item[T]{}
	q.head = (q.head + 1) % len(q.ring)
	q.size--
	// Refill the ring from the overflow so that coalescing only ever touches
	// what is beyond capacity.
	if q.first != nil {
		q.pushRing(q.popOverflow())
	}
	q.stats.Taken++
	return it, true
}

// Take waits for an item and removes it. It returns ctx's error when ctx
// ends first, and ErrClosed when the queue is closed and empty.
func (q *Queue[T]) Take(ctx context.Context) (key string, value T, err error) {
	batch, err := q.TakeBatch(ctx, 1, nil)
	if err != nil {
		return "", value, err
	}
	return batch[0].Key, batch[0].Value, nil
}

// Item is a taken item.
type Item[T any] struct {
	Key   string
	Value T
}

// TakeBatch waits for at least one item, then returns up to max items
// without waiting further, appended to buf[:0].
func (q *Queue[T]) TakeBatch(ctx context.Context, max int, buf []Item[T]) ([]Item[T], error) {
	buf = buf[:0]
	for {
		q.mu.Lock()
		for len(buf) < max {
			it, ok := q.takeLocked()
			if !ok {
				break
			}
			buf = append(buf, Item[T]{it.key, it.value})
		}
		closed := q.closed
		q.mu.Unlock()
		if len(buf) > 0 {
			return buf, nil
		}
		if closed {
			return buf, ErrClosed
		}
		select {
		case <-q.ready:
		case <-q.closedCh:
		case <-ctx.Done():
			return buf, ctx.Err()
		}
	}
}

// Len returns how many items are pending.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.size + len(q.overflow)
}

// Capacity returns the number of items kept in order before coalescing.
func (q *Queue[T]) Capacity() int { return q.capacity }

// Stats returns the queue's counts.
func (q *Queue[T]) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stats
}

// Close stops the queue from accepting items. Pending items can still be
// taken; then Take returns ErrClosed. Close is idempotent.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.closedCh)
	}
}

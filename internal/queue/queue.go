// Package queue is the bounded, coalescing buffer between the informer and a
// sink's delivery.
//
// Guarantees:
//
//   - Offer never blocks and never fails: the informer's handler only hands off.
//   - While no more than Capacity items are pending, every item is kept and
//     taken in the order it was offered (items of a claimed group wait, below).
//   - Beyond Capacity, the queue degrades to per-key coalescing: an item whose
//     key already waits in the overflow is combined with that item through
//     the Merge function, in place, so its position is kept; other items are
//     appended. Merge may also say that the two cancel out: both leave the
//     queue (an object created and deleted while the sink was away). Memory
//     is then bounded by Capacity plus the number of distinct keys, not by
//     the number of offers. Stats count what was merged and cancelled.
//   - Order per group is always kept: an item never overtakes an earlier item
//     of its group. Each key belongs to one group (with Offer, the key is its
//     own group; OfferIn names a wider one, e.g. an object across its uids).
//   - Claims: TakeClaimed claims the groups of the items it takes until they
//     are released; meanwhile no item of a claimed group is taken (the others
//     are, oldest first). A consumer with several batches in flight thus never
//     has one group in two of them, and sends each group's items in order.
//   - Nothing is dropped silently: an item leaves the queue only by being
//     taken, or cancelled by Merge (counted).
//
// Items offered after Close are discarded and counted; takes drain what is
// left, then report ErrClosed.
package queue

import (
	"context"
	"errors"
	"sync"
)

// ErrClosed is returned by takes once the queue is closed and empty.
var ErrClosed = errors.New("queue closed")

// Merge combines a pending value with a newer one for the same key. It
// returns what is kept: the newer state, adjusted so that a consumer that
// missed the older value still ends in the right state (e.g. added then
// updated stays added); or keep false when the two cancel out and neither
// needs to be delivered (e.g. added then deleted, never sent).
type Merge[T any] func(pending, newer T) (merged T, keep bool)

// Latest is the Merge that keeps the newer value.
func Latest[T any](_, newer T) (T, bool) { return newer, true }

// Queue is a bounded FIFO with per-key coalescing on overflow and per-group
// claims. The zero value is not usable; call New. It is safe for concurrent use.
type Queue[T any] struct {
	mu       sync.Mutex
	capacity int
	merge    Merge[T]

	// Every pending item, oldest first. The first min(size, capacity) are
	// kept as they are; spill is the first item beyond them (nil: none), and
	// it and the ones after it are the overflow, at most one per key.
	first, last *node[T]
	size        int
	spill       *node[T]
	overflow    map[string]*node[T]
	seq         uint64

	// groups keeps each group with pending items or claimed, and idle ones
	// (neither) until there are many: a key that comes back finds its group
	// without a map insert and delete each time. ready is a heap of those
	// with items and not claimed, by their oldest item.
	groups map[string]*group[T]
	idle   int
	ready  []entry[T]
	taking []*group[T] // scratch: groups claimed by the take in progress

	spare spare[T] // recycled nodes and groups
	sig   signals

	stats Stats
}

// Stats are counts since the queue was made. Offered = Taken + Coalesced +
// Cancelled + Len.
type Stats struct {
	Offered   uint64 // items offered while open
	Coalesced uint64 // items merged into a pending item with the same key
	Cancelled uint64 // items that left unsent because Merge cancelled them (two per pair)
	Taken     uint64
	Discarded uint64 // offered after Close
}

type node[T any] struct {
	key        string
	value      T
	seq        uint64
	over       bool // in the overflow (and in the overflow map)
	g          *group[T]
	prev, next *node[T] // queue order
	gprev      *node[T] // group order
	gnext      *node[T]
}

// entry is a group in the ready heap, with the sequence number of its
// oldest item (kept here so that comparisons read the heap's own memory).
type entry[T any] struct {
	seq uint64
	g   *group[T]
}

type group[T any] struct {
	key        string
	head, tail *node[T]
	claimed    bool
	gen        uint64 // counts claims, so that a stale Claim releases nothing
	idx        int    // in ready; -1 when not there
	next       *group[T]
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
	return &Queue[T]{
		capacity: capacity,
		merge:    merge,
		overflow: map[string]*node[T]{},
		groups:   map[string]*group[T]{},
		spare:    spare[T]{limit: capacity},
		sig:      newSignals(),
	}
}

// Offer adds an item that is its own group. It never blocks.
func (q *Queue[T]) Offer(key string, value T) { q.OfferIn(key, key, value) }

// OfferIn adds an item of a group: items of one group are taken in the
// order offered, and not while the group is claimed. Every item of one key
// must be offered in the same group. It never blocks.
func (q *Queue[T]) OfferIn(group, key string, value T) {
	q.mu.Lock()
	if q.sig.isClosed {
		q.stats.Discarded++
		q.mu.Unlock()
		return
	}
	q.stats.Offered++
	if q.spill != nil {
		if n, pending := q.overflow[key]; pending {
			merged, keep := q.merge(n.value, value)
			if keep {
				n.value = merged
				q.stats.Coalesced++
			} else {
				q.remove(n)
				q.stats.Cancelled += 2
			}
			q.mu.Unlock()
			return
		}
	}
	n := q.spare.node()
	n.key, n.value, n.seq = key, value, q.seq
	q.seq++
	n.prev = q.last
	if q.last != nil {
		q.last.next = n
	} else {
		q.first = n
	}
	q.last = n
	if q.size >= q.capacity {
		n.over = true
		q.overflow[key] = n
		if q.spill == nil {
			q.spill = n
		}
	}
	q.size++
	g := q.groups[group]
	switch {
	case g == nil:
		g = q.spare.group(group)
		q.groups[group] = g
	case g.head == nil && !g.claimed:
		q.idle--
	}
	n.g = g
	n.gprev = g.tail
	if g.tail != nil {
		g.tail.gnext = n
	} else {
		g.head = n
	}
	g.tail = n
	eligible := g.head == n && !g.claimed
	if eligible {
		q.push(g)
	}
	q.mu.Unlock()
	if eligible {
		q.sig.signal()
	}
}

// remove unlinks n from the queue and its group, keeping the overflow
// after the first capacity items and the heap in order; mu is held.
func (q *Queue[T]) remove(n *node[T]) {
	switch {
	case n.over:
		delete(q.overflow, n.key)
		if q.spill == n {
			q.spill = n.next
		}
	case q.spill != nil: // a kept item leaves: the oldest overflow item is kept from now on
		s := q.spill
		s.over = false
		delete(q.overflow, s.key)
		q.spill = s.next
	}
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		q.first = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		q.last = n.prev
	}
	q.size--
	if q.size == 0 && q.sig.isClosed {
		q.sig.drain()
	}

	g := n.g
	wasHead := g.head == n
	if n.gprev != nil {
		n.gprev.gnext = n.gnext
	} else {
		g.head = n.gnext
	}
	if n.gnext != nil {
		n.gnext.gprev = n.gprev
	} else {
		g.tail = n.gprev
	}
	switch {
	case g.head == nil:
		if g.idx >= 0 {
			q.removeAt(g.idx)
		}
		if !g.claimed {
			q.idled()
		}
	case wasHead && g.idx >= 0:
		q.ready[g.idx].seq = g.head.seq
		q.down(g.idx) // its oldest item is newer now
	}

	q.spare.putNode(n)
}

// idled counts a group that became idle, and drops the idle groups once
// they outnumber both capacity and the live ones: memory stays bounded by
// capacity plus objects, and a sweep's cost is spread over as many idles.
// mu is held.
func (q *Queue[T]) idled() {
	q.idle++
	if q.idle <= max(q.capacity, len(q.groups)-q.idle) {
		return
	}
	for key, g := range q.groups {
		if g.head != nil || g.claimed {
			continue
		}
		delete(q.groups, key)
		q.spare.putGroup(g)
	}
	q.idle = 0
}

// TryTake removes and returns the oldest item of a group that is not claimed,
// if there is one.
func (q *Queue[T]) TryTake() (key string, value T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var one [1]Item[T]
	if got := q.takeLocked(1, one[:0], false); len(got) == 1 {
		return got[0].Key, got[0].Value, true
	}
	return "", value, false
}

// takeLocked appends up to n of the oldest items of groups not claimed, in
// order; with claim, their groups become claimed. mu is held.
func (q *Queue[T]) takeLocked(n int, buf []Item[T], claim bool) []Item[T] {
	for len(buf) < n && len(q.ready) > 0 {
		g := q.ready[0].g
		oldest := g.head
		it := Item[T]{Key: oldest.key, Value: oldest.value, Group: g.key}
		if claim && !g.claimed {
			// Claimed from now on, but left in the heap until this take ends:
			// its next items may join the same batch, in order.
			g.claimed = true
			g.gen++
			it.Claim = Claim[T]{g, g.gen}
			q.taking = append(q.taking, g)
		}
		buf = append(buf, it)
		q.remove(oldest)
		q.stats.Taken++
	}
	for i, g := range q.taking {
		if g.idx >= 0 {
			q.removeAt(g.idx)
		}
		q.taking[i] = nil
	}
	q.taking = q.taking[:0]
	return buf
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
	// Group is the item's group.
	Group string
	// Claim is set (by TakeClaimed) on the first item of each group the take
	// claimed: Release it once done with the group's items.
	Claim Claim[T]
}

// Claim is a group claimed by a take, until Release. The zero Claim claims nothing.
type Claim[T any] struct {
	g   *group[T]
	gen uint64
}

// Claimed reports whether the item's take claimed its group (its Claim is set).
func (it Item[T]) Claimed() bool { return it.Claim.g != nil }

// TakeBatch waits for at least one item of a group that is not claimed, then
// returns up to max of them without waiting further, oldest first,
// appended to buf[:0].
func (q *Queue[T]) TakeBatch(ctx context.Context, max int, buf []Item[T]) ([]Item[T], error) {
	return q.take(ctx, max, buf, false)
}

// TakeClaimed is TakeBatch that also claims the groups of the items it takes
// (those with a Claim) until Release: no other take returns an item of
// theirs meanwhile.
func (q *Queue[T]) TakeClaimed(ctx context.Context, max int, buf []Item[T]) ([]Item[T], error) {
	return q.take(ctx, max, buf, true)
}

// ErrStopped is returned by TakeClaimedOr when its stop channel fired first.
var ErrStopped = errors.New("take stopped")

// TakeClaimedOr is TakeClaimed that also returns, with ErrStopped, once a value
// arrives on stop: a consumer that has other work coming due (a retry)
// waits for both without a goroutine or a context per take.
func (q *Queue[T]) TakeClaimedOr(ctx context.Context, max int, buf []Item[T], stop <-chan struct{}) ([]Item[T], error) {
	return q.takeOr(ctx, max, buf, true, stop)
}

// TakeFrom removes the pending items of the group c claims, appending them
// to buf in order, and keeps the group claimed: the taker folds an object's
// newer items into the ones it is retrying. It takes nothing once c was
// released.
func (q *Queue[T]) TakeFrom(c Claim[T], buf []Item[T]) []Item[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := c.g
	if g == nil || !g.claimed || g.gen != c.gen {
		return buf
	}
	for g.head != nil {
		n := g.head
		buf = append(buf, Item[T]{Key: n.key, Value: n.value, Group: g.key})
		q.remove(n)
		q.stats.Taken++
	}
	return buf
}

// HasItems reports whether the group c claims has pending items.
func (q *Queue[T]) HasItems(c Claim[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := c.g
	return g != nil && g.claimed && g.gen == c.gen && g.head != nil
}

// Busy reports whether a group has pending items or is claimed: an item
// offered in it before may not be settled yet.
func (q *Queue[T]) Busy(group string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := q.groups[group]
	return g != nil && (g.head != nil || g.claimed)
}

func (q *Queue[T]) take(ctx context.Context, n int, buf []Item[T], claim bool) ([]Item[T], error) {
	return q.takeOr(ctx, n, buf, claim, nil)
}

func (q *Queue[T]) takeOr(ctx context.Context, n int, buf []Item[T], claim bool, stop <-chan struct{}) ([]Item[T], error) {
	buf = buf[:0]
	n = max(n, 1)
	for {
		q.mu.Lock()
		buf = q.takeLocked(n, buf, claim)
		closed, empty, more := q.sig.isClosed, q.size == 0, len(q.ready) > 0
		q.mu.Unlock()
		if len(buf) > 0 {
			if more {
				q.sig.signal() // another waiter may take the rest
			}
			return buf, nil
		}
		if closed && empty {
			return buf, ErrClosed
		}
		// Closed but not empty: what is left belongs to claimed groups; a
		// Release wakes us, or another take that empties the queue.
		var closing <-chan struct{}
		if !closed {
			closing = q.sig.closed
		}
		select {
		case <-q.sig.wake:
		case <-closing:
		case <-q.sig.drained:
		case <-ctx.Done():
			return buf, ctx.Err()
		case <-stop:
			return buf, ErrStopped
		}
	}
}

// Release ends claims a TakeClaimed took (the Claim of each item that has
// one): the groups' items may be taken again. Releasing a claim again, or
// the zero Claim, does nothing.
func (q *Queue[T]) Release(claims ...Claim[T]) {
	woken := false
	q.mu.Lock()
	for _, c := range claims {
		g := c.g
		if g == nil || !g.claimed || g.gen != c.gen {
			continue
		}
		g.claimed = false
		if g.head == nil {
			q.idled()
			continue
		}
		q.push(g)
		woken = true
	}
	q.mu.Unlock()
	if woken {
		q.sig.signal()
	}
}

// Len returns how many items are pending (claimed groups' included).
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.size
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
// taken; then takes return ErrClosed. Close is idempotent.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sig.close(q.size == 0)
}

// The ready heap: groups by the sequence number of their oldest item, so
// that takes return the oldest eligible item first.

func (q *Queue[T]) less(i, j int) bool { return q.ready[i].seq < q.ready[j].seq }

func (q *Queue[T]) swap(i, j int) {
	q.ready[i], q.ready[j] = q.ready[j], q.ready[i]
	q.ready[i].g.idx, q.ready[j].g.idx = i, j
}

func (q *Queue[T]) push(g *group[T]) {
	g.idx = len(q.ready)
	q.ready = append(q.ready, entry[T]{g.head.seq, g})
	q.up(g.idx)
}

func (q *Queue[T]) removeAt(i int) {
	last := len(q.ready) - 1
	g := q.ready[i].g
	if i != last {
		q.swap(i, last)
	}
	q.ready[last] = entry[T]{}
	q.ready = q.ready[:last]
	g.idx = -1
	if i != last {
		q.down(i)
		q.up(i)
	}
}

func (q *Queue[T]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			return
		}
		q.swap(i, parent)
		i = parent
	}
}

func (q *Queue[T]) down(i int) {
	n := len(q.ready)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			return
		}
		q.swap(i, m)
		i = m
	}
}

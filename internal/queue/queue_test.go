package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// model is the queue's specification in its plainest form: one ordered
// list; an offer merges into (or cancels out with) a pending item of the
// same key only if that item sits beyond the first capacity positions, else
// it appends; a take returns the first items whose group is not claimed.
type model struct {
	capacity int
	items    []mItem
	claimed  map[string]bool
}

// mItem is an item as the model sees it: Claim is whether the take claimed
// its group.
type mItem struct {
	Key   string
	Value int
	Group string
	Claim bool
}

func (m mItem) String() string { return fmt.Sprintf("%s=%d@%s/%v", m.Key, m.Value, m.Group, m.Claim) }

func items(its []Item[int]) []mItem {
	out := make([]mItem, len(its))
	for i, it := range its {
		out[i] = mItem{it.Key, it.Value, it.Group, it.Claimed()}
	}
	return out
}

func (m *model) offer(group, key string, v int, merge Merge[int]) {
	for i := m.capacity; i < len(m.items); i++ {
		if m.items[i].Key == key {
			merged, keep := merge(m.items[i].Value, v)
			if keep {
				m.items[i].Value = merged
			} else {
				m.items = append(m.items[:i], m.items[i+1:]...)
			}
			return
		}
	}
	m.items = append(m.items, mItem{Key: key, Value: v, Group: group})
}

func (m *model) take(n int, claim bool) []mItem {
	var out []mItem
	taken := map[string]bool{}
	for i := 0; i < len(m.items) && len(out) < n; {
		it := m.items[i]
		if m.claimed[it.Group] {
			i++
			continue
		}
		if claim && !taken[it.Group] {
			it.Claim = true
			taken[it.Group] = true
		}
		out = append(out, it)
		m.items = append(m.items[:i], m.items[i+1:]...)
	}
	for g := range taken {
		m.claimed[g] = true
	}
	return out
}

// sumOrCancel is a merge that shows which values were combined, and
// cancels both when the newer value is a multiple of 5.
func sumOrCancel(a, b int) (int, bool) {
	if b%5 == 0 {
		return 0, false
	}
	return a*1000 + b, true
}

func check(t *testing.T, capacity int, ops []byte) {
	q := New(capacity, sumOrCancel)
	m := &model{capacity: capacity, claimed: map[string]bool{}}
	claims := map[string]Claim[int]{}
	done, cancel := context.WithCancel(context.Background())
	cancel() // takes below never wait
	v := 0
	for i, op := range ops {
		switch op % 5 {
		case 0:
			want := m.take(1, false)
			k, got, gok := q.TryTake()
			if gok != (len(want) == 1) || (gok && (want[0].Key != k || want[0].Value != got)) {
				t.Fatalf("op %d: TryTake = (%q, %d, %v), model %v", i, k, got, gok, want)
			}
		case 1:
			n := int(op/5)%4 + 1
			want := m.take(n, true)
			got, err := q.TakeClaimed(done, n, nil)
			if fmt.Sprint(items(got)) != fmt.Sprint(want) || (err != nil) != (len(want) == 0) {
				t.Fatalf("op %d: TakeClaimed(%d) = %v, %v; model %v", i, n, items(got), err, want)
			}
			for _, it := range got {
				if it.Claimed() {
					claims[it.Group] = it.Claim
				}
			}
		case 2:
			var claimed []string
			for g := range m.claimed {
				claimed = append(claimed, g)
			}
			if len(claimed) == 0 {
				continue
			}
			slices.Sort(claimed)
			g := claimed[int(op/5)%len(claimed)]
			delete(m.claimed, g)
			q.Release(claims[g], Claim[int]{})
			q.Release(claims[g]) // again: nothing
		default:
			v++
			k := int(op/5) % 7
			key, group := fmt.Sprint("k", k), fmt.Sprint("g", k%4)
			q.OfferIn(group, key, v)
			m.offer(group, key, v, sumOrCancel)
		}
		if q.Len() != len(m.items) {
			t.Fatalf("op %d: Len = %d, model %d", i, q.Len(), len(m.items))
		}
	}
	for g := range m.claimed {
		delete(m.claimed, g)
		q.Release(claims[g])
	}
	want := m.take(len(m.items), false)
	got, _ := q.TakeBatch(done, len(want), nil)
	if fmt.Sprint(items(got)) != fmt.Sprint(want) || q.Len() != 0 {
		t.Fatalf("drain: %v, model %v; %d left", items(got), want, q.Len())
	}
	s := q.Stats()
	if s.Offered != s.Taken+s.Coalesced+s.Cancelled {
		t.Fatalf("stats %+v: offered != taken + coalesced + cancelled", s)
	}
}

// FuzzQueueMatchesModel drives random offer/take/claim/release sequences
// through the queue and the model and requires the same results.
func FuzzQueueMatchesModel(f *testing.F) {
	f.Add(uint8(3), []byte{1, 2, 4, 5, 7, 8, 1, 1, 0, 0, 3, 1, 2})
	f.Add(uint8(1), []byte{1, 1, 1, 2, 2, 0, 1, 0, 0, 0})
	f.Add(uint8(64), []byte{})
	f.Fuzz(func(t *testing.T, capacity uint8, ops []byte) {
		check(t, int(capacity%80)+1, ops)
	})
}

// The model check over many seeded random sequences, so that plain
// `go test` covers claims, cancels and overflow together.
func TestQueueMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 2))
	for range 2000 {
		ops := make([]byte, rng.IntN(200))
		for i := range ops {
			ops[i] = byte(rng.IntN(256))
		}
		check(t, rng.IntN(12)+1, ops)
	}
}

func TestBelowCapacityKeepsEverythingInOrder(t *testing.T) {
	q := New[int](1000, nil)
	for i := range 1000 {
		q.Offer("same-key", i) // one object, 1000 states: all kept below capacity
	}
	for i := range 1000 {
		_, v, ok := q.TryTake()
		if !ok || v != i {
			t.Fatalf("take %d = %d, %v", i, v, ok)
		}
	}
	if s := q.Stats(); s.Coalesced != 0 {
		t.Errorf("coalesced %d below capacity", s.Coalesced)
	}
}

// Past capacity memory is bounded by the number of keys, and the latest
// value of every key is kept.
func TestOverflowIsBoundedByKeys(t *testing.T) {
	const capacity, keys, offers = 100, 1000, 50_000
	q := New[int](capacity, nil)
	for i := range offers {
		q.Offer(fmt.Sprint("obj-", i%keys), i)
		if q.Len() > capacity+keys {
			t.Fatalf("Len %d > capacity + keys", q.Len())
		}
	}
	latest := map[string]int{}
	for {
		k, v, ok := q.TryTake()
		if !ok {
			break
		}
		if prev, seen := latest[k]; seen && v <= prev {
			t.Fatalf("key %s: %d after %d", k, v, prev)
		}
		latest[k] = v
	}
	for i := range keys {
		if want := offers - keys + i; latest[fmt.Sprint("obj-", i)] != want {
			t.Fatalf("obj-%d ended at %d, want %d", i, latest[fmt.Sprint("obj-", i)], want)
		}
	}
	if s := q.Stats(); s.Coalesced == 0 || s.Offered != s.Taken+s.Coalesced+s.Cancelled {
		t.Errorf("stats %+v", s)
	}
}

func TestTakeWaitsAndCloseDrains(t *testing.T) {
	q := New[string](10, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	got := make(chan string, 10)
	for range 3 { // several waiters: Close must wake them all
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, v, err := q.Take(ctx)
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Errorf("Take: %v", err)
					}
					return
				}
				got <- v
			}
		}()
	}
	q.Offer("a", "1")
	q.Offer("b", "2")
	time.Sleep(10 * time.Millisecond)
	q.Close()
	q.Offer("c", "late")
	wg.Wait()
	close(got)
	n := 0
	for range got {
		n++
	}
	if n != 2 {
		t.Errorf("took %d items, want 2", n)
	}
	if s := q.Stats(); s.Discarded != 1 {
		t.Errorf("discarded %d, want 1", s.Discarded)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, _, err := New[int](1, nil).Take(ctx2); !errors.Is(err, context.Canceled) {
		t.Errorf("Take on cancelled ctx = %v", err)
	}
}

// Concurrent producers and one consumer: per-key order holds and each
// key's last value arrives (run with -race).
func TestConcurrentPerKeyOrder(t *testing.T) {
	q := New[int](64, nil)
	const producers, perProducer = 4, 20_000
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				q.Offer(fmt.Sprintf("p%d-k%d", p, i%50), i)
			}
		}()
	}
	done := make(chan struct{})
	last := map[string]int{}
	go func() {
		defer close(done)
		ctx := context.Background()
		var buf []Item[int]
		for {
			var err error
			buf, err = q.TakeBatch(ctx, 32, buf)
			if err != nil {
				return
			}
			for _, it := range buf {
				if prev, ok := last[it.Key]; ok && it.Value <= prev {
					t.Errorf("key %s: %d after %d", it.Key, it.Value, prev)
				}
				last[it.Key] = it.Value
			}
		}
	}()
	wg.Wait()
	q.Close()
	<-done
	for p := range producers {
		for k := range 50 {
			if want := perProducer - 50 + k; last[fmt.Sprintf("p%d-k%d", p, k)] != want {
				t.Fatalf("p%d-k%d ended at %d, want %d", p, k, last[fmt.Sprintf("p%d-k%d", p, k)], want)
			}
		}
	}
}

func BenchmarkOffer(b *testing.B) {
	q := New[int](1<<20, nil) // ring mode: growth is amortized, then no allocation
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		q.Offer("ns/name", i)
	}
}

func BenchmarkOfferTake(b *testing.B) {
	q := New[int](1024, nil)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		q.Offer("ns/name", i)
		q.TryTake()
	}
}

func BenchmarkOfferCoalescing(b *testing.B) {
	q := New[int](16, nil)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("ns/obj-", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		q.Offer(keys[i%len(keys)], i)
	}
}

// A claimed group's items wait, the others are taken past them; released,
// they come next, in order.
func TestHeldGroupWaits(t *testing.T) {
	q := New[string](100, nil)
	q.OfferIn("a", "a", "a1")
	q.OfferIn("a", "a", "a2")
	q.OfferIn("b", "b", "b1")
	q.OfferIn("a", "a", "a3")
	ctx := context.Background()
	first, err := q.TakeClaimed(ctx, 2, nil)
	if err != nil || fmt.Sprint(items2(first)) != "[a1/true a2/false]" {
		t.Fatalf("TakeClaimed = %v, %v: want a's first two items, a claimed once", items2(first), err)
	}
	second, err := q.TakeClaimed(ctx, 10, nil)
	if err != nil || fmt.Sprint(items2(second)) != "[b1/true]" {
		t.Fatalf("TakeClaimed = %v, %v: want b1 only (a is claimed)", items2(second), err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if got, err := q.TakeBatch(short, 10, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TakeBatch = %v, %v: a3 was taken while a is claimed", got, err)
	}
	q.Release(second[0].Claim, first[0].Claim)
	if got, err := q.TakeBatch(ctx, 10, nil); err != nil || fmt.Sprint(items2(got)) != "[a3/false]" {
		t.Fatalf("after Release: %v, %v", items2(got), err)
	}
	if q.Len() != 0 {
		t.Errorf("Len %d", q.Len())
	}
}

func items2(its []Item[string]) []string {
	out := make([]string, len(its))
	for i, it := range its {
		out[i] = fmt.Sprintf("%s/%v", it.Value, it.Claimed())
	}
	return out
}

// Closed with items of claimed groups left, a take waits for the release
// instead of reporting the queue drained.
func TestCloseWaitsForHeldGroups(t *testing.T) {
	q := New[int](10, nil)
	q.Offer("a", 1)
	q.Offer("a", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	claimed, _ := q.TakeClaimed(ctx, 1, nil)
	if len(claimed) != 1 || claimed[0].Value != 1 {
		t.Fatalf("took %v", claimed)
	}
	q.Close()
	took := make(chan []Item[int])
	go func() {
		got, err := q.TakeClaimed(ctx, 10, nil)
		if err != nil {
			t.Errorf("TakeClaimed: %v", err)
		}
		took <- got
	}()
	select {
	case got := <-took:
		t.Fatalf("took %v while a is claimed", got)
	case <-time.After(20 * time.Millisecond):
	}
	q.Release(claimed[0].Claim)
	got := <-took
	if len(got) != 1 || got[0].Value != 2 {
		t.Fatalf("took %v, want a's 2", got)
	}
	q.Release(got[0].Claim)
	if _, err := q.TakeClaimed(ctx, 10, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("drained queue: %v, want ErrClosed", err)
	}
}

// Pairs that cancel out beyond capacity leave nothing behind: memory stays
// bounded by capacity however many pass through while nothing is taken.
func TestCancelledPairsLeaveNothing(t *testing.T) {
	const capacity = 50
	cancelOnNegative := func(pending, newer int) (int, bool) { return newer, newer >= 0 }
	q := New(capacity, cancelOnNegative)
	for i := range 100_000 {
		key := fmt.Sprint("obj-", i)
		q.Offer(key, i)
		q.Offer(key, -1)
		if q.Len() > capacity {
			t.Fatalf("after %d pairs: Len %d > capacity %d", i+1, q.Len(), capacity)
		}
	}
	s := q.Stats()
	if s.Cancelled != 2*(100_000-capacity/2) || s.Offered != s.Taken+s.Coalesced+s.Cancelled+uint64(q.Len()) {
		t.Errorf("stats %+v, Len %d", s, q.Len())
	}
	// Within capacity nothing cancels: both of each of the first pairs are kept.
	for i := range capacity {
		_, v, _ := q.TryTake()
		if want := []int{i / 2, -1}[i%2]; v != want {
			t.Fatalf("item %d = %d, want %d", i, v, want)
		}
	}
}

// Several consumers taking claimed batches: no group is ever claimed by two at
// once, and each key's items arrive in order (run with -race). (Across the
// keys of one group, a coalesced item keeps its older position.)
func TestConcurrentHoldersNeverShareAGroup(t *testing.T) {
	q := New[int](64, nil)
	const groups, perGroup, consumers = 40, 500, 8
	var mu sync.Mutex
	holder := map[string]int{}
	last := map[string]int{}
	var wg sync.WaitGroup
	for c := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []Item[int]
			for {
				var err error
				buf, err = q.TakeClaimed(context.Background(), 8, buf)
				if err != nil {
					return
				}
				mu.Lock()
				var mine []Claim[int]
				for _, it := range buf {
					if h, ok := holder[it.Group]; ok && h != c {
						t.Errorf("group %s claimed by %d and %d", it.Group, h, c)
					}
					if it.Claimed() {
						holder[it.Group] = c
						mine = append(mine, it.Claim)
					}
					if prev, ok := last[it.Key]; ok && it.Value <= prev {
						t.Errorf("key %s: %d after %d", it.Key, it.Value, prev)
					}
					last[it.Key] = it.Value
				}
				for _, it := range buf {
					if it.Claimed() {
						delete(holder, it.Group)
					}
				}
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(50)) * time.Microsecond)
				q.Release(mine...)
			}
		}()
	}
	want := map[string]int{}
	for i := range perGroup {
		for g := range groups {
			key := fmt.Sprint("g", g, "-", i%3)
			q.OfferIn(fmt.Sprint("g", g), key, i)
			want[key] = i
		}
	}
	q.Close()
	wg.Wait()
	for key, v := range want {
		if last[key] != v {
			t.Errorf("%s ended at %d, want %d", key, last[key], v)
		}
	}
}

// Offers and claimed takes of 1,000 objects in turn, as a delivery does.
func BenchmarkOfferTakeHeldManyKeys(b *testing.B) {
	q := New[int](10_000, nil)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("ns/obj-", i)
	}
	ctx := context.Background()
	var buf []Item[int]
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		q.Offer(keys[i%len(keys)], i)
		if i%256 == 255 {
			buf, _ = q.TakeClaimed(ctx, 256, buf)
			for _, it := range buf {
				q.Release(it.Claim)
			}
		}
	}
}

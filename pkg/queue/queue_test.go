package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// model is the queue's specification in its plainest form: one ordered
// list; an offer merges into a pending item of the same key only if that
// item sits beyond the first capacity positions, else it appends.
type model struct {
	capacity int
	items    []Item[int]
}

func (m *model) offer(key string, v int, merge Merge[int]) {
	for i := m.capacity; i < len(m.items); i++ {
		if m.items[i].Key == key {
			m.items[i].Value = merge(m.items[i].Value, v)
			return
		}
	}
	m.items = append(m.items, Item[int]{key, v})
}

func (m *model) take() (Item[int], bool) {
	if len(m.items) == 0 {
		return Item[int]{}, false
	}
	it := m.items[0]
	m.items = m.items[1:]
	return it, true
}

// sum is a merge that shows which values were combined.
func sum(a, b int) int { return a*1000 + b }

func check(t *testing.T, capacity int, ops []byte) {
	q := New(capacity, sum)
	m := &model{capacity: capacity}
	v := 0
	for i, op := range ops {
		if op%3 == 0 {
			want, wok := m.take()
			k, got, gok := q.TryTake()
			if wok != gok || want.Key != k || want.Value != got {
				t.Fatalf("op %d: take = (%q, %d, %v), model (%q, %d, %v)", i, k, got, gok, want.Key, want.Value, wok)
			}
		} else {
			v++
			key := fmt.Sprint("k", op%7)
			q.Offer(key, v)
			m.offer(key, v, sum)
		}
		if q.Len() != len(m.items) {
			t.Fatalf("op %d: Len = %d, model %d", i, q.Len(), len(m.items))
		}
	}
	for {
		want, wok := m.take()
		k, got, gok := q.TryTake()
		if wok != gok || want.Key != k || want.Value != got {
			t.Fatalf("drain: take = (%q, %d, %v), model (%q, %d, %v)", k, got, gok, want.Key, want.Value, wok)
		}
		if !gok {
			break
		}
	}
	s := q.Stats()
	if s.Offered != s.Taken+s.Coalesced {
		t.Fatalf("stats %+v: offered != taken + coalesced", s)
	}
}

// FuzzQueueMatchesModel drives random offer/take sequences through the
// queue and the model and requires the same results.
func FuzzQueueMatchesModel(f *testing.F) {
	f.Add(uint8(3), []byte{1, 2, 4, 5, 7, 8, 1, 1, 0, 0, 3, 1, 2})
	f.Add(uint8(1), []byte{1, 1, 1, 2, 2, 0, 1, 0, 0, 0})
	f.Add(uint8(64), []byte{})
	f.Fuzz(func(t *testing.T, capacity uint8, ops []byte) {
		check(t, int(capacity%80)+1, ops)
	})
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
	if s := q.Stats(); s.Coalesced == 0 || s.Offered != s.Taken+s.Coalesced {
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

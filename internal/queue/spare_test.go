package queue

import (
	"slices"
	"testing"
)

// Spare nodes and groups come back zeroed, at most limit of each are
// kept, and a recycled group keeps its claim generation: a stale Claim on
// it must release nothing once it serves another key.
func TestSpare(t *testing.T) {
	s := spare[int]{limit: 2}
	for range 3 {
		s.putNode(&node[int]{key: "x", value: 1, seq: 9})
	}
	if s.nNodes != 2 {
		t.Errorf("kept %d nodes, want the limit 2", s.nNodes)
	}
	if n := s.node(); n.key != "" || n.value != 0 || n.seq != 0 || n.next != nil {
		t.Errorf("a spare node is not zero: %+v", n)
	}
	g := &group[int]{key: "a", claimed: true, gen: 7, idx: 3}
	s.putGroup(g)
	if got := s.group("b"); got != g || got.key != "b" || got.claimed || got.gen != 7 || got.idx != -1 {
		t.Errorf("recycled group %+v, want b, not claimed, generation 7, not in the heap", got)
	}
	if got := s.group("c"); got == g || got.key != "c" || got.idx != -1 {
		t.Errorf("a new group %+v", got)
	}
}

// A Claim taken before its group was recycled releases nothing of the
// key the group serves now.
func TestStaleClaimAfterRecycling(t *testing.T) {
	q := New[int](1, nil)
	var stale []Claim[int]
	// Keys come and go: idle groups are swept and recycled.
	for i := range 8 {
		q.Offer(string(rune('a'+i)), i)
		got, _ := q.TakeClaimed(t.Context(), 1, nil)
		stale = append(stale, got[0].Claim)
		q.Release(got[0].Claim)
	}
	q.Offer("z", 1)
	q.Offer("z", 2)
	got, _ := q.TakeClaimed(t.Context(), 1, nil)
	if len(got) != 1 || got[0].Key != "z" {
		t.Fatalf("took %v", got)
	}
	i := slices.IndexFunc(stale, func(c Claim[int]) bool { return c.g == got[0].Claim.g })
	if i < 0 {
		t.Fatal("z did not get a recycled group: the test does not test it")
	}
	q.Release(stale[i]) // an older claim of z's group
	if _, _, ok := q.TryTake(); ok {
		t.Error("z's second item was taken while z is claimed: a stale claim released it")
	}
	q.Release(got[0].Claim)
	if _, v, ok := q.TryTake(); !ok || v != 2 {
		t.Errorf("after the release: %v, %v", v, ok)
	}
}

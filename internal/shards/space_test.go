package shards

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/sharding"
	"k8s.io/apimachinery/pkg/types"
)

func object(uid, ns string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{}}}
	u.SetUID(types.UID(uid))
	u.SetNamespace(ns)
	u.SetName("x")
	return u
}

// Every object lies in exactly one shard, and it is the shard whose range
// the apiserver's own selector (k8s.io/apimachinery/pkg/sharding) puts it
// in: a replica filtering by Of and the apiserver filtering by Selector
// agree, for shard counts that divide the hash space evenly and those that
// do not.
func TestOfAgreesWithTheAPIServersSelector(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, key := range []string{KeyUID, KeyNamespace} {
		for _, n := range []int{1, 2, 3, 4, 7, 16, 100, MaxShards} {
			s := Space{N: n, Key: key}
			selectors := make([]sharding.Selector, n)
			for i := range n {
				selectors[i] = sharding.NewSelector(sharding.ShardRangeRequirement{Key: s.field(), Start: s.bound(i), End: s.bound(i + 1)})
			}
			for k := range 300 {
				o := object(fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rng.Uint32(), k, rng.IntN(4096), rng.IntN(4096), rng.Uint64()&(1<<48-1)), fmt.Sprintf("ns-%d", rng.IntN(50)))
				got := s.Of(o)
				if got < 0 || got >= n {
					t.Fatalf("N=%d key=%s: shard %d out of range", n, key, got)
				}
				for i, sel := range selectors {
					match, err := sel.Matches(o)
					if err != nil {
						t.Fatal(err)
					}
					if match != (i == got) {
						t.Fatalf("N=%d key=%s uid=%s: Of says shard %d, the apiserver's selector of shard %d says %v", n, key, o.GetUID(), got, i, match)
					}
				}
			}
		}
	}
}

// The edges of the hash space: hash 0 is in shard 0, the largest hash in
// the last, and every shard's first hash is in it while the hash before it
// is in the shard before.
func TestShardBoundaries(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16, 255, MaxShards} {
		s := Space{N: n, Key: KeyUID}
		if s.OfHash(0) != 0 || s.OfHash(^uint64(0)) != n-1 {
			t.Fatalf("N=%d: edges in shards %d and %d", n, s.OfHash(0), s.OfHash(^uint64(0)))
		}
		for i := 1; i < n; i++ {
			if s.OfHash(s.start(i)) != i || s.OfHash(s.start(i)-1) != i-1 {
				t.Fatalf("N=%d: shard %d starts at %#x, which is in shard %d (the hash before in %d)", n, i, s.start(i), s.OfHash(s.start(i)), s.OfHash(s.start(i)-1))
			}
		}
	}
}

// The selector joins adjacent owned shards into one range and ends the
// last at 2^64, as the apiserver's format wants; owning nothing asks for a
// range that holds a single hash.
func TestSelector(t *testing.T) {
	s := Space{N: 4, Key: KeyUID}
	got := s.Selector([]bool{true, true, false, true})
	want := "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
	if got != want {
		t.Fatalf("selector\n got %s\nwant %s", got, want)
	}
	ns := Space{N: 3, Key: KeyNamespace}.Selector([]bool{false, true, false})
	if ns != "shardRange(object.metadata.namespace, '0x5555555555555556', '0xaaaaaaaaaaaaaaab')" {
		t.Fatalf("namespace selector %s", ns)
	}
	if none := s.Selector(make([]bool, 4)); !strings.Contains(none, "'0x0000000000000000', '0x0000000000000001'") {
		t.Fatalf("owning nothing: %s", none)
	}
}

// FNV-1a as the apiserver computes it.
func TestHashIsTheAPIServersHash(t *testing.T) {
	for _, v := range []string{"", "default", "0b6b4f6e-1d7c-4a0e-9f7e-2f1d0c3b4a59"} {
		if got, want := fmt.Sprintf("%016x", Hash(v)), sharding.HashField(v); got != want {
			t.Fatalf("Hash(%q) = %s, apiserver %s", v, got, want)
		}
	}
}

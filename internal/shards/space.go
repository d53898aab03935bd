// Package shards splits a resource's objects into N virtual shards and
// owns shards through one Kubernetes Lease each.
//
// An object's shard is a 64-bit FNV-1a hash of its uid (or namespace)
// placed on N equal ranges of the hash space: the hash and the ranges of
// the apiserver's KEP-5866 shard selector (k8s.io/apimachinery
// pkg/sharding), so that a replica can ask the apiserver for exactly the
// objects of the shards it owns (Space.Selector) and filter the same way
// itself where the apiserver does not (Space.Of).
package shards

import (
	"fmt"
	"hash/fnv"
	"math/bits"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Keys an object is sharded by.
const (
	KeyUID       = "uid"
	KeyNamespace = "namespace"
)

// MaxShards bounds N: each shard is a Lease renewed every retry period.
const MaxShards = 256

// Space is N shards over one key.
type Space struct {
	N   int    // shards, 1 to MaxShards
	Key string // KeyUID or KeyNamespace
}

// Hash is the 64-bit FNV-1a hash of s: the apiserver's shard hash.
func Hash(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// OfHash is the shard whose range holds h: floor(h*N / 2^64).
func (s Space) OfHash(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(s.N))
	return int(hi)
}

// Value is what an object is hashed by: its uid or its namespace.
func (s Space) Value(u *unstructured.Unstructured) string {
	md, _ := u.Object["metadata"].(map[string]any)
	if s.Key == KeyNamespace {
		ns, _ := md["namespace"].(string)
		return ns
	}
	uid, _ := md["uid"].(string)
	return uid
}

// Of is the shard of object u.
func (s Space) Of(u *unstructured.Unstructured) int { return s.OfHash(Hash(s.Value(u))) }

// start is the first hash of shard i: ceil(i * 2^64 / N), so that h lies
// in shard i exactly when floor(h*N / 2^64) == i (OfHash). start(N) is
// 2^64, which does not fit: see bound.
func (s Space) start(i int) uint64 {
	q, _ := bits.Div64(uint64(i), uint64(s.N)-1, uint64(s.N))
	return q
}

// bound formats the start of shard i as a selector's hex bound: 16 digits,
// or 2^64 (17) past the last shard.
func (s Space) bound(i int) string {
	if i >= s.N {
		return "0x10000000000000000"
	}
	return fmt.Sprintf("0x%016x", s.start(i))
}

// field is the selector's field path of the key.
func (s Space) field() string {
	if s.Key == KeyNamespace {
		return "object.metadata.namespace"
	}
	return "object.metadata.uid"
}

// Selector is the apiserver shard selector (ListOptions.ShardSelector)
// that matches the objects of the shards in owned: one shardRange per run
// of adjacent shards. Owning nothing, it matches (almost) nothing: the
// single hash 0, which Of filters out too unless shard 0 is owned.
func (s Space) Selector(owned []bool) string {
	var parts []string
	for i := 0; i < s.N; {
		if !owned[i] {
			i++
			continue
		}
		j := i
		for j < s.N && owned[j] {
			j++
		}
		parts = append(parts, fmt.Sprintf("shardRange(%s, '%s', '%s')", s.field(), s.bound(i), s.bound(j)))
		i = j
	}
	if len(parts) == 0 {
		return fmt.Sprintf("shardRange(%s, '0x0000000000000000', '0x0000000000000001')", s.field())
	}
	return strings.Join(parts, " || ")
}

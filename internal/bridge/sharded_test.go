package bridge

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
)

// uidIn returns a uid whose shard in space is want.
func uidIn(space shards.Space, want int, tag string) string {
	for i := 0; ; i++ {
		uid := fmt.Sprintf("%s-%d", tag, i)
		if space.OfHash(shards.Hash(uid)) == want {
			return uid
		}
	}
}

// An object re-created under its name with a uid in another shard: the
// relist reports it as an update of the key (Replaced: the old
// incarnation). The old shard's deliverer sends the old uid's deletion,
// the new shard's the new uid's addition, each seeing only its shard's
// objects in the cache; neither sends the other's.
func TestShardRoutingAcrossAReplacedUID(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	space := shards.Space{N: 2, Key: shards.KeyUID}
	src := newFakeSource(t, reg)
	old := putUID(src, "x", uidIn(space, 0, "old"), "1")
	cfg := &config.Config{Sinks: []config.Sink{sinkCfg("a", "1")}}

	s := &sharded{space: space, logger: discard, byShard: map[int]*shardRun{}}
	for i := range 2 {
		d := testDeliverer(reg, discard, nil, filepath.Join(t.TempDir(), "state.db"))
		d.opts.Source = func() ([]*filters.Rule, source) { return src.rules, shardSource{in: src, space: space, shard: i} }
		s.byShard[i] = &shardRun{d: d}
		if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
			t.Fatal(err)
		}
		d.reconcileAll()
		t.Cleanup(func() { _, _ = d.stop(ctx, false) })
	}
	s.publish()
	waitChanges(t, ts, "added "+old.uid())

	fresh := putUID(src, "x", uidIn(space, 1, "new"), "2")
	s.notify(informer.Notification{Key: "ns/x", Targets: []informer.Target{{Rule: src.rules[0], Sinks: []string{"a"}}}, Cache: src.store,
		Object: fresh.obj, Replaced: old.obj})
	waitChanges(t, ts, "added "+old.uid(), "deleted "+old.uid(), "added "+fresh.uid())

	// Shard 0's view no longer holds the key; shard 1's holds the new uid.
	if n := s.byShard[0].d.reconcileAll() + s.byShard[1].d.reconcileAll(); n != 0 {
		t.Errorf("a reconciliation after the routing sent %d events: a shard's view was wrong", n)
	}
}

type putObj struct{ obj *unstructured.Unstructured }

func (p putObj) uid() string { return string(p.obj.GetUID()) }

// putUID stores ConfigMap ns/name with uid at rv in src.
func putUID(src *fakeSource, name, uid, rv string) putObj {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ConfigMap")
	obj.SetNamespace("ns")
	obj.SetName(name)
	obj.SetUID(types.UID(uid))
	obj.SetResourceVersion(rv)
	_ = src.store.Update(obj)
	return putObj{obj}
}

// waitChanges waits until sink a took exactly want (in any order between
// shards, in order per uid).
func waitChanges(t *testing.T, ts *testSinks, want ...string) {
	t.Helper()
	var got []string
	ok := testenv.Poll(5*time.Second, 5*time.Millisecond, func() bool {
		ts.mu.Lock()
		got = slices.Clone(ts.changes["a"])
		ts.mu.Unlock()
		return len(got) == len(want) && slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
	})
	if !ok {
		t.Fatalf("sink took %v, want %v", got, want)
	}
}

// A checkpoint bucket remembers its layout: a config asking for another
// one (sharding on over unsharded views, off over sharded ones, another
// shard count) is refused, naming both; an empty bucket takes the config's.
func TestCheckpointLayoutIsFixed(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T) checkpoint.Store {
		store, err := checkpoint.OpenBolt(filepath.Join(t.TempDir(), "state.db"), false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		return store
	}
	cfgWith := func(sh *config.Sharding) *config.Config {
		return &config.Config{Sharding: sh, Rules: []config.Rule{{Name: "cms", Sinks: []string{"a"}}}}
	}
	eight, four := &config.Sharding{Shards: 8, Key: "uid"}, &config.Sharding{Shards: 4, Key: "uid"}

	t.Run("sharded bucket", func(t *testing.T) {
		store := open(t)
		if err := checkShardLayout(ctx, store, cfgWith(eight)); err != nil {
			t.Fatalf("an empty bucket refused: %v", err)
		}
		if err := checkShardLayout(ctx, store, cfgWith(eight)); err != nil {
			t.Fatalf("the same layout refused: %v", err)
		}
		for _, c := range []*config.Config{cfgWith(four), cfgWith(nil)} {
			err := checkShardLayout(ctx, store, c)
			if err == nil {
				t.Fatalf("sharding %+v accepted over a bucket of 8 shards", c.Sharding)
			}
			if want := "written with sharding 8 shards by uid"; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	})
	t.Run("unsharded views", func(t *testing.T) {
		store := open(t)
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(store.Apply(ctx, []checkpoint.Change{{Sink: "a", Rule: "cms", Key: "ns/x", Entry: &checkpoint.Entry{UID: "u", ResourceVersion: "1", Name: "x"}}}))
		if err := checkShardLayout(ctx, store, cfgWith(nil)); err != nil {
			t.Fatalf("unsharded over unsharded views refused: %v", err)
		}
		if err := checkShardLayout(ctx, store, cfgWith(eight)); err == nil || !strings.Contains(err.Error(), "written with sharding off") {
			t.Fatalf("sharding over unsharded views: %v", err)
		}
	})
}

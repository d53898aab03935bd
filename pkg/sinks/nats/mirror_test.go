package nats

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/mirror"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func mirrorConfig(url string) *Config {
	c := &Config{URL: url, Subject: DefaultSubject, MaxPending: DefaultMaxPending, Fence: true, Mirror: &Mirror{}}
	c.Mirror.SetDefaults()
	return c
}

func connectMirror(t *testing.T, url string) Mirroring {
	t.Helper()
	s, err := Connect(context.Background(), "views", mirrorConfig(url), nil)
	must(t, err)
	t.Cleanup(func() { s.Close(context.Background()) })
	return Mirroring{s}
}

// bucketOf reads the bucket of rule "r" as a consumer does: key -> the
// object's name, uid and resourceVersion, or the marker's reason.
func bucketOf(t *testing.T, url string) map[string]string {
	t.Helper()
	nc, err := natsgo.Connect(url)
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	kv, err := js.KeyValue(context.Background(), "kubebridge-r")
	must(t, err)
	w, err := kv.WatchAll(context.Background(), jetstream.IgnoreDeletes())
	must(t, err)
	defer w.Stop()
	out := map[string]string{}
	for e := range w.Updates() {
		if e == nil {
			return out
		}
		if strings.HasPrefix(e.Key(), mirror.ReservedPrefix) {
			continue
		}
		var v struct {
			Type string `json:"type"`
			Data struct {
				Object struct {
					Metadata struct {
						Name, UID, ResourceVersion string
						Annotations                map[string]string
					}
				}
			}
		}
		must(t, json.Unmarshal(e.Value(), &v))
		md := v.Data.Object.Metadata
		s := md.Name + " " + md.UID + " rv" + md.ResourceVersion
		if why := md.Annotations[mirror.TruncatedAnnotation]; why != "" {
			s += " truncated"
		}
		out[e.Key()] = s
	}
	t.Fatal("the watch closed")
	return nil
}

func deleted(e *event.Event) *event.Event {
	e.Change = event.Deleted
	return e
}

// A mirror holds each object's latest state under its key and nothing of
// an object that left the view; in a batch, only a key's last event is
// written, and the batch is acknowledged as a whole.
func TestMirrorHoldsTheView(t *testing.T) {
	srv := startServer(t, 0)
	s := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	must(t, s.Send(ctx, []*event.Event{ev("prod", "a", 1, 10), ev("prod", "b", 1, 10), ev("prod", "a", 2, 10), ev("dev", "x.y", 5, 10)}))
	must(t, s.Send(ctx, []*event.Event{deleted(ev("prod", "b", 3, 10)), ev("prod", "a", 4, 10)}))
	got := bucketOf(t, srv.ClientURL())
	want := map[string]string{"prod.a": "a uid-a rv4", "dev.x=2Ey": "x.y uid-x.y rv5"}
	if len(got) != len(want) {
		t.Fatalf("bucket = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("bucket[%s] = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	// Held reads the same, as HeldObjects.
	held, err := s.Held(ctx, "r")
	must(t, err)
	var names []string
	for _, h := range held {
		names = append(names, h.Namespace+"/"+h.Name+"@"+h.ResourceVersion)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "dev/x.y@5,prod/a@4" {
		t.Errorf("Held = %v", names)
	}
}

// An object whose event is over what the server takes is stored as a
// marker naming it, counted; it never stalls the mirror, and the next
// state that fits replaces it.
func TestMirrorStoresAMarkerForATooLargeObject(t *testing.T) {
	srv := startServer(t, 4096)
	s := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	must(t, s.Send(ctx, []*event.Event{ev("prod", "big", 1, 8000), ev("prod", "small", 1, 10)}))
	got := bucketOf(t, srv.ClientURL())
	if got["prod.big"] != "big uid-big rv1 truncated" || got["prod.small"] != "small uid-small rv1" {
		t.Fatalf("bucket = %v", got)
	}
	if n := s.Truncations(); n != 1 {
		t.Errorf("Truncations = %d, want 1", n)
	}
	held, err := s.Held(ctx, "r")
	must(t, err)
	for _, h := range held {
		if h.Name == "big" && h.ResourceVersion != "" {
			t.Errorf("a marker is held at resourceVersion %q, want \"\" (sent again at the next load)", h.ResourceVersion)
		}
	}
	must(t, s.Send(ctx, []*event.Event{ev("prod", "big", 2, 100)}))
	if got := bucketOf(t, srv.ClientURL())["prod.big"]; got != "big uid-big rv2" {
		t.Errorf("after it fits again: %q", got)
	}
}

// A replica that gave an object up cannot overwrite the key after its
// successor wrote it: its write expects the revision it knew, and the
// stream refuses it; it adopts the stream's revision only while its fence
// holds.
func TestMirrorRefusesAStaleWriter(t *testing.T) {
	srv := startServer(t, 0)
	a := connectMirror(t, srv.ClientURL())
	b := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	must(t, a.Send(ctx, []*event.Event{ev("prod", "x", 1, 10)}))
	_, err := b.Held(ctx, "r") // b takes over: it loads what the bucket holds
	must(t, err)
	must(t, b.Send(ctx, []*event.Event{deleted(ev("prod", "x", 2, 10))}))

	gone := errors.New("shard given up")
	stale := sinks.WithFence(ctx, sinks.Fence{Shards: 2, Epoch: 1, Valid: func() error { return gone }})
	err = a.Send(stale, []*event.Event{ev("prod", "x", 3, 10)})
	if !sinks.IsFenced(err) {
		t.Fatalf("the stale writer's Send = %v, want fenced", err)
	}
	if got := bucketOf(t, srv.ClientURL()); len(got) != 0 {
		t.Fatalf("bucket = %v after the successor deleted x, want it empty", got)
	}
	// A writer whose fence holds adopts the revision and writes.
	must(t, a.Send(ctx, []*event.Event{ev("prod", "x", 4, 10)}))
	if got := bucketOf(t, srv.ClientURL())["prod.x"]; got != "x uid-x rv4" {
		t.Errorf("bucket[prod.x] = %q", got)
	}
}

// Values the sink did not write are held under a uid of their own, so the
// diff replaces or deletes them; keys that are no object's are left alone.
func TestMirrorHeldReadsForeignValues(t *testing.T) {
	srv := startServer(t, 0)
	s := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	must(t, s.Send(ctx, []*event.Event{ev("prod", "a", 1, 10)}))
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "kubebridge-r")
	must(t, err)
	_, err = kv.Put(ctx, "prod.junk", []byte("not json"))
	must(t, err)
	_, err = kv.Put(ctx, "prod.a=", []byte("{}")) // no object's key
	must(t, err)
	held, err := s.Held(ctx, "r")
	must(t, err)
	var got []string
	for _, h := range held {
		got = append(got, h.Name+":"+strings.Split(h.UID, "-")[0])
	}
	sort.Strings(got)
	if strings.Join(got, ",") != "a:uid,junk:kubebridge" {
		t.Errorf("Held = %v", got)
	}
}

// Compaction purges deletion markers older than the retention, raising
// the compacted revision past them first; a write after a marker stays.
func TestMirrorCompactsOldMarkers(t *testing.T) {
	srv := startServer(t, 0)
	s := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	must(t, s.Send(ctx, []*event.Event{ev("prod", "a", 1, 10), ev("prod", "b", 1, 10), ev("prod", "c", 1, 10)}))
	must(t, s.Send(ctx, []*event.Event{deleted(ev("prod", "a", 2, 10)), deleted(ev("prod", "b", 2, 10))}))
	cut := time.Now().Add(time.Second)
	must(t, s.Send(ctx, []*event.Event{deleted(ev("prod", "c", 2, 10))})) // made before the cutoff too
	must(t, s.compact(ctx, "kubebridge-r", cut))

	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "kubebridge-r")
	must(t, err)
	e, err := kv.Get(ctx, mirror.CompactedKey)
	must(t, err)
	c, _ := strconv.ParseUint(string(e.Value()), 10, 64)
	if c != 6 { // three puts, then markers at 4, 5 and 6
		t.Errorf("compacted = %d, want 6", c)
	}
	st, err := js.Stream(ctx, "KV_kubebridge-r")
	must(t, err)
	info, err := st.Info(ctx)
	must(t, err)
	if info.State.Msgs != 1 { // the compacted key alone
		t.Errorf("the bucket holds %d messages after compaction, want 1", info.State.Msgs)
	}
	// The sink writes the purged keys again.
	must(t, s.Send(ctx, []*event.Event{ev("prod", "a", 3, 10)}))
	if got := bucketOf(t, srv.ClientURL())["prod.a"]; got != "a uid-a rv3" {
		t.Errorf("bucket[prod.a] = %q", got)
	}
}

func TestMirrorConfig(t *testing.T) {
	c := mirrorConfig("nats://127.0.0.1:4222")
	must(t, c.Validate())
	must(t, c.Mirror.Validate())
	if err := c.CheckRule(&config.Rule{Name: "pods of team a"}); err == nil || !strings.Contains(err.Error(), `"kubebridge-pods of team a"`) {
		t.Errorf("CheckRule of a rule whose bucket name is invalid = %v", err)
	}
	must(t, c.CheckRule(&config.Rule{Name: "pods_team-a"}))
	must(t, c.CheckRule(&config.Rule{Name: "meta", Include: []string{"metadata"}}))
	for _, r := range []config.Rule{{Name: "some", Events: []string{"deleted"}}, {Name: "chg", Changed: []string{"spec"}}, {Name: "patch", Include: []string{"patch"}}} {
		if err := c.CheckRule(&r); err == nil {
			t.Errorf("CheckRule(%+v) passed: a mirror cannot hold that rule's view", r)
		}
	}
	m := &Mirror{}
	m.SetDefaults()
	m.Bucket = "views"
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "{rule}") {
		t.Errorf("a bucket without {rule}: %v", err)
	}
	if !Factory.Fences(c) {
		t.Error("a mirror writes with revision checks: it fences")
	}
}

// One name, two incarnations delivered by two writers (shards by uid): the
// old one's writes that come after the new one's are moot, not applied:
// the key keeps the new object.
func TestMirrorKeepsTheNewIncarnationOfAName(t *testing.T) {
	srv := startServer(t, 0)
	a := connectMirror(t, srv.ClientURL())
	b := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	must(t, a.Send(ctx, []*event.Event{ev("prod", "x", 1, 10)}))
	newer := ev("prod", "x", 5, 10)
	newer.Object().SetUID("uid-x2")
	newer = event.New(testRule, event.Added, newer.Object(), nil, time.Now())
	must(t, b.Send(ctx, []*event.Event{newer})) // b never read the bucket: its write is refused once, then adopts
	// a's late writes of the old incarnation: an update, then its deletion.
	must(t, a.Send(ctx, []*event.Event{ev("prod", "x", 2, 10)}))
	must(t, a.Send(ctx, []*event.Event{deleted(ev("prod", "x", 3, 10))}))
	if got := bucketOf(t, srv.ClientURL())["prod.x"]; got != "x uid-x2 rv5" {
		t.Errorf("bucket[prod.x] = %q, want the new incarnation", got)
	}
}

// fold decides what a key is to hold from what it holds and its events.
func TestMirrorFold(t *testing.T) {
	obj := func(uid string, rv int, change event.Change) *event.Event {
		e := ev("ns", "x", rv, 0)
		e.Object().SetUID(types.UID(uid))
		return event.New(testRule, change, e.Object(), nil, time.Now())
	}
	u1, u2 := uidHash("u1"), uidHash("u2")
	for _, c := range []struct {
		name  string
		from  keyState
		evs   []*event.Event
		write int // index into evs; -1: moot
	}{
		{"a new key", keyState{}, []*event.Event{obj("u1", 5, event.Added)}, 0},
		{"a newer state", keyState{uid: u1, rv: 5}, []*event.Event{obj("u1", 7, event.Updated)}, 0},
		{"an older state of the same object", keyState{uid: u1, rv: 9}, []*event.Event{obj("u1", 7, event.Updated)}, -1},
		{"the old incarnation after the new one", keyState{uid: u2, rv: 20}, []*event.Event{obj("u1", 7, event.Updated)}, -1},
		{"the old incarnation's deletion", keyState{uid: u2, rv: 20}, []*event.Event{obj("u1", 8, event.Deleted)}, -1},
		{"the new incarnation over the old", keyState{uid: u1, rv: 7}, []*event.Event{obj("u2", 20, event.Added)}, 0},
		{"re-entry at the same resourceVersion (a namespace relabelled)", keyState{gone: u1, rv: 7}, []*event.Event{obj("u1", 7, event.Added)}, 0},
		{"another incarnation after a marker of unknown version", keyState{rev: 3}, []*event.Event{obj("u2", 2, event.Added)}, 0},
		{"a deletion of what the key holds", keyState{uid: u1, rv: 7}, []*event.Event{obj("u1", 7, event.Deleted)}, 0},
		{"deleted and re-created in one batch, out of order", keyState{uid: u1, rv: 7},
			[]*event.Event{obj("u2", 20, event.Added), obj("u1", 8, event.Deleted)}, 0},
		{"created and deleted in one batch", keyState{}, []*event.Event{obj("u1", 3, event.Added), obj("u1", 4, event.Deleted)}, 1},
	} {
		idx := make([]int, len(c.evs))
		for i := range idx {
			idx[i] = i
		}
		if got, _ := fold(c.from, c.evs, idx); got != c.write {
			t.Errorf("%s: writes event %d, want %d", c.name, got, c.write)
		}
	}
}

// A replica that gave a shard up finds, where the key is, that a newer
// holding of the shard wrote it: its writes are refused (fenced) whatever
// its own clock says, also for a key it knows nothing of (read before a
// deletion), and a deletion or a re-entry of the same object.
func TestMirrorRefusesAnOlderHoldingAtTheKey(t *testing.T) {
	srv := startServer(t, 0)
	a := connectMirror(t, srv.ClientURL())
	b := connectMirror(t, srv.ClientURL())
	ctx := context.Background()
	holding := func(epoch uint64) context.Context {
		return sinks.WithFence(ctx, sinks.Fence{Shard: 1, Shards: 4, Epoch: epoch}) // Valid nil: its clock says it still holds
	}
	must(t, a.Send(holding(1), []*event.Event{ev("prod", "x", 5, 10), ev("prod", "y", 5, 10)}))
	_, err := b.Held(ctx, "r") // b takes the shard over
	must(t, err)
	must(t, b.Send(holding(2), []*event.Event{ev("prod", "x", 7, 10)}))

	// a's queued deletion of x (at an older resourceVersion), refused at
	// the key although a's memory of it is stale
	if err := a.Send(holding(1), []*event.Event{deleted(ev("prod", "x", 6, 10))}); !sinks.IsFenced(err) {
		t.Errorf("the older holding's deletion: %v, want fenced", err)
	}
	// a, its memory lost (a restart of its process would not keep the
	// epoch either): the key is read before the deletion
	a.mirror.keys.clear()
	if err := a.Send(holding(1), []*event.Event{deleted(ev("prod", "x", 6, 10))}); !sinks.IsFenced(err) {
		t.Errorf("the older holding's deletion of a key it knows nothing of: %v, want fenced", err)
	}
	if got := bucketOf(t, srv.ClientURL())["prod.x"]; got != "x uid-x rv7" {
		t.Errorf("bucket[prod.x] = %q, want the newer holding's", got)
	}
	// y, which b never wrote, a may still write: its writes land before
	// any of b's (each expects the revision it knows).
	must(t, a.Send(holding(1), []*event.Event{ev("prod", "y", 8, 10)}))
}

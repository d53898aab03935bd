package mirror

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
)

func TestParseValue(t *testing.T) {
	v, err := ParseValue(envelope(configMap("ns", "a", "ua", 7, "x")))
	if err != nil {
		t.Fatal(err)
	}
	if v.Rule != "r" || v.Cluster != "test" || v.SpecVersion != "1.0" || v.Subject != "ns/a" || !strings.HasPrefix(string(v.Object), `{"apiVersion":"v1"`) {
		t.Errorf("ParseValue = %+v", v)
	}
	for in, why := range map[string]string{
		"":                              "not a JSON CloudEvent",
		"[]":                            "not a JSON CloudEvent",
		`{"specversion":"1.0"}`:         "no data",
		`{"data":null}`:                 "no data",
		`{"data":{}}`:                   "not a JSON object",
		`{"data":{"object":"x"}}`:       "not a JSON object",
		`{"data":{"object":[1]}}`:       "not a JSON object",
		`{"data":"eyJvYmplY3QiOnt9fQ"}`: "not a JSON CloudEvent", // data_base64-like: not ours
	} {
		if _, err := ParseValue([]byte(in)); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseValue(%q) = %v, want %q", in, err, why)
		}
	}
}

// A marker (an object too large, cut to its identity) reads as the object
// it names, with TruncatedAnnotation.
func TestMarkerReads(t *testing.T) {
	obj := configMap("ns", "big", "ub", 9, "")
	delete(obj, "data")
	obj["metadata"].(map[string]any)["annotations"] = map[string]any{TruncatedAnnotation: "1572864 bytes > 1048576"}
	lw := NewListerWatcher(fakeKV{}, Options{Object: &corev1.ConfigMap{}})
	o, _, err := lw.decode(Key("ns", "big"), 42, envelope(obj))
	if err != nil {
		t.Fatal(err)
	}
	cm := o.(*corev1.ConfigMap)
	if cm.ResourceVersion != "42" || cm.Annotations[ResourceVersionAnnotation] != "9" || cm.Annotations[TruncatedAnnotation] == "" || cm.UID != "ub" {
		t.Errorf("marker read as %+v", cm.ObjectMeta)
	}
}

// fakeKV is a bucket holding only CompactedKey, for apply.
type fakeKV struct {
	jetstream.KeyValue
	compacted string
}

func (fakeKV) Bucket() string { return "fake" }

func (f fakeKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	if f.compacted == "" {
		return nil, jetstream.ErrKeyNotFound
	}
	return entry{key: CompactedKey, value: []byte(f.compacted)}, nil
}

type entry struct {
	key   string
	rev   uint64
	op    jetstream.KeyValueOp
	value []byte
}

func (e entry) Bucket() string                  { return "fake" }
func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return e.value }
func (e entry) Revision() uint64                { return e.rev }
func (e entry) Created() time.Time              { return time.Time{} }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }

// applied runs apply on batch from pos, returning the events it sent and
// whether the watch goes on.
func applied(kv fakeKV, pos, compacted uint64, batch ...jetstream.KeyValueEntry) ([]string, bool) {
	lw := NewListerWatcher(kv, Options{})
	w := &watcher{result: make(chan watch.Event, 16)}
	st := watchState{pos: pos, compacted: compacted}
	ok := lw.apply(context.Background(), w, batch, &st)
	close(w.result)
	var out []string
	for ev := range w.result {
		out = append(out, string(ev.Type))
	}
	return out, ok
}

func put(key string, rev uint64) entry {
	ns, name, _, _ := ParseKey(key)
	return entry{key: key, rev: rev, op: jetstream.KeyValuePut, value: envelope(configMap(ns, name, "u", 1, "x"))}
}

// A compaction that overtakes a running watch: a revision missing at or
// below the compaction may have been a deletion, so the watch ends with
// 410; missing above it, it was superseded, and the watch goes on.
func TestApplyGaps(t *testing.T) {
	for _, c := range []struct {
		name      string
		kv        fakeKV
		pos, comp uint64
		batch     []jetstream.KeyValueEntry
		want      string
		goesOn    bool
	}{
		{"no gap", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{put("ns.a", 11), put("ns.b", 12)}, "MODIFIED MODIFIED", true},
		{"gap above the compaction", fakeKV{compacted: "5"}, 10, 0, []jetstream.KeyValueEntry{put("ns.a", 13)}, "MODIFIED", true},
		{"gap at the compaction, read fresh", fakeKV{compacted: "11"}, 10, 0, []jetstream.KeyValueEntry{put("ns.a", 13)}, "ERROR", false},
		{"gap at a compaction in the batch", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{put("ns.a", 11), put("ns.b", 14), entry{key: CompactedKey, rev: 15, value: []byte("13")}}, "ERROR", false},
		{"gap at a compaction known", fakeKV{}, 10, 12, []jetstream.KeyValueEntry{put("ns.a", 12)}, "ERROR", false},
		{"reserved and foreign keys pass", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{entry{key: CompactedKey, rev: 11, value: []byte("3")}, put("bad", 12), entry{key: "ns.a", rev: 13, op: jetstream.KeyValueDelete}}, "DELETED", true},
		{"read already", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{put("ns.a", 9), put("ns.a", 10), nil, put("ns.b", 11)}, "MODIFIED", true},
		{"a purge is a deletion", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{entry{key: "ns.a", rev: 11, op: jetstream.KeyValuePurge}}, "DELETED", true},
		{"an unreadable put is a deletion", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{entry{key: "ns.a", rev: 11, op: jetstream.KeyValuePut, value: []byte("{")}}, "DELETED", true},
		{"an unnamed hashed deletion", fakeKV{}, 10, 0, []jetstream.KeyValueEntry{entry{key: "ns." + HashedPrefix + strings.Repeat("0", 64), rev: 11, op: jetstream.KeyValueDelete}}, "ERROR", false},
	} {
		got, goesOn := applied(c.kv, c.pos, c.comp, c.batch...)
		if strings.Join(got, " ") != c.want || goesOn != c.goesOn {
			t.Errorf("%s: events %v, goes on %v; want %s, %v", c.name, got, goesOn, c.want, c.goesOn)
		}
	}
}

// No value, however hostile, panics the decoder.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(envelope(configMap("ns", "a", "ua", 1, "x"))))
	f.Add([]byte(`{"data":{"object":{"kind":"X","metadata":{"name":"a","namespace":"ns","annotations":null}}}}`))
	f.Add([]byte(`{"data":{"object":{"apiVersion":1,"kind":{},"metadata":[]}}}`))
	f.Add([]byte(`{"data":{"object":{"kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","resourceVersion":7}}}}`))
	untyped := NewListerWatcher(fakeKV{}, Options{MaxValueBytes: 1 << 16})
	typed := NewListerWatcher(fakeKV{}, Options{Object: &corev1.ConfigMap{}})
	gvk := &unstructured.Unstructured{}
	gvk.SetAPIVersion("v1")
	gvk.SetKind("ConfigMap")
	kinded := NewListerWatcher(fakeKV{}, Options{Object: gvk})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ParseValue(b); err != nil {
			return
		}
		for _, lw := range []*ListerWatcher{untyped, typed, kinded} {
			o, _, err := lw.decode("ns.a", 3, b)
			if err != nil {
				continue
			}
			st := lw.stub("ns", "a", 4)
			if o == nil || st == nil {
				t.Fatal("nil object")
			}
		}
	})
}

// A compaction past the revision a snapshot started from may have purged a
// deletion the snapshot had not reached: the snapshot is refused (410).
func TestOvertaken(t *testing.T) {
	ctx := context.Background()
	for comp, expired := range map[string]bool{"": false, "9": false, "10": false, "11": true} {
		err := NewListerWatcher(fakeKV{compacted: comp}, Options{}).overtaken(ctx, 10)
		if apierrors.IsResourceExpired(err) != expired || (!expired && err != nil) {
			t.Errorf("compacted %q, snapshot from 10: %v", comp, err)
		}
	}
	if err := NewListerWatcher(fakeKV{compacted: "x"}, Options{}).overtaken(ctx, 10); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("compacted %q: %v, want unavailable", "x", err)
	}
}

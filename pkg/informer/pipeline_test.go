package informer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/internal/stage"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/internal/view"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/file"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/sinks/webhook"
)

// nullSink acknowledges everything; with encode it first renders each
// event as a byte-sink would.
type nullSink struct {
	encode bool
	n      atomic.Int64
}

func (s *nullSink) Send(_ context.Context, evs []*event.Event) error {
	if s.encode {
		for _, e := range evs {
			if _, err := e.Structured(); err != nil {
				return err
			}
		}
	}
	s.n.Add(int64(len(evs)))
	return nil
}

func (s *nullSink) Close(context.Context) error { return nil }

// BenchmarkPipeline drives the informer handler with updates of 1,000
// ~1 KiB ConfigMaps under a rule with a label selector and a namespace:
// the handler notifies the key and the state, the receiver (as the
// bridge's: the rules stage once, then a view.Handed per sink) diffs it with what the sink was handed,
// builds the event and offers it to the sink's queue; the benchmark waits
// until the sink's worker has taken every event. It is the in-process cost
// per notification after client-go handed the object over. client-go
// writes its cache before it calls the handler (Notification.Cache reads
// it): the "+cache" variants time that write too; the others write each
// pass's states while the timer is stopped, as they build them. The "x3"
// variants deliver the rule to three sinks of the kind (each its own
// view, queue and worker): one op is still one notification. Run it with
// -cpu 1 for one core.
func BenchmarkPipeline(b *testing.B) {
	for _, bc := range []struct {
		name       string
		cacheWrite bool                                    // timed
		sink       func(b *testing.B) (sinks.Sink, string) // and its config block
		fanOut     int                                     // sinks of the rule; 0: 1
	}{
		{"null", false, func(*testing.B) (sinks.Sink, string) { return &nullSink{}, "file: {path: unused}" }, 0},
		{"null+cache", true, func(*testing.B) (sinks.Sink, string) { return &nullSink{}, "file: {path: unused}" }, 0},
		{"null-encoded", false, func(*testing.B) (sinks.Sink, string) { return &nullSink{encode: true}, "file: {path: unused}" }, 0},
		{"file", false, func(b *testing.B) (sinks.Sink, string) {
			return nil, "file: {path: " + filepath.Join(b.TempDir(), "out.jsonl") + ", maxSizeMB: 100000}"
		}, 0},
		{"nats", false, func(b *testing.B) (sinks.Sink, string) {
			return nil, "nats: {url: " + testenv.StartNATS(b).ClientURL() + "}"
		}, 0},
		{"webhook-batch", false, func(b *testing.B) (sinks.Sink, string) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNoContent)
			}))
			b.Cleanup(srv.Close)
			return nil, "webhook: {url: " + srv.URL + ", batch: {maxEvents: 100}}"
		}, 0},
		{"null-x3", false, func(*testing.B) (sinks.Sink, string) { return &nullSink{}, "file: {path: unused}" }, 3},
		{"null-encoded-x3", false, func(*testing.B) (sinks.Sink, string) { return &nullSink{encode: true}, "file: {path: unused}" }, 3},
	} {
		b.Run(bc.name, func(b *testing.B) {
			fanOut := max(bc.fanOut, 1)
			var blocks, names []string
			made := make([]sinks.Sink, fanOut)
			for i := range fanOut {
				var block string
				made[i], block = bc.sink(b)
				name := fmt.Sprintf("out%d", i)
				blocks = append(blocks, "  - name: "+name+"\n    "+block+"\n")
				names = append(names, name)
			}
			cfg, _, err := config.Parse("bench.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: bench
sinks:
`+strings.Join(blocks, "")+`rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [bench]
    labelSelector: app=bench
    sinks: [`+strings.Join(names, ", ")+`]
`), components.SinkRegistry())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			r, err := filters.Compile(cfg, 0, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			var acked atomic.Int64
			views := map[string]*view.Handed{}
			var deliveries []*delivery.Delivery
			var sinkList []sinks.Sink
			runCtx, cancel := context.WithCancel(ctx)
			var running sync.WaitGroup
			for i, sc := range cfg.Sinks {
				sink := made[i]
				if sink == nil {
					f := map[string]sinks.Factory{"file": file.Factory, "nats": natssink.Factory, "webhook": webhook.Factory}[sc.Type]
					if sink, err = f.Create(ctx, sinks.SettingsFor(sc, nil)); err != nil {
						b.Fatal(err)
					}
				}
				d := delivery.New(delivery.Options{Config: sc, Sink: sink,
					Hooks: delivery.Hooks{OnAck: func(evs []*event.Event) { acked.Add(int64(len(evs))) }}})
				running.Add(1)
				go func() { defer running.Done(); d.Run(runCtx) }()
				views[names[i]] = view.NewHanded(names[i], d.Offer)
				views[names[i]].Start()
				deliveries = append(deliveries, d)
				sinkList = append(sinkList, sink)
			}

			// The receiver: the bridge's notify, checking that the
			// notification carries the state the handler was notified of and
			// (for a sample: it is a cache read the bridge does not make)
			// that its Cache holds it.
			var want *unstructured.Unstructured
			var notified, sent int
			notify := func(n Notification) {
				if n.Object != want || n.Gone != nil || n.Resync {
					b.Fatalf("%s: object %s, gone %s, resync %v; want object %s", n.Key, ref(n.Object), ref(n.Gone), n.Resync, ref(want))
				}
				if notified%benchCheckEvery == 0 {
					if u, ok := current(n); !ok || u != want {
						b.Fatalf("%s: Cache holds %s, %v; want %s, the notified state", n.Key, ref(u), ok, ref(want))
					}
				}
				notified++
				t := stage.Trigger{Object: n.Object, Meta: n.Meta, Gone: n.Gone, Now: time.Now()}
				if n.Resync {
					t.Replay = event.ReplayResync
				}
				for _, tg := range n.Targets {
					desired := stage.Evaluate(tg.Rule, n.Key, n.Cache, t)
					s := 0
					for _, name := range tg.Sinks {
						if v := views[name]; v != nil {
							s += v.Sync(&desired)
						}
					}
					tg.Rule.Count(s > 0)
					sent += s
				}
			}
			in, err := New(nil, []Watch{{Spec: Spec{GVR: r.GVR, Namespace: "bench", LabelSelector: "app=bench"}, Rules: []*filters.Rule{r}}},
				notify, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			run := in.running[0]
			store := run.inf().GetIndexer()
			h := handler(in, store, []Target{{Rule: r, Sinks: names}}, false)

			events := int64(fanOut)
			revs := newBenchRevisions(b, store, !bc.cacheWrite, func(n int) {
				for acked.Load() < int64(n)*events {
					time.Sleep(10 * time.Microsecond)
				}
			})
			pending := func() int {
				n := 0
				for _, d := range deliveries {
					n = max(n, d.Pending())
				}
				return n
			}
			b.ReportAllocs()
			b.ResetTimer()
			revs.startClock()
			for i := 0; i < b.N; i++ {
				var old *unstructured.Unstructured
				old, want = revs.next(i)
				if bc.cacheWrite {
					if err := store.Update(want); err != nil {
						b.Fatal(err)
					}
				}
				h.OnUpdate(old, want)
				if i%256 == 0 { // let the sinks keep up: coalescing would skip their work
					for pending() > 4096 {
						time.Sleep(10 * time.Microsecond)
					}
				}
			}
			if notified != b.N || sent != b.N*fanOut { // (else the wait below would not end)
				b.Fatalf("%d notifications, %d events to send; want %d and %d", notified, sent, b.N, b.N*fanOut)
			}
			for acked.Load() < int64(b.N)*events {
				for _, d := range deliveries {
					if c := d.Stats().Queue.Coalesced; c > 0 {
						b.Fatalf("%d events coalesced", c)
					}
				}
				time.Sleep(10 * time.Microsecond)
			}
			b.StopTimer()
			revs.stopClock()
			if received, matched := r.Counts(); received != uint64(b.N) || matched != uint64(b.N) {
				b.Fatalf("rule counts %d received, %d matched; want %d", received, matched, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "notifications/s")
			revs.reportCPU()
			cancel()
			running.Wait()
			for _, sink := range sinkList {
				_ = sink.Close(ctx)
			}
		})
	}
}

// benchCheckEvery is how often the pipeline's receiver checks the cache.
const benchCheckEvery = 997

// BenchmarkHandler is BenchmarkPipeline's floor: the same objects,
// revisions and cache writes, through the handler to a receiver that does
// nothing (no view, no event, no queue, no sink).
func BenchmarkHandler(b *testing.B) {
	for _, cacheWrite := range []bool{false, true} {
		name := "alone"
		if cacheWrite {
			name = "+cache"
		}
		b.Run(name, func(b *testing.B) {
			r := compileRules(b, "  - {name: cms, resource: v1/configmaps, namespaces: [bench], labelSelector: app=bench, sinks: [live]}\n")[0]
			notified := 0
			in, err := New(nil, []Watch{{Spec: Spec{GVR: r.GVR, Namespace: "bench", LabelSelector: "app=bench"}, Rules: []*filters.Rule{r}}},
				func(Notification) { notified++ }, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			store := in.running[0].inf().GetIndexer()
			h := handler(in, store, []Target{{Rule: r, Sinks: []string{"live"}}}, false)
			revs := newBenchRevisions(b, store, !cacheWrite, nil)
			b.ReportAllocs()
			b.ResetTimer()
			revs.startClock()
			for i := 0; i < b.N; i++ {
				old, cur := revs.next(i)
				if cacheWrite {
					if err := store.Update(cur); err != nil {
						b.Fatal(err)
					}
				}
				h.OnUpdate(old, cur)
			}
			b.StopTimer()
			revs.stopClock()
			if notified != b.N {
				b.Fatalf("%d notifications; want %d", notified, b.N)
			}
			revs.reportCPU()
		})
	}
}

// benchRevisions are the benchmarks' 1,000 objects, in the cache: each
// pass updates every object once, to a newer resourceVersion (the view
// skips a state older than what the sink was handed), its revisions built
// while the timer and the CPU clock are stopped. So that the garbage
// collector's work in the timed part is the pipeline's, not the
// benchmark's, the revisions are reused: a pass rewrites the objects of
// the pass benchRing passes back, once the sink has taken all of their
// events (nothing else keeps a state that old: the cache and the view
// hold newer ones).
type benchRevisions struct {
	b     *testing.B
	store cache.Store
	// write: the pass's states are written to the store with the timer
	// stopped (else the caller times the writes).
	write bool
	taken func(n int) // waits until the sink has taken n events (nil: no sink)
	// payloads are each object's two data maps, which its revisions
	// alternate: every object owns its 1 KiB, as a decoded one does (and
	// as in the benchmark before the views, whose figures this one is
	// compared with).
	payloads [2][]map[string]any
	ring     [benchRing][]*unstructured.Unstructured
	// cpu is the process's CPU time while the timer runs (the handler's
	// goroutine, the sink's worker, the GC): unlike ns/op, it does not grow
	// while other work on the machine holds the CPU.
	cpu, cpuStart time.Duration
	cpuOK         bool
}

const (
	benchObjects = 1000
	benchRing    = 8
)

func newBenchRevisions(b *testing.B, store cache.Store, write bool, taken func(int)) *benchRevisions {
	r := &benchRevisions{b: b, store: store, write: write, taken: taken}
	for p := range r.payloads {
		r.payloads[p] = make([]map[string]any, benchObjects)
		for i := range r.payloads[p] {
			r.payloads[p][i] = map[string]any{"payload": strings.Repeat(string(rune('a'+p)), 1000)}
		}
	}
	r.ring[0] = make([]*unstructured.Unstructured, benchObjects)
	for i := range r.ring[0] {
		r.ring[0][i] = benchObject(i, r.payloads[0][i])
		if err := store.Add(r.ring[0][i]); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// next returns op i's object: its state in the cache and its next one.
func (r *benchRevisions) next(i int) (old, cur *unstructured.Unstructured) {
	o, pass := i%benchObjects, i/benchObjects+1
	if o == 0 {
		r.b.StopTimer()
		r.stopClock()
		prev, next := r.ring[(pass-1)%benchRing], r.ring[pass%benchRing]
		if next == nil {
			next = make([]*unstructured.Unstructured, benchObjects)
			r.ring[pass%benchRing] = next
		} else if r.taken != nil {
			r.taken((pass - benchRing + 1) * benchObjects) // every event of next's last pass
		}
		for j, u := range prev {
			next[j] = revise(next[j], u, pass*benchObjects+j+1, r.payloads[pass%2][j])
			if r.write {
				if err := r.store.Update(next[j]); err != nil {
					r.b.Fatal(err)
				}
			}
		}
		r.startClock()
		r.b.StartTimer()
	}
	return r.ring[(pass-1)%benchRing][o], r.ring[pass%benchRing][o]
}

func (r *benchRevisions) startClock() { r.cpuStart, r.cpuOK = processCPU() }

func (r *benchRevisions) stopClock() {
	now, _ := processCPU()
	r.cpu += now - r.cpuStart
}

// reportCPU reports cpu-ns/op where the process's CPU time can be read.
func (r *benchRevisions) reportCPU() {
	if r.cpuOK {
		r.b.ReportMetric(float64(r.cpu.Nanoseconds())/float64(r.b.N), "cpu-ns/op")
	}
}

func benchObject(i int, data map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": data}}
	u.SetNamespace("bench")
	u.SetName(fmt.Sprintf("cm-%04d", i))
	u.SetUID(types.UID(fmt.Sprintf("uid-%04d", i)))
	u.SetResourceVersion(fmt.Sprint(i + 1))
	u.SetLabels(map[string]string{"app": "bench", "shard": fmt.Sprint(i % 16)})
	return u
}

// revise returns the next revision of u: resourceVersion rv, with data
// (maps that do not change are shared). It rewrites reuse, an old
// revision nothing refers to any more, when there is one.
func revise(reuse, u *unstructured.Unstructured, rv int, data map[string]any) *unstructured.Unstructured {
	if reuse == nil {
		md := maps.Clone(u.Object["metadata"].(map[string]any))
		reuse = &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.Object["apiVersion"], "kind": u.Object["kind"], "metadata": md}}
	}
	reuse.Object["metadata"].(map[string]any)["resourceVersion"] = strconv.Itoa(rv)
	reuse.Object["data"] = data
	return reuse
}

// ref names an object's state in failure messages.
func ref(u *unstructured.Unstructured) string {
	if u == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s/%s@%s", u.GetNamespace(), u.GetName(), u.GetResourceVersion())
}

// received is a notification with the state its Cache held while the
// receiver ran (the cache moves on afterwards).
type received struct {
	Notification
	cur *unstructured.Unstructured
	ok  bool
}

// recorder is a Notify that records what it receives.
type recorder struct{ got []received }

func (rec *recorder) notify(n Notification) {
	cur, ok := current(n)
	rec.got = append(rec.got, received{Notification: n, cur: cur, ok: ok})
}

// take returns and forgets what was received, sorted by key.
func (rec *recorder) take() []received {
	got := rec.got
	rec.got = nil
	sort.Slice(got, func(i, j int) bool { return got[i].Key < got[j].Key })
	return got
}

func compileRules(t testing.TB, rules string) []*filters.Rule {
	t.Helper()
	cfg, _, err := config.Parse("t.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
sinks:
  - {name: live, file: {path: x}}
  - {name: replayed, file: {path: y}}
rules:
`+rules), components.SinkRegistry())
	if err != nil {
		t.Fatal(err)
	}
	nsLabels := func(string) (labels.Set, bool) { return nil, false } // the handler never evaluates rules
	var out []*filters.Rule
	for i := range cfg.Rules {
		r, err := filters.Compile(cfg, i, nsLabels, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func object(ns, name, rv string, lbls map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion(rv)
	u.SetLabels(lbls)
	return u
}

// The handler hands each notification's key to Notify with the targets of
// its registration: Object carries the state of an add or update, Cache
// is the informer's cache, Gone carries the last state of a deletion, and resyncs
// reach only the registrations that replay.
func TestHandlerNotifies(t *testing.T) {
	r := compileRules(t, "  - {name: cms, resource: v1/configmaps, sinks: [live, replayed]}\n")[0]
	rec := &recorder{}
	in, err := New(nil, []Watch{{Spec: Spec{GVR: r.GVR}, Rules: []*filters.Rule{r}}}, rec.notify,
		map[string]time.Duration{"replayed": time.Minute}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(in.running) != 1 || len(in.running[0].cur.Load().regs) != 2 {
		t.Fatalf("want one informer with two registrations (shared, and the replaying sink's): %d informers", len(in.running))
	}
	run := in.running[0]
	store := run.inf().GetIndexer()
	live := []Target{{Rule: r, Sinks: []string{"live"}}}
	replayed := []Target{{Rule: r, Sinks: []string{"replayed"}}}
	h, hr := handler(in, store, live, false), handler(in, store, replayed, true)

	type want struct {
		key     string
		targets []Target
		object  *unstructured.Unstructured // the state an add or update carries
		cur     *unstructured.Unstructured // nil: the cache has nothing
		gone    *unstructured.Unstructured
		resync  bool
	}
	check := func(step string, wants ...want) {
		t.Helper()
		got := rec.take()
		if len(got) != len(wants) {
			t.Errorf("%s: %d notifications, want %d", step, len(got), len(wants))
			return
		}
		for i, w := range wants {
			g := got[i]
			if g.Key != w.key || !reflect.DeepEqual(g.Targets, w.targets) || g.Object != w.object || g.cur != w.cur || g.ok != (w.cur != nil) ||
				g.Gone != w.gone || g.Resync != w.resync {
				t.Errorf("%s: got key %q targets %v object %s current %s/%v gone %s resync %v; want key %q targets %v object %s current %s gone %s resync %v",
					step, g.Key, g.Targets, ref(g.Object), ref(g.cur), g.ok, ref(g.Gone), g.Resync,
					w.key, w.targets, ref(w.object), ref(w.cur), ref(w.gone), w.resync)
			}
		}
	}

	x1, x2 := object("a", "x", "1", nil), object("a", "x", "2", nil)
	y := object("a", "y", "1", nil)
	n := object("", "n", "1", nil)
	for _, o := range []*unstructured.Unstructured{x1, y, n} {
		if err := store.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	h.OnAdd(x1, false)
	check("add", want{key: "a/x", targets: live, object: x1, cur: x1})
	h.OnAdd(n, false)
	check("add of a cluster-scoped object", want{key: "n", targets: live, object: n, cur: n})
	h.OnAdd("junk", false)
	check("add of something else")

	h.OnAdd(y, true)
	check("add of the initial list", want{key: "a/y", targets: live, object: y, cur: y})
	in.SkipInitialList = true
	h.OnAdd(y, true)
	check("add of the initial list, skipped")
	h.OnAdd(y, false)
	check("add after the initial list", want{key: "a/y", targets: live, object: y, cur: y})
	in.SkipInitialList = false

	if err := store.Update(x2); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(x1, x2)
	check("update", want{key: "a/x", targets: live, object: x2, cur: x2})
	hr.OnUpdate(x1, x2)
	check("update, replaying registration", want{key: "a/x", targets: replayed, object: x2, cur: x2})
	h.OnUpdate(x2, x2)
	check("resync")
	hr.OnUpdate(x2, x2)
	check("resync, replaying registration", want{key: "a/x", targets: replayed, object: x2, cur: x2, resync: true})
	h.OnUpdate("junk", x2)
	check("update of something else")

	if err := store.Delete(x2); err != nil {
		t.Fatal(err)
	}
	h.OnDelete(x2)
	check("delete", want{key: "a/x", targets: live, gone: x2})
	if err := store.Delete(y); err != nil {
		t.Fatal(err)
	}
	hr.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/y", Obj: y})
	check("tombstone", want{key: "a/y", targets: replayed, gone: y})
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/z", Obj: "junk"})
	check("tombstone without a usable state: the key is synced from the cache", want{key: "a/z", targets: live})
}

// A namespace that appears, or whose labels change a rule's selection,
// notifies every object key in it to the rules that select namespaces.
func TestNamespaceHandlerNotifies(t *testing.T) {
	rules := compileRules(t, `  - {name: sel, resource: v1/configmaps, namespaceSelector: env=prod, sinks: [live, replayed]}
  - {name: all, resource: v1/configmaps, sinks: [live]}
`)
	sel := rules[0] // rules[1] (all) has no namespaceSelector: never notified
	rec := &recorder{}
	in, err := New(nil, []Watch{{Spec: Spec{GVR: sel.GVR}, Rules: rules}}, rec.notify, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if in.ns == nil || !reflect.DeepEqual(in.nsRules, []*filters.Rule{sel}) {
		t.Fatalf("namespace informer %v, rules %v: want one, for the rule with a namespaceSelector", in.ns, in.nsRules)
	}
	store := in.running[0].inf().GetIndexer()
	x, y, z := object("a", "x", "1", nil), object("a", "y", "1", nil), object("b", "z", "1", nil)
	for _, o := range []*unstructured.Unstructured{x, y, z} {
		if err := store.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	ns := func(name string, lbls map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
		u.SetName(name)
		u.SetLabels(lbls)
		return u
	}
	check := func(step string, want ...*unstructured.Unstructured) {
		t.Helper()
		got := rec.take()
		if len(got) != len(want) {
			t.Errorf("%s: %d notifications, want %d", step, len(got), len(want))
			return
		}
		for i, w := range want {
			g := got[i]
			key := w.GetNamespace() + "/" + w.GetName()
			if g.Key != key || !reflect.DeepEqual(g.Targets, []Target{{Rule: sel, Sinks: sel.Sinks}}) || g.Object != nil || g.cur != w || !g.ok || g.Gone != nil || g.Resync {
				t.Errorf("%s: got key %q targets %v object %s current %s/%v gone %s resync %v; want %s for rule sel, read from the cache",
					step, g.Key, g.Targets, ref(g.Object), ref(g.cur), g.ok, ref(g.Gone), g.Resync, key)
			}
		}
	}
	h := in.namespaceHandler()
	dev, prod := ns("a", map[string]string{"env": "dev"}), ns("a", map[string]string{"env": "prod"})
	h.OnUpdate(dev, prod)
	check("namespace starts matching", x, y)
	h.OnUpdate(prod, ns("a", map[string]string{"env": "prod", "team": "pay"}))
	check("label change that keeps the selection")
	h.OnUpdate(prod, dev)
	check("namespace stops matching", x, y)
	h.OnUpdate(dev, ns("a", nil))
	check("label change that keeps it out")
	h.OnAdd(ns("b", nil), false)
	check("namespace appears", z)
	h.OnAdd(ns("empty", nil), false)
	check("empty namespace appears")

	if _, ok := in.NamespaceLabels("a"); ok {
		t.Error("NamespaceLabels of a namespace not in the cache: ok")
	}
	if err := in.ns.GetStore().Add(prod); err != nil {
		t.Fatal(err)
	}
	if set, ok := in.NamespaceLabels("a"); !ok || set.Get("env") != "prod" {
		t.Errorf("NamespaceLabels(a) = %v, %v", set, ok)
	}
}

// Cache finds a key in the cache of the informer that holds it for the
// rule: per-namespace informers by the key's namespace.
func TestCache(t *testing.T) {
	rules := compileRules(t, `  - {name: two, resource: v1/configmaps, namespaces: [a, b], sinks: [live]}
  - {name: other, resource: v1/secrets, sinks: [live]}
`)
	two, other := rules[0], rules[1]
	in, err := New(nil, []Watch{
		{Spec: Spec{GVR: two.GVR, Namespace: "a"}, Rules: []*filters.Rule{two}},
		{Spec: Spec{GVR: two.GVR, Namespace: "b"}, Rules: []*filters.Rule{two}},
		{Spec: Spec{GVR: other.GVR}, Rules: []*filters.Rule{other}},
	}, func(Notification) {}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	bx := object("b", "x", "1", nil)
	if err := in.running[1].inf().GetIndexer().Add(bx); err != nil {
		t.Fatal(err)
	}
	if cur := in.Cache(two, "b/x"); cur == nil {
		t.Error("Cache(two, b/x) = nil")
	} else if u, ok := current(Notification{Key: "b/x", Cache: cur}); !ok || u != bx {
		t.Errorf("Cache(two, b/x) holds %s, %v", ref(u), ok)
	}
	if cur := in.Cache(two, "a/x"); cur == nil {
		t.Error("Cache(two, a/x) = nil")
	} else if u, ok := current(Notification{Key: "a/x", Cache: cur}); ok {
		t.Errorf("Cache(two, a/x) holds %s; want nothing", ref(u))
	}
	if in.Cache(two, "c/x") != nil {
		t.Error("Cache(two, c/x): no informer of the rule covers namespace c")
	}
	if cur := in.Cache(other, "b/x"); cur == nil {
		t.Error("Cache(other, b/x) = nil: its informer covers every namespace")
	} else if _, ok := current(Notification{Key: "b/x", Cache: cur}); ok {
		t.Error("Cache(other, b/x) holds the other resource's object")
	}
}

// current reads a notification's key from its cache.
func current(n Notification) (*unstructured.Unstructured, bool) {
	item, ok, err := n.Cache.GetByKey(n.Key)
	if err != nil || !ok {
		return nil, false
	}
	u, ok := item.(*unstructured.Unstructured)
	return u, ok
}

// ownerCaches is OwnerCaches with a fixed tree below each uid.
type ownerCaches struct{ below map[string][]string }

func (ownerCaches) Informers() []cache.SharedIndexInformer           { return nil }
func (ownerCaches) Synced() bool                                     { return true }
func (ownerCaches) Cached() map[string]int                           { return nil }
func (ownerCaches) Close()                                           {}
func (ownerCaches) OnChange(func(before, after metav1.Object)) error { return nil }
func (o ownerCaches) Below(uid string) []string                      { return o.below[uid] }

// An owner whose labels change what a rule reading owners (where, route)
// decides, or that appears or goes, notifies the keys of the objects
// below it (owned through a chain, or an Event's involved object) to those
// rules only.
func TestOwnerChangeNotifies(t *testing.T) {
	rules := compileRules(t, `  - {name: routed, resource: v1/configmaps, include: [owners], sinks: [live, replayed], route: {sink: "owners[size(owners)-1].labels.team", default: live}}
  - {name: where, resource: v1/configmaps, include: [owners], ownerLabels: [team], sinks: [live], where: "owners.exists(o, o.labels.?team.orValue('') == 'pay')"}
  - {name: shows, resource: v1/configmaps, include: [owners], sinks: [live]}
`)
	routed, where := rules[0], rules[1] // rules[2] shows owners, decides nothing by them: never notified
	rec := &recorder{}
	in, err := New(nil, []Watch{{Spec: Spec{GVR: routed.GVR}, Rules: rules}}, rec.notify, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	in.Owners = ownerCaches{below: map[string][]string{"deploy": {"rs1", "rs2"}}}
	if !reflect.DeepEqual(in.ownerRules, []*filters.Rule{routed, where}) {
		t.Fatalf("owner rules %v: want routed and where", in.ownerRules)
	}
	store := in.running[0].inf().GetIndexer()
	owned := func(name, owner string) *unstructured.Unstructured {
		u := object("a", name, "1", nil)
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: owner, UID: types.UID(owner)}})
		return u
	}
	x, y, z, ev := owned("x", "rs1"), owned("y", "rs2"), owned("z", "other"), object("a", "ev", "1", nil)
	ev.Object["involvedObject"] = map[string]any{"kind": "ReplicaSet", "name": "rs1", "uid": "rs1"}
	for _, o := range []*unstructured.Unstructured{x, y, z, ev} {
		if err := store.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	deploy := func(lbls map[string]string) metav1.Object {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "a", UID: "deploy", Labels: lbls}}
	}
	check := func(step string, want []*filters.Rule, objs ...*unstructured.Unstructured) {
		t.Helper()
		got := rec.take()
		var gotKeys, wantKeys []string
		for _, g := range got {
			if g.Object != nil || !g.ok || g.Gone != nil || len(g.Targets) != 1 || g.Targets[0].Sinks == nil {
				t.Errorf("%s: %s not a key to read from the cache for one rule and its sinks: %+v", step, g.Key, g.Notification)
			}
			gotKeys = append(gotKeys, g.Targets[0].Rule.Name+" "+g.Key)
		}
		for _, r := range want {
			for _, o := range objs {
				wantKeys = append(wantKeys, r.Name+" a/"+o.GetName())
			}
		}
		sort.Strings(gotKeys)
		sort.Strings(wantKeys)
		if !reflect.DeepEqual(gotKeys, wantKeys) {
			t.Errorf("%s: notified %q, want %q", step, gotKeys, wantKeys)
		}
	}
	pay, search := map[string]string{"team": "pay"}, map[string]string{"team": "search"}
	in.ownerChanged(deploy(pay), deploy(search))
	check("team relabelled", []*filters.Rule{routed, where}, ev, x, y)
	in.ownerChanged(deploy(search), deploy(map[string]string{"team": "search", "app": "web"}))
	check("a label only the route reads", []*filters.Rule{routed}, ev, x, y)
	in.ownerChanged(nil, deploy(pay))
	check("owner appears", []*filters.Rule{routed, where}, ev, x, y)
	in.ownerChanged(deploy(pay), nil)
	check("owner deleted", []*filters.Rule{routed, where}, ev, x, y)
	rs := func(owner types.UID) metav1.Object {
		m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "rs1", Namespace: "a", UID: "rs1"}}
		if owner != "" {
			m.OwnerReferences = []metav1.OwnerReference{{Kind: "Deployment", Name: "web", UID: owner}}
		}
		return m
	}
	in.ownerChanged(rs(""), rs("deploy"))
	check("ReplicaSet adopted", []*filters.Rule{routed, where}, ev, x)
}

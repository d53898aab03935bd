package view

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/stage"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

func compile(t testing.TB, ruleYAML string, nsLabels filters.NamespaceLabels) *filters.Rule {
	t.Helper()
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}]\nrules:\n  - name: r\n    sinks: [s]\n    resource: v1/configmaps\n" + ruleYAML
	return testenv.CompileRules(t, doc, components.SinkRegistry(), nsLabels)[0]
}

func cm(uid, rv string, lbls map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
	u.SetNamespace("a")
	u.SetName("x")
	u.SetUID(types.UID(uid))
	u.SetResourceVersion(rv)
	u.SetLabels(lbls)
	return u
}

// world is the informer cache of one key and a sink recording what it is offered.
type world struct {
	t    *testing.T
	obj  *unstructured.Unstructured
	sink *Handed
	got  []*event.Event
	now  time.Time
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, now: time.Unix(1700000000, 0)}
	w.sink = NewHanded("s", func(ev *event.Event) { w.got = append(w.got, ev) })
	w.sink.Start()
	return w
}

// syncKey evaluates key under r for trigger t, as the rules stage does, and
// syncs s with it.
func syncKey(s *Handed, r *filters.Rule, key string, c stage.Lookup, t stage.Trigger) int {
	d := stage.Evaluate(r, key, c, t)
	return s.Sync(&d)
}

// lookup is a one-key cache.
type lookup func() *unstructured.Unstructured

func (l lookup) GetByKey(string) (any, bool, error) {
	if o := l(); o != nil {
		return o, true, nil
	}
	return nil, false, nil
}

func (w *world) current() *unstructured.Unstructured { return w.obj }

// set changes the cache and syncs; it returns what was offered, as
// "change[:reason][:quiet] uid rv".
func (w *world) set(r *filters.Rule, obj *unstructured.Unstructured, tr stage.Trigger) []string {
	w.obj = obj
	w.now = w.now.Add(time.Second)
	tr.Now = w.now
	w.got = nil
	syncKey(w.sink, r, "a/x", lookup(w.current), tr)
	return describe(w.got)
}

func describe(evs []*event.Event) []string {
	var out []string
	for _, e := range evs {
		s := string(e.Change)
		if e.Reason != "" {
			s += ":" + e.Reason
		}
		if e.Quiet {
			s += ":quiet"
		}
		out = append(out, s+" "+e.UID()+" "+e.Object().GetResourceVersion())
	}
	return out
}

func eq(t *testing.T, step string, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %q, want %q", step, got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: got %q, want %q", step, got, want)
			return
		}
	}
}

func TestTransitions(t *testing.T) {
	r := compile(t, "    labelSelector: tier=front\n", nil)
	w := newWorld(t)
	front := map[string]string{"tier": "front"}
	back := map[string]string{"tier": "back"}
	eq(t, "add outside", w.set(r, cm("u1", "1", back), stage.Trigger{}))
	eq(t, "enter", w.set(r, cm("u1", "2", front), stage.Trigger{}), "added u1 2")
	eq(t, "update inside", w.set(r, cm("u1", "3", front), stage.Trigger{}), "updated u1 3")
	if old := w.got[0].OldObject(); old == nil || old.GetResourceVersion() != "2" {
		t.Errorf("update's old object = %v, want the state handed (rv 2)", old)
	}
	eq(t, "same state again (a resync)", w.set(r, cm("u1", "3", front), stage.Trigger{}))
	eq(t, "leave", w.set(r, cm("u1", "4", back), stage.Trigger{}), "deleted:unmatched u1 4")
	eq(t, "update outside", w.set(r, cm("u1", "5", back), stage.Trigger{}))
	eq(t, "enter again, unchanged object", w.set(r, cm("u1", "5", front), stage.Trigger{}), "added u1 5")
	eq(t, "replaced under the same name (relist)", w.set(r, cm("u2", "9", front), stage.Trigger{}), "deleted u1 5", "added u2 9")
	gone := cm("u2", "10", front)
	eq(t, "deleted (state from the delete notification)", w.set(r, nil, stage.Trigger{Gone: gone}), "deleted u2 10")
	eq(t, "delete of something not handed", w.set(r, nil, stage.Trigger{}))
	if n := w.sink.Len("r"); n != 0 {
		t.Errorf("view holds %d objects after the delete", n)
	}
}

// A live notification's Meta, which the handler reads once, gives the
// events exactly what reading the object gives them.
func TestTriggerMetaGivesTheSameEvents(t *testing.T) {
	r := compile(t, "    labelSelector: tier=front\n", nil)
	front, back := map[string]string{"tier": "front"}, map[string]string{"tier": "back"}
	with, without := newWorld(t), newWorld(t)
	fields := func(e *event.Event) []string {
		return []string{e.ID, e.Type(), e.Subject, e.Kind(), e.Namespace(), e.Name(), e.UID(), e.Key(), e.QueueKey(), string(e.Change), e.Reason, strconv.FormatBool(e.Quiet)}
	}
	for i, s := range []*unstructured.Unstructured{cm("u1", "1", front), cm("u1", "2", front), cm("u1", "3", back), cm("u1", "4", front), cm("u2", "9", front)} {
		with.set(r, s, stage.Trigger{Object: s, Meta: event.MetaOf(s)})
		without.set(r, s, stage.Trigger{Object: s})
		if len(with.got) != len(without.got) || len(with.got) == 0 && i != 2 {
			t.Fatalf("state %d: %d events with the trigger's Meta, %d without", i, len(with.got), len(without.got))
		}
		for j := range with.got {
			if a, b := fields(with.got[j]), fields(without.got[j]); !slices.Equal(a, b) {
				t.Errorf("state %d, event %d: with the trigger's Meta %q, without %q", i, j, a, b)
			}
		}
	}
}

func TestIDsPerTransition(t *testing.T) {
	r := compile(t, "    labelSelector: tier=front\n", nil)
	w := newWorld(t)
	front, back := map[string]string{"tier": "front"}, map[string]string{"tier": "back"}
	var ids []string
	// The object is unchanged (same rv) while it leaves and re-enters: a
	// namespace relabelled twice, or a reload flipping the rule.
	for i, lbls := range []map[string]string{front, back, front, back} {
		w.set(r, cm("u1", "7", lbls), stage.Trigger{})
		if len(w.got) != 1 {
			t.Fatalf("step %d: %v", i, describe(w.got))
		}
		ids = append(ids, w.got[0].ID)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("id %s used twice in %v", id, ids)
		}
		seen[id] = true
	}
}

func TestEventsFilterDeliveryNotRecording(t *testing.T) {
	r := compile(t, "    events: [deleted]\n", nil)
	w := newWorld(t)
	eq(t, "added is recorded, not sent", w.set(r, cm("u1", "1", nil), stage.Trigger{}), "added:quiet u1 1")
	eq(t, "updated likewise", w.set(r, cm("u1", "2", nil), stage.Trigger{}), "updated:quiet u1 2")
	eq(t, "deleted is sent", w.set(r, nil, stage.Trigger{}), "deleted u1 2")

	r = compile(t, "    changed: [data]\n", nil)
	w = newWorld(t)
	w.set(r, cm("u1", "1", nil), stage.Trigger{})
	eq(t, "an update outside changed paths is quiet", w.set(r, cm("u1", "2", map[string]string{"l": "1"}), stage.Trigger{}), "updated:quiet u1 2")
	o := cm("u1", "3", map[string]string{"l": "1"})
	o.Object["data"] = map[string]any{"k": "v"}
	eq(t, "inside them it is sent", w.set(r, o, stage.Trigger{}), "updated u1 3")
}

func TestResyncReplay(t *testing.T) {
	r := compile(t, "", nil)
	w := newWorld(t)
	w.set(r, cm("u1", "1", nil), stage.Trigger{})
	eq(t, "replay of an unchanged object", w.set(r, cm("u1", "1", nil), stage.Trigger{Replay: event.ReplayResync}), "updated u1 1")
	if w.got[0].Replay != event.ReplayResync {
		t.Errorf("kbreplay = %q", w.got[0].Replay)
	}
	eq(t, "replay finds a change: sent once", w.set(r, cm("u1", "2", nil), stage.Trigger{Replay: event.ReplayResync}), "updated u1 2")

	// A rule that sends adds but no updates re-asserts its objects as added
	// (an alert kept alive by re-sends), with the id of the added at that
	// state; its updates stay quiet.
	r = compile(t, "    events: [added, deleted]\n", nil)
	w = newWorld(t)
	w.set(r, cm("u1", "1", nil), stage.Trigger{})
	first := w.got[0]
	eq(t, "a rule without updated replays as added", w.set(r, cm("u1", "1", nil), stage.Trigger{Replay: event.ReplayResync}), "added u1 1")
	if e := w.got[0]; e.ID != first.ID || e.Entered != first.Entered || e.Replay != event.ReplayResync || e.Fresh {
		t.Errorf("replayed added: id %s (first %s), entered %d (first %d), kbreplay %q, fresh %v", e.ID, first.ID, e.Entered, first.Entered, e.Replay, e.Fresh)
	}
	eq(t, "its updates stay quiet", w.set(r, cm("u1", "2", nil), stage.Trigger{}), "updated:quiet u1 2")
	eq(t, "replayed at the new state", w.set(r, cm("u1", "2", nil), stage.Trigger{Replay: event.ReplayResync}), "added u1 2")

	r = compile(t, "    events: [deleted]\n", nil)
	w = newWorld(t)
	w.set(r, cm("u1", "1", nil), stage.Trigger{})
	eq(t, "a rule that sends only deletions replays nothing", w.set(r, cm("u1", "1", nil), stage.Trigger{Replay: event.ReplayResync}))
}

func TestFromCheckpoint(t *testing.T) {
	r := compile(t, "    labelSelector: '!out'\n", nil)
	entry := func(uid, rv string, entered int64) checkpoint.Entry {
		return checkpoint.Entry{UID: uid, ResourceVersion: rv, Namespace: "a", Name: "x", Entered: entered, Labels: map[string]string{"l": "v"}}
	}
	for _, tc := range []struct {
		name    string
		stored  checkpoint.Slot
		now     *unstructured.Unstructured
		want    []string
		entered int64 // of what is sent of the object still in the view
	}{
		{"unchanged", checkpoint.Slot{Acked: ptr(entry("u1", "5", 1))}, cm("u1", "5", nil), nil, 0},
		{"changed while down", checkpoint.Slot{Acked: ptr(entry("u1", "5", 1))}, cm("u1", "6", nil), []string{"updated u1 6"}, 1},
		{"deleted while down", checkpoint.Slot{Acked: ptr(entry("u1", "5", 1))}, nil, []string{"deleted u1 5"}, 0},
		{"re-created while down", checkpoint.Slot{Acked: ptr(entry("u1", "5", 1))}, cm("u2", "8", nil), []string{"deleted u1 5", "added u2 8"}, 0},
		{"sent, not acknowledged, still there", checkpoint.Slot{Pending: []checkpoint.Entry{entry("u2", "", 42)}}, cm("u2", "8", nil), []string{"added u2 8"}, 42},
		{"sent, not acknowledged, gone", checkpoint.Slot{Pending: []checkpoint.Entry{entry("u2", "", 42)}}, nil, []string{"deleted u2 "}, 0},
		{"sent, not acknowledged, out of the view", checkpoint.Slot{Pending: []checkpoint.Entry{entry("u2", "", 42)}}, cm("u2", "8", map[string]string{"out": "yes"}), []string{"deleted:unmatched u2 8"}, 0},
		{"acknowledged and a replacement in flight, both gone", checkpoint.Slot{Acked: ptr(entry("u1", "5", 1)), Pending: []checkpoint.Entry{entry("u2", "", 42)}}, cm("u3", "9", nil),
			[]string{"deleted u2 ", "deleted u1 5", "added u3 9"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.sink.Load("r", map[string]*checkpoint.Slot{"a/x": &tc.stored})
			got := w.set(r, tc.now, stage.Trigger{Replay: event.ReplayCheckpoint})
			eq(t, tc.name, got, tc.want...)
			for _, e := range w.got {
				if e.Replay != event.ReplayCheckpoint {
					t.Errorf("%s: kbreplay %q", e.ID, e.Replay)
				}
				if e.Change == event.Deleted && e.Reason == "" && e.Object().GetLabels()["l"] != "v" {
					t.Errorf("deleted %s lost the last known labels", e.UID())
				}
				if o := dataObject(t, e); o["apiVersion"] != "v1" || o["kind"] != "ConfigMap" {
					t.Errorf("%s %s: data.object %v has no apiVersion v1 and kind ConfigMap", e.Change, e.ID, o)
				}
				if e.Change == event.Updated && e.OldObject() != nil {
					t.Error("an update found in a checkpoint has no old state to show")
				}
			}
			// What a checkpoint holds may lag what the consumer got, so what
			// puts an object (back) into its view never reuses an id of the
			// incarnation the checkpoint knew: a deduplicating consumer that
			// got a deletion since would drop it. The object keeps the time
			// it entered the view (a request's for counts from it).
			for _, e := range w.got {
				if e.Change == event.Deleted {
					continue
				}
				if e.Stamp == 1 || e.Stamp == 42 {
					t.Errorf("%s %s reuses the stored incarnation's stamp (%d)", e.Change, e.ID, e.Stamp)
				}
				if want := tc.entered; e.Entered != want && want != 0 {
					t.Errorf("%s %s entered at %d, want %d (when it entered, before the restart)", e.Change, e.ID, e.Entered, want)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// dataObject is the object an event's data carries.
func dataObject(t *testing.T, e *event.Event) map[string]any {
	t.Helper()
	d, err := e.Data()
	if err != nil {
		t.Fatal(err)
	}
	var data struct{ Object map[string]any }
	if err := json.Unmarshal(d, &data); err != nil {
		t.Fatal(err)
	}
	return data.Object
}

// A deletion found at a restart is built from the metadata the checkpoint
// kept; of a custom resource, whose kind Kubernetes does not know, it
// still carries its kind once any object of the resource was seen (the
// initial list streams in before anything is taken for gone).
func TestCheckpointDeletionsOfCustomResourcesCarryTheirKind(t *testing.T) {
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}]\nrules:\n  - name: r\n    sinks: [s]\n    resource: example.io/v1/widgets\n"
	r := testenv.CompileRules(t, doc, components.SinkRegistry(), nil)[0]
	widget := func(name, uid, rv string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.io/v1", "kind": "Widget"}}
		u.SetNamespace("a")
		u.SetName(name)
		u.SetUID(types.UID(uid))
		u.SetResourceVersion(rv)
		return u
	}
	var got []*event.Event
	s := NewHanded("s", func(ev *event.Event) { got = append(got, ev) })
	s.Load("r", map[string]*checkpoint.Slot{
		"a/kept": {Acked: &checkpoint.Entry{UID: "u1", ResourceVersion: "5", Namespace: "a", Name: "kept"}},
		"a/gone": {Acked: &checkpoint.Entry{UID: "u2", ResourceVersion: "6", Namespace: "a", Name: "gone"}},
	})
	s.Start()
	kept := widget("kept", "u1", "5")
	cache := lookupMap{"a/kept": kept}
	now := time.Unix(1700000000, 0)
	syncKey(s, r, "a/kept", cache, stage.Trigger{Object: kept, Initial: true, Now: now}) // unchanged: nothing sent
	syncKey(s, r, "a/gone", cache, stage.Trigger{Replay: event.ReplayCheckpoint, Now: now})
	if len(got) != 1 || got[0].Change != event.Deleted || got[0].UID() != "u2" {
		t.Fatalf("got %v, want the deletion of u2", describe(got))
	}
	if o := dataObject(t, got[0]); o["apiVersion"] != "example.io/v1" || o["kind"] != "Widget" {
		t.Errorf("data.object %v, want apiVersion example.io/v1 and kind Widget", o)
	}
}

// lookupMap is a cache of several keys.
type lookupMap map[string]*unstructured.Unstructured

func (l lookupMap) GetByKey(key string) (any, bool, error) {
	if o, ok := l[key]; ok {
		return o, true, nil
	}
	return nil, false, nil
}

func TestNamespaceSelector(t *testing.T) {
	var nsLabels atomic.Pointer[labels.Set]
	nsLabels.Store(&labels.Set{})
	r := compile(t, "    namespaceSelector: env=prod\n", func(string) (labels.Set, bool) { return *nsLabels.Load(), true })
	w := newWorld(t)
	eq(t, "namespace not selected", w.set(r, cm("u1", "1", nil), stage.Trigger{}))
	nsLabels.Store(&labels.Set{"env": "prod"})
	eq(t, "namespace selected", w.set(r, cm("u1", "1", nil), stage.Trigger{}), "added u1 1")
	nsLabels.Store(&labels.Set{})
	eq(t, "namespace no longer selected", w.set(r, cm("u1", "1", nil), stage.Trigger{}), "deleted:unmatched u1 1")
}

func TestNotReady(t *testing.T) {
	r := compile(t, "", nil)
	w := newWorld(t)
	w.sink.Stop()
	eq(t, "stopped", w.set(r, cm("u1", "1", nil), stage.Trigger{}))
	w.sink.Start()
	eq(t, "started: the same state is synced", w.set(r, cm("u1", "1", nil), stage.Trigger{}), "added u1 1")
}

// TestConcurrentTriggers syncs one key from several goroutines while its
// state advances (an informer, a namespace change, a replay): every sink
// must see the states in order and end at the last one.
func TestConcurrentTriggers(t *testing.T) {
	r := compile(t, "", nil)
	var state atomic.Pointer[unstructured.Unstructured]
	var mu sync.Mutex
	var got []*event.Event
	s := NewHanded("s", func(ev *event.Event) { mu.Lock(); got = append(got, ev); mu.Unlock() })
	s.Start()
	current := lookup(state.Load)
	const last = 2000
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= last; i++ {
				if g == 0 {
					state.Store(cm("u1", strconv.Itoa(i), nil))
				}
				syncKey(s, r, "a/x", current, stage.Trigger{Now: time.Unix(0, int64(i))})
			}
		}()
	}
	wg.Wait()
	syncKey(s, r, "a/x", current, stage.Trigger{Now: time.Now()})
	prev := 0
	for i, e := range got {
		rv, _ := strconv.Atoi(e.Object().GetResourceVersion())
		if rv <= prev {
			t.Fatalf("event %d hands rv %d after rv %d", i, rv, prev)
		}
		prev = rv
		if (i == 0) != (e.Change == event.Added) {
			t.Fatalf("event %d is %s", i, e.Change)
		}
	}
	if prev != last {
		t.Fatalf("last state handed: rv %d, want %d", prev, last)
	}
}

// Live notifications carry their own state: while the cache has moved on
// (created, updated and deleted before the handler ran), a sink that keeps
// up still receives every change; a notification older than what another
// trigger already handed is skipped.
func TestNotificationsCarryTheirState(t *testing.T) {
	r := compile(t, "", nil)
	w := newWorld(t)
	w.obj = nil // the cache: already deleted
	tr := func(tr stage.Trigger) []string {
		w.got = nil
		w.now = w.now.Add(time.Second)
		tr.Now = w.now
		syncKey(w.sink, r, "a/x", lookup(w.current), tr)
		return describe(w.got)
	}
	eq(t, "add notification", tr(stage.Trigger{Object: cm("u1", "11", nil)}), "added u1 11")
	eq(t, "update notification", tr(stage.Trigger{Object: cm("u1", "12", nil)}), "updated u1 12")
	eq(t, "delete notification", tr(stage.Trigger{Gone: cm("u1", "13", nil)}), "deleted u1 13")
	eq(t, "delete of an incarnation not held", tr(stage.Trigger{Gone: cm("u0", "9", nil)}))

	w.obj = cm("u2", "20", nil)
	eq(t, "a reconcile reads the cache", tr(stage.Trigger{Replay: event.ReplayCheckpoint}), "added u2 20")
	eq(t, "an older notification after it", tr(stage.Trigger{Object: cm("u2", "15", nil)}))
	eq(t, "an older notification of a previous uid", tr(stage.Trigger{Object: cm("u1", "14", nil)}))
	eq(t, "the notification of the state handed", tr(stage.Trigger{Object: cm("u2", "20", nil)}))
	eq(t, "a newer one", tr(stage.Trigger{Object: cm("u2", "21", nil)}), "updated u2 21")
}

// A deletion found on restart carries only the metadata the checkpoint
// kept: an event-filter where that reads the body cannot judge it, and it
// is sent rather than lost.
func TestCheckpointDeletionPassesEventFilter(t *testing.T) {
	r := compile(t, "    where: \"type == 'deleted' && object.data.keep == 'yes'\"\n", nil)
	w := newWorld(t)
	w.sink.Load("r", map[string]*checkpoint.Slot{"a/x": {Acked: &checkpoint.Entry{UID: "u1", ResourceVersion: "5", Namespace: "a", Name: "x"}}})
	eq(t, "deleted while down", w.set(r, nil, stage.Trigger{Replay: event.ReplayCheckpoint}), "deleted u1 5")

	w = newWorld(t)
	o := cm("u1", "1", nil)
	o.Object["data"] = map[string]any{"keep": "no"}
	eq(t, "live: the filter applies", w.set(r, o, stage.Trigger{}), "added:quiet u1 1")
	eq(t, "live deletion outside the filter", w.set(r, nil, stage.Trigger{Gone: o}), "deleted:quiet u1 1")
}

// A checkpoint that says the deletion of the incarnation it holds (or its
// re-entry) may have been sent: the sink may not hold it, so an object in
// the view is sent again as added, under a stamp never used before. It
// keeps the time it entered the view unless its last move was leaving it.
func TestMayBeGoneFromCheckpoint(t *testing.T) {
	r := compile(t, "    labelSelector: '!out'\n", nil)
	acked := &checkpoint.Entry{UID: "u1", ResourceVersion: "5", Namespace: "a", Name: "x", Entered: 1}
	for _, tc := range []struct {
		name    string
		pending []checkpoint.Entry
		now     *unstructured.Unstructured
		want    string
		stamp   int64 // of the event, when the id must be a given incarnation's (0: a new one)
		entered int64 // of the event (0: now, it entered anew)
	}{
		{"left, came back unchanged", []checkpoint.Entry{{UID: "u1", Entered: 1, Leaving: true}}, cm("u1", "5", nil), "added u1 5", 0, 0},
		{"sent again after a restart, then left and came back", []checkpoint.Entry{{UID: "u1", Entered: 1, Stamp: 3}, {UID: "u1", Entered: 1, Stamp: 3, Leaving: true}}, cm("u1", "5", nil), "added u1 5", 0, 0},
		{"left and re-entered, in the view", []checkpoint.Entry{{UID: "u1", Entered: 2}}, cm("u1", "5", nil), "added u1 5", 0, 2},
		{"sent again after a restart, in the view", []checkpoint.Entry{{UID: "u1", Entered: 1, Stamp: 3}}, cm("u1", "6", nil), "added u1 6", 0, 1},
		{"left and re-entered, out again", []checkpoint.Entry{{UID: "u1", Entered: 2}}, cm("u1", "6", map[string]string{"out": "y"}), "deleted:unmatched u1 6", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.sink.Load("r", map[string]*checkpoint.Slot{"a/x": {Acked: acked, Pending: tc.pending}})
			eq(t, tc.name, w.set(r, tc.now, stage.Trigger{Replay: event.ReplayCheckpoint}), tc.want)
			e := w.got[0]
			switch {
			case tc.stamp != 0 && e.Stamp != tc.stamp:
				t.Errorf("%s is of incarnation %d, want %d (the deletion of the one before may have been sent: its id would be dropped)", e.ID, e.Stamp, tc.stamp)
			case tc.stamp == 0 && e.Stamp != w.now.UnixNano():
				t.Errorf("%s reuses a stored incarnation's stamp (%d)", e.ID, e.Stamp)
			}
			if want := cmp.Or(tc.entered, w.now.UnixNano()); e.Entered != want {
				t.Errorf("%s entered at %d, want %d", e.ID, e.Entered, want)
			}
			eq(t, "then nothing more", w.set(r, tc.now, stage.Trigger{}))
		})
	}
}

// The time an object entered the view is the object's: loading the view
// from a checkpoint (a restart, a reload, a handover) and every change,
// replay and re-send after it keep it, while ids made after the load
// never repeat one made before it.
func TestEntryTimeSurvivesTheCheckpoint(t *testing.T) {
	r := compile(t, "", nil)
	w := newWorld(t)
	w.set(r, cm("u1", "1", nil), stage.Trigger{})
	entered := w.got[0].Entered
	var before []string
	for i, rv := range []string{"2", "2"} {
		tr := stage.Trigger{}
		if i == 1 {
			tr.Replay = event.ReplayResync
		}
		w.set(r, cm("u1", rv, nil), tr)
		before = append(before, w.got[0].ID)
	}
	// What the checkpoint holds after the first update was acknowledged.
	rec := checkpoint.Entry{UID: "u1", ResourceVersion: "2", Namespace: "a", Name: "x", Entered: entered}
	for _, step := range []struct {
		name string
		rv   string
		tr   stage.Trigger
	}{
		{"the first replay after the load", "2", stage.Trigger{Replay: event.ReplayResync}},
		{"an update after the load", "3", stage.Trigger{}},
		{"a replay after it", "3", stage.Trigger{Replay: event.ReplayResync}},
	} {
		if step.rv == "2" {
			clock := w.now
			w = newWorld(t)
			w.now = clock // a restart moves on in time
			w.sink.Load("r", map[string]*checkpoint.Slot{"a/x": {Acked: &rec}})
		}
		w.set(r, cm("u1", step.rv, nil), step.tr)
		if len(w.got) != 1 {
			t.Fatalf("%s: %v", step.name, describe(w.got))
		}
		e := w.got[0]
		if e.Entered != entered {
			t.Errorf("%s: entered %d, want %d (before the load)", step.name, e.Entered, entered)
		}
		if slices.Contains(before, e.ID) {
			t.Errorf("%s: id %s was sent before the load", step.name, e.ID)
		}
	}
}

// A reconcile that reads the cache hands a deletion (the object left the
// view); a lagging notification of an older state must not bring it back.
func TestFloorAfterUnmatchedDeletion(t *testing.T) {
	r := compile(t, "    labelSelector: '!out'\n", nil)
	w := newWorld(t)
	eq(t, "in", w.set(r, cm("u1", "5", nil), stage.Trigger{Object: cm("u1", "5", nil)}), "added u1 5")
	eq(t, "reconcile: out at rv 7", w.set(r, cm("u1", "7", map[string]string{"out": "y"}), stage.Trigger{Replay: event.ReplayCheckpoint}), "deleted:unmatched u1 7")
	eq(t, "lagging notification of rv 6", w.set(r, w.obj, stage.Trigger{Object: cm("u1", "6", nil)}))
	eq(t, "rv 8 back in", w.set(r, w.obj, stage.Trigger{Object: cm("u1", "8", nil)}), "added u1 8")
	eq(t, "deleted", w.set(r, nil, stage.Trigger{Gone: cm("u1", "9", nil)}), "deleted u1 9")
	if n := len(w.sink.Keys("r")); n != 0 {
		t.Errorf("%d keys left after the deletion", n)
	}
}

// Only an added of an object the sink was never handed anything of is
// fresh: a queue may drop it with its deletion, unattempted. Any other
// added (a re-entry, a replacement, one from a checkpoint's intent, a
// quiet one) must keep its deletion.
func TestFreshAdds(t *testing.T) {
	fresh := func(w *world) []bool {
		var out []bool
		for _, e := range w.got {
			out = append(out, e.Fresh)
		}
		return out
	}
	r := compile(t, "    labelSelector: '!out'\n", nil)
	w := newWorld(t)
	w.set(r, cm("u1", "1", nil), stage.Trigger{})
	if got := fresh(w); len(got) != 1 || !got[0] {
		t.Errorf("first added of u1: fresh = %v, want [true]", got)
	}
	w.set(r, cm("u1", "2", map[string]string{"out": "y"}), stage.Trigger{})
	w.set(r, cm("u1", "3", nil), stage.Trigger{})
	if got := fresh(w); len(got) != 1 || got[0] {
		t.Errorf("re-entry of u1 after an unmatched deletion: fresh = %v, want [false]", got)
	}
	w.set(r, cm("u2", "4", nil), stage.Trigger{})
	if got := fresh(w); len(got) != 2 || got[0] || got[1] {
		t.Errorf("u2 replacing u1 under the same key: fresh = %v, want [false false]", got)
	}

	w = newWorld(t)
	w.sink.Load("r", map[string]*checkpoint.Slot{"a/x": {Pending: []checkpoint.Entry{{UID: "u1", Namespace: "a", Name: "x", Entered: 1}}}})
	w.set(r, cm("u1", "5", nil), stage.Trigger{Replay: event.ReplayCheckpoint})
	if got := fresh(w); len(got) != 1 || got[0] {
		t.Errorf("added of an object with an intent in the checkpoint: fresh = %v, want [false]", got)
	}

	deletionsOnly := compile(t, "    events: [deleted]\n", nil)
	w = newWorld(t)
	w.set(deletionsOnly, cm("u1", "1", nil), stage.Trigger{})
	if got := fresh(w); len(got) != 1 || !got[0] || !w.got[0].Quiet {
		// Fresh though quiet: created and deleted while it waited, it was in
		// neither the acknowledged view nor the desired one (memory stays
		// bounded by live objects for every events setting).
		t.Errorf("quiet added of a deletions-only rule: fresh = %v, want [true]", got)
	}
}

// An add of an informer's first list streams what it can: it adds and
// updates, but takes nothing away (other caches may not have synced: a
// namespace selector could judge an object out of the view only for
// lack of its namespace); the reconciliation after the sync does that.
func TestInitialListAddsNeverRemove(t *testing.T) {
	r := compile(t, "    labelSelector: '!out'\n", nil)
	acked := func(uid, rv string) map[string]*checkpoint.Slot {
		return map[string]*checkpoint.Slot{"a/x": {Acked: &checkpoint.Entry{UID: uid, ResourceVersion: rv, Namespace: "a", Name: "x", Entered: 1}}}
	}
	initial := func(o *unstructured.Unstructured) stage.Trigger {
		return stage.Trigger{Object: o, Initial: true, Replay: event.ReplayCheckpoint}
	}
	out := map[string]string{"out": "y"}

	w := newWorld(t)
	w.sink.Load("r", acked("u1", "5"))
	eq(t, "warm restart, unchanged", w.set(r, cm("u1", "5", nil), initial(cm("u1", "5", nil))))
	eq(t, "then the reconciliation", w.set(r, cm("u1", "5", nil), stage.Trigger{Replay: event.ReplayCheckpoint}))

	w = newWorld(t)
	w.sink.Load("r", acked("u1", "5"))
	eq(t, "changed while away", w.set(r, cm("u1", "6", nil), initial(cm("u1", "6", nil))), "updated u1 6")

	w = newWorld(t)
	w.sink.Load("r", acked("u1", "5"))
	eq(t, "replaced while away", w.set(r, cm("u2", "7", nil), initial(cm("u2", "7", nil))), "deleted u1 5", "added u2 7")

	w = newWorld(t)
	w.sink.Load("r", acked("u1", "5"))
	eq(t, "out of the view in the first list", w.set(r, cm("u1", "6", out), initial(cm("u1", "6", out))))
	eq(t, "the reconciliation after the sync", w.set(r, cm("u1", "6", out), stage.Trigger{Replay: event.ReplayCheckpoint}), "deleted:unmatched u1 6")

	w = newWorld(t)
	eq(t, "cold start", w.set(r, cm("u1", "1", nil), initial(cm("u1", "1", nil))), "added u1 1")
	eq(t, "then the reconciliation", w.set(r, cm("u1", "1", nil), stage.Trigger{Replay: event.ReplayCheckpoint}))
}

// What a destination is found to hold after the start is merged into what
// the sink is known to hold: known incarnations stay as they are (newer
// than the destination's read), another incarnation under the key is
// deleted, and a key the sink was not known to hold is diffed as held.
func TestMergeWhatTheDestinationHolds(t *testing.T) {
	r := compile(t, "", nil)
	found := func(uid, rv string) map[string]*checkpoint.Slot {
		return map[string]*checkpoint.Slot{"a/x": {Acked: &checkpoint.Entry{UID: uid, ResourceVersion: rv, Namespace: "a", Name: "x"}}}
	}
	w := newWorld(t)
	eq(t, "enters", w.set(r, cm("u1", "5", nil), stage.Trigger{}), "added u1 5")
	w.sink.Merge("r", found("u1", "3")) // read before the last send landed
	eq(t, "the known incarnation stays", w.set(r, cm("u1", "5", nil), stage.Trigger{Replay: event.ReplayCheckpoint}))
	w.sink.Merge("r", found("u0", "2")) // an older object of the name, left behind
	eq(t, "another incarnation is deleted", w.set(r, cm("u1", "5", nil), stage.Trigger{Replay: event.ReplayCheckpoint}), "deleted u0 2")

	w = newWorld(t)
	w.sink.Merge("r", found("u9", "1")) // held, never known: the object is gone
	eq(t, "an unknown key is diffed", w.set(r, nil, stage.Trigger{Replay: event.ReplayCheckpoint}), "deleted u9 1")
}

// A notification's evaluation stays on the notifier's stack: syncing a
// state a sink holds already (nothing to send) allocates nothing, whatever
// the number of sinks (the stage's Desired, with its judgements and
// events, is one per notification and rule, and does not escape).
func TestSyncAllocatesNothingWhenNothingChanged(t *testing.T) {
	r := compile(t, "    labelSelector: app=web\n", nil)
	obj := cm("u1", "1", map[string]string{"app": "web"})
	sinks := []*Handed{NewHanded("s", func(*event.Event) {}), NewHanded("t", func(*event.Event) {}), NewHanded("u", func(*event.Event) {})}
	trig := stage.Trigger{Object: obj, Meta: event.MetaOf(obj), Now: time.Unix(1700000000, 0)}
	for _, s := range sinks {
		s.Start()
		syncKey(s, r, "a/x", lookupMap{}, trig) // added
	}
	var cache stage.Lookup = lookupMap{}
	allocs := testing.AllocsPerRun(100, func() {
		d := stage.Evaluate(r, "a/x", cache, trig)
		for _, s := range sinks {
			s.Sync(&d)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per notification of an unchanged state to 3 sinks; want 0", allocs)
	}
}

// A routing rule's sinks each hold the objects routed to them: the
// namespace relabeled (the namespace handler's sync, reading the cache)
// takes the object out of one sink's view (deleted, unmatched) and into
// the other's (added); its later changes, and its deletion, go to that one
// alone.
func TestRoutedSinksHoldTheirObjects(t *testing.T) {
	team := "s"
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}, {name: t, file: {path: y}}]\n" +
		"rules:\n  - name: r\n    resource: v1/configmaps\n    sinks: [s, t]\n    route: {sink: namespaceLabels.team, default: s}\n"
	r := testenv.CompileRules(t, doc, components.SinkRegistry(), func(string) (labels.Set, bool) { return labels.Set{"team": team}, true })[0]
	got := map[string][]*event.Event{}
	sinks := map[string]*Handed{}
	for _, name := range []string{"s", "t"} {
		sinks[name] = NewHanded(name, func(ev *event.Event) { got[name] = append(got[name], ev) })
		sinks[name].Start()
	}
	var obj *unstructured.Unstructured
	step := func(what string, tr stage.Trigger, wantS, wantT []string) {
		t.Helper()
		clear(got)
		d := stage.Evaluate(r, "a/x", lookup(func() *unstructured.Unstructured { return obj }), tr)
		sinks["s"].Sync(&d)
		sinks["t"].Sync(&d)
		eq(t, what+", sink s", describe(got["s"]), wantS...)
		eq(t, what+", sink t", describe(got["t"]), wantT...)
	}
	obj = cm("u1", "1", nil)
	step("created in team s's namespace", stage.Trigger{Object: obj}, []string{"added u1 1"}, nil)
	team = "t"
	step("the namespace moved to team t", stage.Trigger{}, []string{"deleted:unmatched u1 1"}, []string{"added u1 1"})
	obj = cm("u1", "2", nil)
	step("updated", stage.Trigger{Object: obj}, nil, []string{"updated u1 2"})
	gone := obj
	obj = nil
	step("deleted", stage.Trigger{Gone: gone}, nil, []string{"deleted u1 2"})
	if sinks["s"].Len("r") != 0 || sinks["t"].Len("r") != 0 {
		t.Errorf("after the deletion the sinks hold %d and %d objects", sinks["s"].Len("r"), sinks["t"].Len("r"))
	}
}

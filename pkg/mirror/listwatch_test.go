package mirror

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// An unstructured informer over a bucket holds the view through puts,
// updates, deletions and an object re-created under its key, and its
// handlers see each as an apiserver informer's would.
func TestInformerFollowsTheBucket(t *testing.T) {
	b := newBucket(t)
	b.put("team-a", "one", "u1", "x")
	b.put("team-a", "two.dotted", "u2", "x")
	b.put("", "cluster-wide", "u3", "x")
	b.raw(CompactedKey, []byte("0")) // reserved: skipped
	inf := runInformer(t, NewListerWatcher(b.kv, Options{}), &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)

	b.put("team-a", "one", "u1", "y")
	b.del("team-a", "two.dotted")
	b.put("team-b", "three", "u4", "x")
	b.del("", "cluster-wide")
	b.put("", "cluster-wide", "u5", "again") // re-created: a new uid under the same key
	converges(t, b, inf, 10*time.Second)

	initial := []string{"add /cluster-wide u3", "add team-a/one u1", "add team-a/two.dotted u2"} // a list: any order
	then := []string{
		"update team-a/one u1", "delete team-a/two.dotted", "add team-b/three u4",
		"delete /cluster-wide", "add /cluster-wide u5",
	}
	eventually(t, 5*time.Second, "handler events", func() (bool, string) {
		got := inf.recorded()
		if len(got) < len(initial) {
			return false, fmt.Sprint(got)
		}
		first := slices.Sorted(slices.Values(got[:len(initial)]))
		return slices.Equal(first, initial) && slices.Equal(got[len(initial):], then), fmt.Sprint(got)
	})
	// Indexes follow deletions, though a deletion's object is only a name.
	if objs, err := inf.GetIndexer().ByIndex(cache.NamespaceIndex, "team-a"); err != nil || len(objs) != 1 {
		t.Errorf("namespace index team-a = %d objects, %v; want 1", len(objs), err)
	}
	// The object's own fields came through.
	o, ok, err := inf.GetStore().GetByKey("team-a/one")
	if err != nil || !ok {
		t.Fatalf("team-a/one: %v %v", ok, err)
	}
	if v, _, _ := unstructured.NestedString(o.(*unstructured.Unstructured).Object, "data", "k"); v != "y" {
		t.Errorf("team-a/one data.k = %q, want y", v)
	}
}

// resourceVersions are revisions: an object's is the revision of its
// value, the apiserver's is kept in an annotation; a list's is the
// bucket's last revision, and a watch from it sends exactly what follows.
func TestResourceVersionIsTheRevision(t *testing.T) {
	b := newBucket(t)
	r1 := b.put("ns", "a", "ua", "1")
	lw := NewListerWatcher(b.kv, Options{})
	ctx := ctxT(t)
	l, err := lw.ListWithContext(ctx, metav1.ListOptions{ResourceVersion: "0"})
	must(t, err)
	items, err := meta.ExtractList(l)
	must(t, err)
	lm, err := meta.ListAccessor(l)
	must(t, err)
	if len(items) != 1 || lm.GetResourceVersion() != strconv.FormatUint(r1, 10) {
		t.Fatalf("list = %d items at %q, want 1 at %d", len(items), lm.GetResourceVersion(), r1)
	}
	m, _ := meta.Accessor(items[0])
	if m.GetResourceVersion() != strconv.FormatUint(r1, 10) || m.GetAnnotations()[ResourceVersionAnnotation] != "1001" {
		t.Errorf("object rv %q annotation %q, want %d and 1001", m.GetResourceVersion(), m.GetAnnotations()[ResourceVersionAnnotation], r1)
	}
	// A reserved key moves the list's revision past the last object's.
	r2 := b.raw(CompactedKey, []byte("0"))
	l, err = lw.ListWithContext(ctx, metav1.ListOptions{})
	must(t, err)
	if lm, _ := meta.ListAccessor(l); lm.GetResourceVersion() != strconv.FormatUint(r2, 10) {
		t.Errorf("list rv %q, want %d", lm.GetResourceVersion(), r2)
	}

	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r1, 10)})
	must(t, err)
	defer w.Stop()
	r3 := b.put("ns", "b", "ub", "1")
	r4 := b.del("ns", "a")
	for _, want := range []string{fmt.Sprintf("MODIFIED ns/b %d", r3), fmt.Sprintf("DELETED ns/a %d", r4)} {
		if got := next(t, w); got != want {
			t.Fatalf("event %q, want %q", got, want)
		}
	}
	if k := lastDeleted.GetObjectKind().GroupVersionKind(); k.Kind != "ConfigMap" || k.Version != "v1" {
		t.Errorf("a deletion's object is a %v, want the bucket's objects' kind", k)
	}
}

// lastDeleted is the object of the last Deleted event next read.
var lastDeleted runtime.Object

// next is the next event of w, as "TYPE ns/name rv".
func next(t testing.TB, w watch.Interface) string {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			return "closed"
		}
		if ev.Type == watch.Error {
			return "ERROR " + apierrors.FromObject(ev.Object).Error()
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			t.Fatalf("event %v: %v", ev.Type, err)
		}
		if ev.Type == watch.Deleted {
			lastDeleted = ev.Object
		}
		s := fmt.Sprintf("%s %s/%s %s", ev.Type, m.GetNamespace(), m.GetName(), m.GetResourceVersion())
		if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
			s += " end"
		}
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
		return ""
	}
}

// A typed informer (ConfigMap) reads the same bucket; a value of another
// kind is skipped.
func TestTypedInformer(t *testing.T) {
	b := newBucket(t)
	b.put("ns", "a", "ua", "1")
	secret := configMap("ns", "s", "us", 7, "x")
	secret["kind"] = "Secret"
	b.raw(Key("ns", "s"), envelope(secret))
	lw := NewListerWatcher(b.kv, Options{Object: &corev1.ConfigMap{}})
	inf := runInformer(t, lw, &corev1.ConfigMap{})
	converges(t, b, inf, 10*time.Second)
	b.put("ns", "b", "ub", "2")
	b.put("ns", "a", "ua", "3")
	converges(t, b, inf, 10*time.Second)
	o, _, _ := inf.GetStore().GetByKey("ns/a")
	if cm := o.(*corev1.ConfigMap); cm.Data["k"] != "3" || cm.UID != "ua" {
		t.Errorf("ns/a = %+v", cm)
	}
	if s := lw.Skips(); s.Object == 0 {
		t.Errorf("skips = %+v, want the Secret counted", s)
	}
}

// counting wraps a ListerWatcher: it counts lists and can hold watches
// (none starts while held; the running one ends).
type counting struct {
	*ListerWatcher
	lists, watches atomic.Int64

	mu      sync.Mutex
	held    chan struct{} // closed when released; nil: not held
	current watch.Interface
	calls   []string // "list RV", "watch RV [error reason]", "watch-list RV"
}

func (c *counting) called() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func (c *counting) List(o metav1.ListOptions) (runtime.Object, error) {
	return c.ListWithContext(context.Background(), o)
}

func (c *counting) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	c.lists.Add(1)
	c.mu.Lock()
	c.calls = append(c.calls, "list "+o.ResourceVersion)
	c.mu.Unlock()
	return c.ListerWatcher.ListWithContext(ctx, o)
}

func (c *counting) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.watches.Add(1)
	w, err := c.ListerWatcher.WatchWithContext(ctx, o)
	c.mu.Lock()
	c.current = w
	call := "watch " + o.ResourceVersion
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		call = "watch-list " + o.ResourceVersion
	}
	if err != nil {
		call += " " + string(apierrors.ReasonForError(err))
	}
	c.calls = append(c.calls, call)
	c.mu.Unlock()
	return w, err
}

func (c *counting) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return c.WatchWithContext(context.Background(), o)
}

// hold ends the running watch and holds the next until release.
func (c *counting) hold() (release func()) {
	c.mu.Lock()
	c.held = make(chan struct{})
	held, w := c.held, c.current
	c.mu.Unlock()
	if w != nil {
		w.Stop()
	}
	return func() {
		c.mu.Lock()
		c.held = nil
		c.mu.Unlock()
		close(held)
	}
}

// With client-go's default feature gates the reflector uses watch-list:
// one watch, no list, the objects first, then a bookmark ending them.
func TestWatchList(t *testing.T) {
	b := newBucket(t)
	r1 := b.put("ns", "a", "ua", "1")
	r2 := b.put("ns", "b", "ub", "1")
	b.del("ns", "b")
	r3 := b.put("ns", "c", "uc", "1")
	lw := NewListerWatcher(b.kv, Options{})
	w, err := lw.WatchWithContext(ctxT(t), metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	must(t, err)
	defer w.Stop()
	_ = r2
	last := r3 + 1
	for _, want := range []string{
		fmt.Sprintf("ADDED ns/a %d", r1), fmt.Sprintf("ADDED ns/c %d", r3), fmt.Sprintf("BOOKMARK / %d end", r3),
	} {
		if got := next(t, w); got != want && !(strings.HasPrefix(want, "BOOKMARK") && got == fmt.Sprintf("BOOKMARK / %d end", last)) {
			t.Fatalf("event %q, want %q", got, want)
		}
	}
	r4 := b.put("ns", "a", "ua", "2")
	if got, want := next(t, w), fmt.Sprintf("MODIFIED ns/a %d", r4); got != want {
		t.Fatalf("event %q, want %q", got, want)
	}

	c := &counting{ListerWatcher: lw}
	inf := runInformer(t, c, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	if c.lists.Load() != 0 {
		t.Errorf("%d lists: the reflector fell back from watch-list", c.lists.Load())
	}
}

// An informer whose watch resumes from before a compaction is told 410
// Gone, lists again, and ends equal to the view: the deletion the
// compaction took is not missed. With client-go's default gates the
// relist is a watch-list.
func TestCompactionForcesRelist(t *testing.T) {
	t.Parallel()
	testCompactionForcesRelist(t, "watch-list ")
}

// The same with WatchListClient off: the reflector lists, then watches.
func TestCompactionForcesRelistListThenWatch(t *testing.T) {
	old := clientfeatures.FeatureGates()
	clientfeatures.ReplaceFeatureGates(gates{old, clientfeatures.WatchListClient, false})
	defer clientfeatures.ReplaceFeatureGates(old)
	testCompactionForcesRelist(t, "list ")
}

// gates is a feature gate set with one feature overridden.
type gates struct {
	clientfeatures.Gates
	f  clientfeatures.Feature
	on bool
}

func (g gates) Enabled(f clientfeatures.Feature) bool {
	if f == g.f {
		return g.on
	}
	return g.Gates.Enabled(f)
}

func testCompactionForcesRelist(t *testing.T, relist string) {
	b := newBucket(t)
	b.put("ns", "a", "ua", "1")
	b.put("ns", "b", "ub", "1")
	c := &counting{ListerWatcher: NewListerWatcher(b.kv, Options{})}
	inf := runInformer(t, c, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	if calls := c.called(); !strings.HasPrefix(calls[0], relist) {
		t.Fatalf("calls %v: the informer started with %q", calls, calls[0])
	}
	time.Sleep(1100 * time.Millisecond) // a watch that ends sooner, empty, is "very short": the reflector lists anyway
	n := len(c.called())

	release := c.hold() // the watch ends; the next waits for the compaction
	b.del("ns", "a")
	b.put("ns", "c", "uc", "1")
	b.compact()
	release()
	converges(t, b, inf, 15*time.Second)
	calls := c.called()[n:]
	t.Logf("calls after the compaction: %v", calls)
	if len(calls) < 2 || !strings.HasPrefix(calls[0], "watch ") || !strings.HasSuffix(calls[0], " Expired") || !strings.HasPrefix(calls[1], relist) {
		t.Errorf("calls after the compaction %v, want a watch refused (Expired), then %q", calls, relist)
	}
	// The handlers hear of it after the store holds it (client-go's
	// listeners are asynchronous).
	deadline := time.Now().Add(5 * time.Second)
	for !slices.ContainsFunc(inf.recorded(), func(s string) bool { return strings.HasPrefix(s, "delete ns/a") }) {
		if time.Now().After(deadline) {
			t.Errorf("events %v: no delete of ns/a", inf.recorded())
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A watch resumed below the compaction is refused with 410 Gone; at or
// above it, it runs; past the bucket's last revision it is "too large".
func TestWatchTooOldOrTooNew(t *testing.T) {
	b := newBucket(t)
	r1 := b.put("ns", "a", "ua", "1")
	r2 := b.del("ns", "a")
	b.put("ns", "b", "ub", "1")
	lw := NewListerWatcher(b.kv, Options{})
	ctx := ctxT(t)
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r1, 10)})
	must(t, err)
	w.Stop()
	upTo := b.compact()
	if upTo != r2 {
		t.Fatalf("compacted up to %d, want %d", upTo, r2)
	}
	_, err = lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r1, 10)})
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("watch from %d after compaction to %d: %v, want 410 expired", r1, r2, err)
	}
	w, err = lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r2, 10)})
	must(t, err)
	w.Stop()
	_, err = lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "999999"})
	if !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("watch from 999999: %v, want too large", err)
	}
	_, err = lw.ListWithContext(ctx, metav1.ListOptions{ResourceVersion: "999999"})
	if !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("list at 999999: %v, want too large", err)
	}
	_, err = lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "abc"})
	if !apierrors.IsBadRequest(err) {
		t.Fatalf("watch from abc: %v, want bad request", err)
	}
	_, err = lw.ListWithContext(ctx, metav1.ListOptions{LabelSelector: "a=b"})
	if !apierrors.IsBadRequest(err) {
		t.Fatalf("list with a selector: %v, want bad request", err)
	}
}

// A bucket recreated under its informer (its revisions start again) makes
// the informer list again: its revision is too large for the new bucket.
func TestRecreatedBucket(t *testing.T) {
	t.Parallel()
	b := newBucket(t)
	for i := range 5 {
		b.put("ns", fmt.Sprint("o", i), "u", "1")
	}
	c := &counting{ListerWatcher: NewListerWatcher(b.kv, Options{})}
	inf := runInformer(t, c, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	release := c.hold()
	ctx := ctxT(t)
	must(t, b.js.DeleteKeyValue(ctx, b.kv.Bucket()))
	_, err := b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.kv.Bucket(), History: 1})
	must(t, err)
	b.mu.Lock()
	b.view = map[string]string{}
	b.mu.Unlock()
	b.put("ns", "new", "un", "1")
	release()
	converges(t, b, inf, 15*time.Second)
}

// Bookmarks carry the revision a watch has read, reserved keys' included,
// every interval and when the timeout ends the watch.
func TestBookmarks(t *testing.T) {
	b := newBucket(t)
	r1 := b.put("ns", "a", "ua", "1")
	lw := NewListerWatcher(b.kv, Options{BookmarkInterval: 50 * time.Millisecond})
	ctx := ctxT(t)
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r1, 10), AllowWatchBookmarks: true})
	must(t, err)
	r2 := b.raw(CompactedKey, []byte("0"))
	if got, want := next(t, w), fmt.Sprintf("BOOKMARK / %d", r2); got != want {
		t.Fatalf("event %q, want %q", got, want)
	}
	w.Stop()
	w.Stop() // twice is fine
	consumersGone(t, b)

	// Typed bookmarks are of the informer's type; the timeout sends one.
	lw = NewListerWatcher(b.kv, Options{Object: &corev1.ConfigMap{}, BookmarkInterval: -1})
	w, err = lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r1, 10), AllowWatchBookmarks: true, TimeoutSeconds: ptr.To[int64](1)})
	must(t, err)
	var evs []watch.Event
	for ev := range w.ResultChan() {
		evs = append(evs, ev)
	}
	if len(evs) != 1 || evs[0].Type != watch.Bookmark {
		t.Fatalf("events %v, want one bookmark", evs)
	}
	if cm, ok := evs[0].Object.(*corev1.ConfigMap); !ok || cm.ResourceVersion != strconv.FormatUint(r2, 10) {
		t.Fatalf("bookmark %#v, want a ConfigMap at %d", evs[0].Object, r2)
	}
	w.Stop()
}

// Values and keys no consumer can read are skipped, counted, and never
// stall the informer; a value that does not read replaces the object as
// if deleted.
func TestHostileEntries(t *testing.T) {
	b := newBucket(t)
	b.put("ns", "a", "ua", "1")
	b.raw("not-a-key", envelope(configMap("ns", "x", "ux", 1, "1")))
	b.raw(Key("ns", "foreign"), []byte("hello, not json"))
	b.raw(Key("ns", "wrongkey"), envelope(configMap("ns", "other", "uo", 1, "1")))
	b.raw(Key("ns", "nodata"), []byte(`{"specversion":"1.0","data":"string"}`))
	b.raw(Key("ns", "huge"), envelope(configMap("ns", "huge", "uh", 1, strings.Repeat("x", 4096))))
	lw := NewListerWatcher(b.kv, Options{MaxValueBytes: 2048})
	inf := runInformer(t, lw, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	b.put("ns", "b", "ub", "1")
	b.raw(Key("ns", "b"), []byte(`{"data":{"object":[1,2]}}`)) // b now reads as nothing
	b.mu.Lock()
	delete(b.view, Key("ns", "b"))
	b.mu.Unlock()
	b.put("ns", "c", "uc", "1")
	converges(t, b, inf, 10*time.Second)
	s := lw.Skips()
	if s.Key != 1 || s.Value != 3 || s.Object != 1 || s.Size != 1 {
		t.Errorf("skips = %+v, want key 1 value 3 object 1 size 1", s)
	}
}

// A name too long for a key is keyed by its hash: the watch names its
// deletion from the value it read; one that never read it asks for a
// relist (410).
func TestHashedKey(t *testing.T) {
	b := newBucket(t)
	long := strings.Repeat("n", 1100)
	r1 := b.put("ns", long, "ul", "1")
	if k := Key("ns", long); !strings.HasPrefix(k, "ns."+HashedPrefix) {
		t.Fatalf("key %s is not hashed", k)
	}
	lw := NewListerWatcher(b.kv, Options{})
	fresh := NewListerWatcher(b.kv, Options{})
	inf := runInformer(t, lw, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	ctx := ctxT(t)
	w, err := fresh.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(r1, 10)})
	must(t, err)
	defer w.Stop()
	b.del("ns", long)
	converges(t, b, inf, 10*time.Second)
	if got := next(t, w); !strings.HasPrefix(got, "ERROR ") || !strings.Contains(got, "cannot name") {
		t.Fatalf("event %q, want a 410 error", got)
	}
}

// Two hundred informers on one bucket all end with the view.
func TestManyInformers(t *testing.T) {
	t.Parallel()
	b := newBucket(t)
	for i := range 20 {
		b.put("ns", fmt.Sprint("o", i), "u", "1")
	}
	lw := NewListerWatcher(b.kv, Options{})
	var infs []*informer
	for range 200 {
		infs = append(infs, startInformer(t, lw, &unstructured.Unstructured{}))
	}
	for _, inf := range infs {
		inf.waitSynced(t)
	}
	for i := range 20 {
		if i%3 == 0 {
			b.del("ns", fmt.Sprint("o", i))
		} else {
			b.put("ns", fmt.Sprint("o", i), "u", "2")
		}
	}
	b.put("ns", "last", "ul", "1")
	for _, inf := range infs {
		converges(t, b, inf, 30*time.Second)
	}
}

// A NATS restart under a running informer: its watch resumes, and it ends
// with the view, changes made while NATS was down or after included.
func TestNATSRestart(t *testing.T) {
	t.Parallel() // the parallel ones here have a NATS server of their own, and neither call next (lastDeleted) nor change client-go's feature gates
	b := newBucket(t)
	b.put("ns", "a", "ua", "1")
	_, _, kv := connect(t, b.srv.ClientURL(), b.kv.Bucket(), false)
	c := &counting{ListerWatcher: NewListerWatcher(kv, Options{})}
	inf := runInformer(t, c, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	start := time.Now()
	b.srv.Restart(t)
	// Connected is not enough: JetStream recovers its streams after the
	// restart, and a write before that times out (seen on a loaded CI).
	eventually(t, 20*time.Second, "the writer's bucket takes requests again", func() (bool, string) {
		if !b.nc.IsConnected() {
			return false, b.nc.Status().String()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := b.kv.Status(ctx)
		return err == nil, fmt.Sprint(err)
	})
	b.put("ns", "b", "ub", "1")
	b.del("ns", "a")
	converges(t, b, inf, 30*time.Second)
	b.put("ns", "c", "uc", "1")
	converges(t, b, inf, 30*time.Second)
	t.Logf("converged %v after the restart; calls %v", time.Since(start), c.called())
	want := []string{"add ns/a ua", "add ns/b ub", "delete ns/a", "add ns/c uc"}
	recordedEventually(t, inf, want)
}

// consumersGone checks that no consumer is left on the bucket's stream:
// Stop released every watch's.
func consumersGone(t testing.TB, b *bucket) {
	t.Helper()
	eventually(t, 5*time.Second, "the watches' consumers deleted", func() (bool, string) {
		st, err := b.js.Stream(ctxT(t), "KV_"+b.kv.Bucket())
		must(t, err)
		n := st.CachedInfo().State.Consumers
		return n == 0, fmt.Sprint(n, " consumers")
	})
}

// A watch that ends (a timeout, a reconnect) is resumed by the reflector
// from the last revision it got: it misses nothing and sends nothing
// twice, and nothing is listed again.
func TestWatchResumes(t *testing.T) {
	t.Parallel()
	b := newBucket(t)
	b.put("ns", "a", "ua", "1")
	c := &counting{ListerWatcher: NewListerWatcher(b.kv, Options{})}
	inf := runInformer(t, c, &unstructured.Unstructured{})
	converges(t, b, inf, 10*time.Second)
	time.Sleep(1100 * time.Millisecond) // not a "very short" watch
	rev := b.put("ns", "b", "ub", "1")
	converges(t, b, inf, 10*time.Second)
	release := c.hold()
	b.put("ns", "a", "ua", "2")
	b.del("ns", "b")
	b.put("ns", "c", "uc", "1")
	release()
	converges(t, b, inf, 10*time.Second)
	calls := c.called()
	if want := []string{"watch-list ", fmt.Sprint("watch ", rev)}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	want := []string{"add ns/a ua", "add ns/b ub", "update ns/a ua", "delete ns/b", "add ns/c uc"}
	recordedEventually(t, inf, want)
}

// An empty bucket lists at revision 0, which a watch takes as "from the
// start": both reflectors sync, and see what comes.
func TestEmptyBucket(t *testing.T) {
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprint("watch-list ", watchList), func(t *testing.T) {
			if !watchList {
				old := clientfeatures.FeatureGates()
				clientfeatures.ReplaceFeatureGates(gates{old, clientfeatures.WatchListClient, false})
				defer clientfeatures.ReplaceFeatureGates(old)
			}
			b := newBucket(t)
			inf := runInformer(t, NewListerWatcher(b.kv, Options{}), &unstructured.Unstructured{})
			b.put("ns", "a", "ua", "1")
			converges(t, b, inf, 10*time.Second)
			b.del("ns", "a")
			converges(t, b, inf, 10*time.Second)
			recordedEventually(t, inf, []string{"add ns/a ua", "delete ns/a"})
		})
	}
}

// recordedEventually waits for the informer's handlers to have heard
// exactly want: they hear of a change after the store holds it (client-go's
// listeners are asynchronous).
func recordedEventually(t *testing.T, inf *informer, want []string) {
	t.Helper()
	eventually(t, 5*time.Second, "handler events", func() (bool, string) {
		got := inf.recorded()
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// A compaction revision the bridge would never write (past its own
// revision, or no number: a foreign writer, a bucket restored) does not
// refuse every list for ever: it counts as everything before its write.
func TestBogusCompactionRevision(t *testing.T) {
	for _, v := range []string{"1000000", "not a number"} {
		b := newBucket(t)
		b.put("ns", "a", "ua", "1")
		_, err := b.kv.Put(context.Background(), CompactedKey, []byte(v))
		must(t, err)
		b.put("ns", "b", "ub", "1")
		inf := runInformer(t, NewListerWatcher(b.kv, Options{}), &unstructured.Unstructured{})
		converges(t, b, inf, 10*time.Second)
	}
}

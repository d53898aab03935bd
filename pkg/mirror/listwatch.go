package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Defaults of Options.
const (
	DefaultBookmarkInterval = 30 * time.Second
	DefaultMaxValueBytes    = 8 << 20
)

// Options configure a ListerWatcher. The zero value reads unstructured
// objects with the defaults.
type Options struct {
	// Object is the type of the objects listed and watched: give the
	// informer the same as its expected type. nil means
	// *unstructured.Unstructured with no apiVersion/kind, which takes
	// every value. An *unstructured.Unstructured with apiVersion and kind
	// set takes only values of that apiVersion and kind (the reflector
	// drops the others anyway); a typed object (&corev1.ConfigMap{}) takes
	// values whose kind is its Go type's name, or that name no kind.
	Object runtime.Object
	// Decode turns a value's data.object (JSON) into an object of
	// Object's type. nil means JSON decoding into a new Object (for
	// unstructured, the object must name its kind). A decoded object of
	// another type than Object's is skipped.
	Decode func(object []byte) (runtime.Object, error)
	// BookmarkInterval is how often a watch that allows bookmarks sends
	// one when its revision moved (it also sends one when its timeout
	// ends it). Zero means DefaultBookmarkInterval; negative, none but the
	// watch-list's end bookmark.
	BookmarkInterval time.Duration
	// MaxValueBytes skips values larger than this (decoding a huge value
	// costs several times its size). Zero means DefaultMaxValueBytes;
	// negative, no limit.
	MaxValueBytes int
	// Logger receives skipped entries (at most one line per reason a
	// minute) and watches that end on an error. nil means slog.Default().
	Logger *slog.Logger
}

// Skips counts the entries a ListerWatcher passed over, by reason: once
// each time one is read (every list, every watch that reads it).
type Skips struct {
	// Key: a key that is neither an object's nor reserved.
	Key int64
	// Value: a value that is not a CloudEvent with a data.object, or
	// whose object does not decode.
	Value int64
	// Object: an object of another kind than Options.Object's, or whose
	// namespace and name are not its key's.
	Object int64
	// Size: a value larger than Options.MaxValueBytes.
	Size int64
}

const (
	skipKey = iota
	skipValue
	skipObject
	skipSize
	nSkips
)

var skipNames = [nSkips]string{"key", "value", "object", "size"}

// ListerWatcher lists and watches the objects of a mirror bucket
// (client-go's cache.ListerWatcher and cache.ListerWatcherWithContext).
// Create it with NewListerWatcher; it is safe for concurrent use, and
// informers may share one.
type ListerWatcher struct {
	kv    jetstream.KeyValue
	opts  Options
	typed reflect.Type            // the typed object's pointer type; nil for unstructured
	gvk   schema.GroupVersionKind // an unstructured Object's
	kind  string                  // a typed Object's Go type name
	log   *slog.Logger

	skips   [nSkips]atomic.Int64
	lastLog [nSkips]atomic.Int64

	mu     sync.Mutex
	hashed map[string][2]string // hashed key -> namespace, name, as last read

	seen atomic.Pointer[schema.GroupVersionKind] // the kind last decoded, for deletions (a rule has one resource)
}

var (
	_ cache.ListerWatcher            = (*ListerWatcher)(nil)
	_ cache.ListerWatcherWithContext = (*ListerWatcher)(nil)
)

// NewListerWatcher returns a ListerWatcher over kv, a mirror bucket (one
// rule's view, as a nats sink with mirror set keeps it).
func NewListerWatcher(kv jetstream.KeyValue, opts Options) *ListerWatcher {
	lw := &ListerWatcher{kv: kv, opts: opts, log: opts.Logger, hashed: map[string][2]string{}}
	if lw.log == nil {
		lw.log = slog.Default()
	}
	lw.log = lw.log.With("bucket", kv.Bucket())
	switch o := opts.Object.(type) {
	case nil:
	case *unstructured.Unstructured:
		lw.gvk = o.GroupVersionKind()
	default:
		lw.typed = reflect.TypeOf(o)
		if lw.typed.Kind() == reflect.Pointer {
			lw.kind = lw.typed.Elem().Name()
		}
	}
	return lw
}

// Skips returns how many entries the ListerWatcher passed over so far.
func (lw *ListerWatcher) Skips() Skips {
	return Skips{Key: lw.skips[skipKey].Load(), Value: lw.skips[skipValue].Load(), Object: lw.skips[skipObject].Load(), Size: lw.skips[skipSize].Load()}
}

// List lists with context.Background (ListWithContext).
func (lw *ListerWatcher) List(options metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), options)
}

// Watch watches with context.Background (WatchWithContext).
func (lw *ListerWatcher) Watch(options metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), options)
}

// ListWithContext returns the bucket's objects as of one revision, the
// list's resourceVersion: an *unstructured.UnstructuredList, or a
// *metav1.List of typed objects. options.ResourceVersion, if set, is a
// revision the list must not be older than: one past the bucket's last is
// "too large" (a bucket recreated), as an apiserver answers. Selectors
// are refused (the rule selects); Limit is ignored (one page).
func (lw *ListerWatcher) ListWithContext(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
	if err := checkOptions(options); err != nil {
		return nil, err
	}
	min, err := parseRV(options.ResourceVersion)
	if err != nil {
		return nil, err
	}
	last, err := lw.lastRevision(ctx)
	if err != nil {
		return nil, lw.unavailable("listing", err)
	}
	if min > last {
		return nil, tooLarge(min, last)
	}
	kw, err := lw.kv.WatchAll(ctx)
	if err != nil {
		return nil, lw.unavailable("listing", err)
	}
	defer lw.stopWatcher(kw)
	snap, pos, err := lw.snapshot(ctx, kw)
	if err != nil {
		return nil, lw.unavailable("listing", err)
	}
	if err := lw.overtaken(ctx, last); err != nil {
		return nil, err
	}
	rv := strconv.FormatUint(max(pos, last), 10)
	objs := lw.objects(snap)
	if lw.typed == nil {
		l := &unstructured.UnstructuredList{Object: map[string]any{}, Items: make([]unstructured.Unstructured, 0, len(objs))}
		if !lw.gvk.Empty() {
			l.SetGroupVersionKind(lw.gvk.GroupVersion().WithKind(lw.gvk.Kind + "List"))
		}
		for _, o := range objs {
			l.Items = append(l.Items, *o.(*unstructured.Unstructured))
		}
		l.SetResourceVersion(rv)
		return l, nil
	}
	l := &metav1.List{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: make([]runtime.RawExtension, 0, len(objs))}
	for _, o := range objs {
		l.Items = append(l.Items, runtime.RawExtension{Object: o})
	}
	return l, nil
}

// WatchWithContext watches the bucket. With options.ResourceVersion a
// revision, it sends every change after it, in revision order: a put as
// Modified, a deletion as Deleted (an object carrying only its namespace,
// name and the deletion's revision). With "" or "0", or SendInitialEvents,
// it sends the bucket's objects first as Added, then the changes; with
// SendInitialEvents and AllowWatchBookmarks, a Bookmark annotated
// k8s.io/initial-events-end ends the initial events (client-go's
// watch-list). A revision older than the bucket's compaction is refused
// with 410 Gone, when the watch starts or (as a watch.Error event) when a
// compaction overtakes it; so is a deletion the watch cannot name. A
// revision past the bucket's last is "too large". Both make the
// reflector list again.
//
// The watch ends when ctx ends, at options.TimeoutSeconds (after a last
// bookmark, if allowed), at Stop, or when NATS closes the watch; Stop
// waits for its goroutine and releases the consumer.
func (lw *ListerWatcher) WatchWithContext(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
	if err := checkOptions(options); err != nil {
		return nil, err
	}
	from, err := parseRV(options.ResourceVersion)
	if err != nil {
		return nil, err
	}
	sendInitial := options.SendInitialEvents != nil && *options.SendInitialEvents
	if sendInitial && !options.AllowWatchBookmarks {
		return nil, apierrors.NewBadRequest("sendInitialEvents needs allowWatchBookmarks: the initial events end with a bookmark")
	}
	initial := from == 0 || sendInitial
	last, err := lw.lastRevision(ctx)
	if err != nil {
		return nil, lw.unavailable("watching", err)
	}
	if from > last {
		return nil, tooLarge(from, last)
	}
	var compacted uint64
	if !initial {
		if compacted, err = lw.compacted(ctx); err != nil {
			return nil, lw.unavailable("watching", err)
		}
		if from < compacted {
			return nil, expired(from, compacted)
		}
	}
	var kw jetstream.KeyWatcher
	if initial {
		kw, err = lw.kv.WatchAll(ctx)
	} else {
		kw, err = lw.kv.WatchAll(ctx, jetstream.ResumeFromRevision(from+1))
	}
	if err != nil {
		return nil, lw.unavailable("watching", err)
	}
	var timeout time.Duration
	if options.TimeoutSeconds != nil && *options.TimeoutSeconds > 0 {
		timeout = time.Duration(*options.TimeoutSeconds) * time.Second
	}
	runCtx, cancel := context.WithCancel(ctx)
	w := &watcher{result: make(chan watch.Event), cancel: cancel, done: make(chan struct{})}
	st := watchState{
		pos: from, sent: from, compacted: compacted, last: last,
		initial: initial, endBookmark: sendInitial && options.AllowWatchBookmarks,
		bookmarks: options.AllowWatchBookmarks, timeout: timeout,
	}
	go lw.run(runCtx, w, kw, st)
	return w, nil
}

// watcher is a watch.Interface whose goroutine is run.
type watcher struct {
	result chan watch.Event
	cancel context.CancelFunc
	done   chan struct{}
}

// Stop ends the watch and waits for its goroutine, which releases the
// consumer. It may be called more than once, from any goroutine.
func (w *watcher) Stop() {
	w.cancel()
	<-w.done
}

func (w *watcher) ResultChan() <-chan watch.Event { return w.result }

func (w *watcher) send(ctx context.Context, ev watch.Event) bool {
	select {
	case w.result <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// watchState is one watch's progress.
type watchState struct {
	pos         uint64 // the last revision read
	sent        uint64 // the last revision told (an event or a bookmark)
	compacted   uint64 // the highest compaction known
	last        uint64 // the bucket's last revision when the watch started
	initial     bool   // send the objects first
	endBookmark bool   // then a bookmark annotated initial-events-end
	bookmarks   bool
	timeout     time.Duration
}

// batchMax bounds the entries read before a batch is checked and sent.
const batchMax = 256

// run is a watch's goroutine: it owns kw and w.result.
func (lw *ListerWatcher) run(ctx context.Context, w *watcher, kw jetstream.KeyWatcher, st watchState) {
	defer close(w.done)
	defer close(w.result)
	defer lw.stopWatcher(kw)
	var timeout <-chan time.Time
	if st.timeout > 0 {
		t := time.NewTimer(st.timeout)
		defer t.Stop()
		timeout = t.C
	}
	if st.initial {
		snap, pos, err := lw.snapshot(ctx, kw)
		if err != nil {
			if ctx.Err() == nil {
				lw.log.Warn("a mirror watch ended before its initial events", "error", err)
			}
			return
		}
		if err := lw.overtaken(ctx, st.last); err != nil {
			if status, ok := err.(*apierrors.StatusError); ok {
				w.send(ctx, watch.Event{Type: watch.Error, Object: &status.ErrStatus})
			}
			return
		}
		st.pos = max(pos, st.last)
		for _, o := range lw.objects(snap) {
			if !w.send(ctx, watch.Event{Type: watch.Added, Object: o}) {
				return
			}
		}
		if st.endBookmark {
			b := lw.bookmark(st.pos)
			b.(metav1.Object).SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
			if !w.send(ctx, watch.Event{Type: watch.Bookmark, Object: b}) {
				return
			}
			st.sent = st.pos
		}
	}
	var tick <-chan time.Time
	if st.bookmarks && lw.opts.BookmarkInterval >= 0 {
		t := time.NewTicker(orDefault(lw.opts.BookmarkInterval, DefaultBookmarkInterval))
		defer t.Stop()
		tick = t.C
	}
	batch := make([]jetstream.KeyValueEntry, 0, batchMax)
	for {
		select {
		case <-ctx.Done():
			return
		case <-timeout:
			if st.bookmarks && st.pos > st.sent {
				w.send(ctx, watch.Event{Type: watch.Bookmark, Object: lw.bookmark(st.pos)})
			}
			return
		case <-tick:
			if st.pos > st.sent && w.send(ctx, watch.Event{Type: watch.Bookmark, Object: lw.bookmark(st.pos)}) {
				st.sent = st.pos
			}
		case e, ok := <-kw.Updates():
			if !ok {
				if ctx.Err() == nil {
					lw.log.Warn("NATS closed a mirror watch", "revision", st.pos)
				}
				return
			}
			batch = append(batch[:0], e)
		more:
			for len(batch) < batchMax {
				select {
				case e, ok := <-kw.Updates():
					if !ok {
						break more
					}
					batch = append(batch, e)
				default:
					break more
				}
			}
			if !lw.apply(ctx, w, batch, &st) {
				return
			}
		}
	}
}

// apply sends the events of a batch of entries, unless a gap in the
// revisions before them may hide a compacted deletion: then the watch
// ends with 410 Gone. A gap is a revision the stream no longer holds: one
// superseded (History 1), or a deletion marker compacted. The compactor
// raises CompactedKey before it purges, so a fresh read of it, made after
// the gap was seen, covers every purge that made the gap.
func (lw *ListerWatcher) apply(ctx context.Context, w *watcher, batch []jetstream.KeyValueEntry, st *watchState) bool {
	var gap uint64
	p := st.pos
	for _, e := range batch {
		if e == nil || e.Revision() <= p {
			continue // the end of the initial values; or read already
		}
		if e.Revision() > p+1 && gap == 0 {
			gap = p + 1
		}
		p = e.Revision()
		if e.Key() == CompactedKey && e.Operation() == jetstream.KeyValuePut {
			if c, err := strconv.ParseUint(string(e.Value()), 10, 64); err == nil {
				st.compacted = max(st.compacted, c)
			}
		}
	}
	if gap != 0 && gap > st.compacted {
		c, err := lw.compacted(ctx)
		if err != nil {
			if ctx.Err() == nil {
				lw.log.Warn("a mirror watch ended: reading the compaction", "error", err, "revision", st.pos)
			}
			return false
		}
		st.compacted = max(st.compacted, c)
	}
	if gap != 0 && gap <= st.compacted {
		w.send(ctx, watch.Event{Type: watch.Error, Object: &expired(gap-1, st.compacted).ErrStatus})
		return false
	}
	for _, e := range batch {
		if e == nil || e.Revision() <= st.pos {
			continue
		}
		rev := e.Revision()
		st.pos = rev
		key := e.Key()
		if len(key) >= len(ReservedPrefix) && key[:len(ReservedPrefix)] == ReservedPrefix {
			continue
		}
		ns, name, hashed, err := ParseKey(key)
		if err != nil {
			lw.skip(skipKey, key, rev, err)
			continue
		}
		if e.Operation() == jetstream.KeyValuePut {
			obj, reason, err := lw.decode(key, rev, e.Value())
			if err == nil {
				if !w.send(ctx, watch.Event{Type: watch.Modified, Object: obj}) {
					return false
				}
				st.sent = rev
				continue
			}
			lw.skip(reason, key, rev, err) // an unreadable value reads as no object
		}
		if hashed {
			lw.mu.Lock()
			nn, ok := lw.hashed[key] // kept: informers sharing lw see the deletion too
			lw.mu.Unlock()
			if !ok {
				msg := fmt.Sprintf("mirror revision %d deletes key %s, whose object this watch cannot name: list again", rev, key)
				w.send(ctx, watch.Event{Type: watch.Error, Object: &apierrors.NewResourceExpired(msg).ErrStatus})
				return false
			}
			ns, name = nn[0], nn[1]
		}
		if !w.send(ctx, watch.Event{Type: watch.Deleted, Object: lw.stub(ns, name, rev)}) {
			return false
		}
		st.sent = rev
	}
	return true
}

// snapshot reads kw (a watch of the last value per key) up to its end of
// initial values: each key's last entry, and the highest revision read.
func (lw *ListerWatcher) snapshot(ctx context.Context, kw jetstream.KeyWatcher) (map[string]jetstream.KeyValueEntry, uint64, error) {
	snap := map[string]jetstream.KeyValueEntry{}
	var pos uint64
	for {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return nil, 0, errors.New("NATS closed the watch")
			}
			if e == nil {
				return snap, pos, nil
			}
			if e.Revision() <= pos {
				continue
			}
			pos = e.Revision()
			if old, ok := snap[e.Key()]; !ok || old.Revision() < e.Revision() {
				snap[e.Key()] = e
			}
		}
	}
}

// objects decodes a snapshot's objects, in revision order, skipping
// deletions, reserved keys and what does not read.
func (lw *ListerWatcher) objects(snap map[string]jetstream.KeyValueEntry) []runtime.Object {
	entries := make([]jetstream.KeyValueEntry, 0, len(snap))
	for k, e := range snap {
		if e.Operation() != jetstream.KeyValuePut || len(k) >= len(ReservedPrefix) && k[:len(ReservedPrefix)] == ReservedPrefix {
			continue
		}
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b jetstream.KeyValueEntry) int {
		return cmpUint(a.Revision(), b.Revision())
	})
	out := make([]runtime.Object, 0, len(entries))
	for _, e := range entries {
		if _, _, _, err := ParseKey(e.Key()); err != nil {
			lw.skip(skipKey, e.Key(), e.Revision(), err)
			continue
		}
		obj, reason, err := lw.decode(e.Key(), e.Revision(), e.Value())
		if err != nil {
			lw.skip(reason, e.Key(), e.Revision(), err)
			continue
		}
		out = append(out, obj)
	}
	return out
}

// decode reads the object a put of key at rev holds: its
// resourceVersion becomes rev, the apiserver's moves to
// ResourceVersionAnnotation.
func (lw *ListerWatcher) decode(key string, rev uint64, raw []byte) (runtime.Object, int, error) {
	if limit := orDefault(lw.opts.MaxValueBytes, DefaultMaxValueBytes); limit > 0 && len(raw) > limit {
		return nil, skipSize, fmt.Errorf("value of %d bytes, over the %d taken", len(raw), limit)
	}
	v, err := ParseValue(raw)
	if err != nil {
		return nil, skipValue, err
	}
	obj, err := lw.decodeObject(v.Object)
	if err != nil {
		return nil, skipValue, fmt.Errorf("data.object: %w", err)
	}
	if want := lw.objectType(); reflect.TypeOf(obj) != want {
		return nil, skipObject, fmt.Errorf("data.object decodes to %T, not %v", obj, want)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, skipObject, err
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	switch {
	case !lw.gvk.Empty() && gvk != lw.gvk:
		return nil, skipObject, fmt.Errorf("object is a %v, not a %v", gvk, lw.gvk)
	case lw.kind != "" && gvk.Kind != "" && gvk.Kind != lw.kind:
		return nil, skipObject, fmt.Errorf("object is a %s, not a %s", gvk.Kind, lw.kind)
	}
	if k := Key(m.GetNamespace(), m.GetName()); k != key {
		return nil, skipObject, fmt.Errorf("object %s/%s belongs under key %s", m.GetNamespace(), m.GetName(), k)
	}
	if m.GetName() == "" {
		return nil, skipObject, errors.New("object has no name")
	}
	if lw.typed == nil && lw.gvk.Empty() && !gvk.Empty() {
		if p := lw.seen.Load(); p == nil || *p != gvk {
			lw.seen.Store(&gvk)
		}
	}
	ann := make(map[string]string, len(m.GetAnnotations())+1)
	for k, v := range m.GetAnnotations() {
		ann[k] = v
	}
	if rv := m.GetResourceVersion(); rv != "" {
		ann[ResourceVersionAnnotation] = rv
	}
	m.SetAnnotations(ann)
	m.SetResourceVersion(strconv.FormatUint(rev, 10))
	if _, _, hashed, _ := ParseKey(key); hashed {
		lw.mu.Lock()
		lw.hashed[key] = [2]string{m.GetNamespace(), m.GetName()}
		lw.mu.Unlock()
	}
	return obj, 0, nil
}

func (lw *ListerWatcher) decodeObject(b []byte) (runtime.Object, error) {
	if lw.opts.Decode != nil {
		obj, err := lw.opts.Decode(b)
		if err == nil && obj == nil {
			err = errors.New("decoded to nil")
		}
		return obj, err
	}
	if lw.typed == nil {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		return u, nil
	}
	obj := lw.newObject()
	if err := json.Unmarshal(b, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

var unstructuredType = reflect.TypeOf(&unstructured.Unstructured{})

// objectType is Options.Object's type.
func (lw *ListerWatcher) objectType() reflect.Type {
	if lw.typed == nil {
		return unstructuredType
	}
	return lw.typed
}

// newObject is an empty object of Options.Object's type.
func (lw *ListerWatcher) newObject() runtime.Object {
	if lw.typed == nil {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		if !lw.gvk.Empty() {
			u.SetGroupVersionKind(lw.gvk)
		}
		return u
	}
	if lw.typed.Kind() == reflect.Pointer {
		if o, ok := reflect.New(lw.typed.Elem()).Interface().(runtime.Object); ok {
			return o
		}
	}
	return lw.opts.Object.DeepCopyObject()
}

func (lw *ListerWatcher) bookmark(rev uint64) runtime.Object {
	o := lw.newObject()
	if m, err := meta.Accessor(o); err == nil {
		m.SetResourceVersion(strconv.FormatUint(rev, 10))
	}
	return o
}

// stub is a deleted object as a watch names it: namespace, name and the
// deletion's revision; apiVersion and kind are Options.Object's, or else
// those of the last object decoded.
func (lw *ListerWatcher) stub(ns, name string, rev uint64) runtime.Object {
	o := lw.newObject()
	if u, ok := o.(*unstructured.Unstructured); ok && lw.gvk.Empty() {
		if p := lw.seen.Load(); p != nil {
			u.SetGroupVersionKind(*p) // the kind the bucket's objects have
		}
	}
	if m, err := meta.Accessor(o); err == nil {
		m.SetNamespace(ns)
		m.SetName(name)
		m.SetResourceVersion(strconv.FormatUint(rev, 10))
	}
	return o
}

func (lw *ListerWatcher) skip(reason int, key string, rev uint64, err error) {
	n := lw.skips[reason].Add(1)
	now := time.Now().UnixNano()
	last := lw.lastLog[reason].Load()
	if now-last < int64(time.Minute) || !lw.lastLog[reason].CompareAndSwap(last, now) {
		return
	}
	lw.log.Warn("skipped a mirror entry", "reason", skipNames[reason], "key", key, "revision", rev, "error", err, "skipped", n)
}

// stopWatcher stops kw and drains it until NATS closes it: its callback
// blocks on a full channel, and would hold its goroutine forever.
func (lw *ListerWatcher) stopWatcher(kw jetstream.KeyWatcher) {
	_ = kw.Stop()
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	for {
		select {
		case _, ok := <-kw.Updates():
			if !ok {
				return
			}
		case <-t.C:
			lw.log.Warn("a mirror watch did not close after Stop", "waited", drainTimeout)
			return
		}
	}
}

// drainTimeout bounds stopWatcher's wait.
const drainTimeout = 10 * time.Second

// lastRevision is the bucket's last revision (its stream's last sequence).
func (lw *ListerWatcher) lastRevision(ctx context.Context) (uint64, error) {
	st, err := lw.kv.Status(ctx)
	if err != nil {
		return 0, err
	}
	if s, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo }); ok && s.StreamInfo() != nil {
		return s.StreamInfo().State.LastSeq, nil
	}
	return 0, fmt.Errorf("bucket status %T has no stream info", st)
}

// overtaken checks, after a snapshot that started at revision last, that
// no compaction purged a deletion written while the snapshot was read
// (before the snapshot reached it: it would hold the object still). It
// never does unless markers are kept for less than a snapshot takes; then
// the snapshot is refused with 410 Gone, and the reflector lists again.
func (lw *ListerWatcher) overtaken(ctx context.Context, last uint64) error {
	c, err := lw.compacted(ctx)
	if err != nil {
		return lw.unavailable("reading the compaction", err)
	}
	if c > last {
		return apierrors.NewResourceExpired(fmt.Sprintf("a compaction up to %d overtook a list from %d", c, last))
	}
	return nil
}

// compacted reads CompactedKey: deletion markers up to it may be gone.
func (lw *ListerWatcher) compacted(ctx context.Context) (uint64, error) {
	e, err := lw.kv.Get(ctx, CompactedKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// The writer raises it before it purges, so it is below its own
	// revision: a value that is not (a foreign writer's, a bucket restored)
	// counts as a compaction of everything before that revision, which
	// refuses only what is older, and never every list for ever.
	c, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if e.Revision() == 0 { // no revision to check it against
		if err != nil {
			return 0, fmt.Errorf("%s is %q, not a revision", CompactedKey, e.Value())
		}
		return c, nil
	}
	if err != nil || c >= e.Revision() {
		lw.log.Warn("the compaction revision is not one the bridge writes; taken as everything before its own write", "key", CompactedKey, "value", string(e.Value()), "revision", e.Revision())
		return e.Revision() - 1, nil
	}
	return c, nil
}

func (lw *ListerWatcher) unavailable(what string, err error) error {
	return apierrors.NewServiceUnavailable(fmt.Sprintf("%s mirror bucket %s: %v", what, lw.kv.Bucket(), err))
}

func checkOptions(o metav1.ListOptions) error {
	if o.LabelSelector != "" || o.FieldSelector != "" {
		return apierrors.NewBadRequest(fmt.Sprintf("a mirror takes no selector (labelSelector %q, fieldSelector %q): its rule selects", o.LabelSelector, o.FieldSelector))
	}
	if o.ResourceVersionMatch == metav1.ResourceVersionMatchExact {
		return apierrors.NewBadRequest("a mirror lists only its latest revision (resourceVersionMatch Exact)")
	}
	return nil
}

func parseRV(rv string) (uint64, error) {
	if rv == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion %q is not a mirror revision (a decimal number)", rv))
	}
	return n, nil
}

func expired(rev, compacted uint64) *apierrors.StatusError {
	return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (mirror compacted up to %d)", rev, compacted))
}

// tooLarge is the apiserver's answer to a resourceVersion past its last.
func tooLarge(rev, last uint64) *apierrors.StatusError {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", rev, last), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return err
}

func orDefault[T time.Duration | int](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

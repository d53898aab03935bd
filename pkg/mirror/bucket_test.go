package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Every goroutine has an owner that waits for it: after the package's
// tests no goroutine of theirs, nor of the informers and watches they
// drive, may still be running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bucket is a mirror bucket on an embedded NATS, written the way the
// nats sink writes it (docs/mirror.md), by the tests themselves.
type bucket struct {
	t   *testing.T
	srv *testenv.NATS
	nc  *natsgo.Conn
	js  jetstream.JetStream
	kv  jetstream.KeyValue

	mu   sync.Mutex
	view map[string]string // key -> uid/apiserver resourceVersion, what a consumer must end with
	seq  int
}

func newBucket(t *testing.T) *bucket {
	t.Helper()
	srv := testenv.StartNATS(t)
	b := &bucket{t: t, srv: srv, view: map[string]string{}}
	b.nc, b.js, b.kv = connect(t, srv.ClientURL(), "kubebridge-r", true)
	return b
}

// connect opens bucket at url (creating it if create), reconnecting
// forever; the connection closes when the test ends.
func connect(t testing.TB, url, bucket string, create bool) (*natsgo.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, err := natsgo.Connect(url, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	must(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var kv jetstream.KeyValue
	if create {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1})
	} else {
		kv, err = js.KeyValue(ctx, bucket)
	}
	must(t, err)
	return nc, js, kv
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// envelope is the value the nats sink stores for obj.
func envelope(obj map[string]any) []byte {
	md := obj["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	b, err := json.Marshal(map[string]any{
		"specversion": "1.0", "id": fmt.Sprintf("id-%v", md["resourceVersion"]),
		"source": "kubebridge/test", "type": "io.kubebridge.updated",
		"subject": ns + "/" + md["name"].(string), "time": time.Now().UTC().Format(time.RFC3339Nano),
		"kbrule": "r", "kbcluster": "test", "kbchange": "updated",
		"datacontenttype": "application/json",
		"data":            map[string]any{"object": obj},
	})
	if err != nil {
		panic(err)
	}
	return b
}

func configMap(ns, name, uid string, rv int, data string) map[string]any {
	md := map[string]any{"name": name, "uid": uid, "resourceVersion": strconv.Itoa(rv)}
	if ns != "" {
		md["namespace"] = ns
	}
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": map[string]any{"k": data}}
}

// put stores a ConfigMap ns/name with uid, a fresh apiserver
// resourceVersion and data; it returns the revision.
func (b *bucket) put(ns, name, uid, data string) uint64 {
	b.t.Helper()
	b.mu.Lock()
	b.seq++
	rv := 1000 + b.seq
	b.view[Key(ns, name)] = uid + "/" + strconv.Itoa(rv)
	b.mu.Unlock()
	rev, err := b.kv.Put(context.Background(), Key(ns, name), envelope(configMap(ns, name, uid, rv, data)))
	must(b.t, err)
	return rev
}

// raw stores value under key, leaving the view as it is.
func (b *bucket) raw(key string, value []byte) uint64 {
	b.t.Helper()
	rev, err := b.kv.Put(context.Background(), key, value)
	must(b.t, err)
	return rev
}

// del takes ns/name out of the view: a delete marker; it returns its
// revision.
func (b *bucket) del(ns, name string) uint64 {
	b.t.Helper()
	b.mu.Lock()
	delete(b.view, Key(ns, name))
	b.mu.Unlock()
	ack, err := b.js.PublishMsg(context.Background(), &natsgo.Msg{
		Subject: "$KV." + b.kv.Bucket() + "." + Key(ns, name),
		Header:  natsgo.Header{"KV-Operation": []string{"DEL"}},
	})
	must(b.t, err)
	return ack.Sequence
}

// compact purges every delete marker, after raising CompactedKey past
// them, as the nats sink's compactor does.
func (b *bucket) compact() uint64 {
	b.t.Helper()
	ctx := ctxT(b.t)
	w, err := b.kv.WatchAll(ctx, jetstream.MetaOnly())
	must(b.t, err)
	type marker struct {
		key string
		rev uint64
	}
	var markers []marker
	var upTo uint64
	for e := range w.Updates() {
		if e == nil {
			break
		}
		if e.Operation() != jetstream.KeyValuePut {
			markers = append(markers, marker{e.Key(), e.Revision()})
			upTo = max(upTo, e.Revision())
		}
	}
	must(b.t, w.Stop())
	_, err = b.kv.Put(ctx, CompactedKey, []byte(strconv.FormatUint(upTo, 10)))
	must(b.t, err)
	st, err := b.js.Stream(ctx, "KV_"+b.kv.Bucket())
	must(b.t, err)
	for _, m := range markers {
		must(b.t, st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+b.kv.Bucket()+"."+m.key), jetstream.WithPurgeSequence(m.rev+1)))
	}
	return upTo
}

// want is the view a consumer must end with.
func (b *bucket) want() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.view)
}

// informer runs a SharedIndexInformer over lw until the test ends.
type informer struct {
	cache.SharedIndexInformer
	mu     sync.Mutex
	events []string // "add ns/name uid", "update ...", "delete ns/name"
}

func runInformer(t testing.TB, lw cache.ListerWatcher, obj runtime.Object) *informer {
	t.Helper()
	inf := &informer{SharedIndexInformer: cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { inf.record("add " + describe(o)) },
		UpdateFunc: func(_, o any) { inf.record("update " + describe(o)) },
		DeleteFunc: func(o any) { inf.record("delete " + describe(o)) },
	})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { inf.RunWithContext(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	inf.waitSynced(t)
	return inf
}

// startInformer runs a SharedIndexInformer over lw, without waiting.
func startInformer(t testing.TB, lw cache.ListerWatcher, obj runtime.Object) *informer {
	t.Helper()
	inf := &informer{SharedIndexInformer: cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { inf.RunWithContext(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return inf
}

func (i *informer) waitSynced(t testing.TB) {
	t.Helper()
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if !cache.WaitForCacheSync(ctx.Done(), i.HasSynced) {
		t.Fatal("the informer did not sync")
	}
}

// store reads the informer's store as key -> uid/apiserver resourceVersion.
func (i *informer) store() map[string]string {
	out := map[string]string{}
	for _, o := range i.GetStore().List() {
		m, err := meta.Accessor(o)
		if err != nil {
			continue
		}
		out[Key(m.GetNamespace(), m.GetName())] = string(m.GetUID()) + "/" + m.GetAnnotations()[ResourceVersionAnnotation]
	}
	return out
}

func (i *informer) record(s string) {
	i.mu.Lock()
	i.events = append(i.events, s)
	i.mu.Unlock()
}

func (i *informer) recorded() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return slices.Clone(i.events)
}

func describe(o any) string {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	m, err := meta.Accessor(o)
	if err != nil {
		return fmt.Sprintf("%T", o)
	}
	s := m.GetNamespace() + "/" + m.GetName()
	if m.GetUID() != "" {
		s += " " + string(m.GetUID())
	}
	return s
}

// eventually polls cond every 10 ms for up to d.
func eventually(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, d, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// converges waits until the informer's store is the bucket's view.
func converges(t testing.TB, b *bucket, inf *informer, d time.Duration) {
	t.Helper()
	eventually(t, d, "the informer's store equals the view", func() (bool, string) {
		got, want := inf.store(), b.want()
		return maps.Equal(got, want), fmt.Sprintf("store %v, view %v", got, want)
	})
}

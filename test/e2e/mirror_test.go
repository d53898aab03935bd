package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/mirror"
)

// mirrorState reads bucket as a consumer does: key -> "uid rv".
func mirrorState(t *testing.T, url, bucket string) (map[string]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := natsgo.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string]string{}
	for e := range w.Updates() {
		if e == nil {
			return out, nil
		}
		if strings.HasPrefix(e.Key(), mirror.ReservedPrefix) {
			continue
		}
		var v struct {
			Data struct {
				Object struct {
					Kind, APIVersion string
					Metadata         struct{ UID, ResourceVersion string }
				}
			}
		}
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			out[e.Key()] = "unreadable"
			continue
		}
		md := v.Data.Object.Metadata
		out[e.Key()] = md.UID + " " + md.ResourceVersion
	}
	return nil, fmt.Errorf("the watch of %s closed", bucket)
}

// configMapState is what the apiserver holds of namespaces' ConfigMaps,
// keyed as the mirror keys them: key -> "uid rv".
func configMapState(t *testing.T, cp *testenv.ControlPlane, namespaces ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ns := range namespaces {
		list, err := cp.Clientset(t).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			out[mirror.Key(cm.Namespace, cm.Name)] = string(cm.UID) + " " + cm.ResourceVersion
		}
	}
	return out
}

// diffStates lists how got differs from want, sorted, at most 20 lines.
func diffStates(want, got map[string]string) []string {
	var d []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			d = append(d, "missing "+k+" ("+w+")")
		} else if g != w {
			d = append(d, "stale "+k+": "+g+", want "+w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			d = append(d, "extra "+k+" ("+g+")")
		}
	}
	sort.Strings(d)
	return d[:min(len(d), 20)]
}

// A rule's mirror bucket converges to the rule's view through SIGKILLs,
// changes while the bridge is down, a lost checkpoint, and entries written
// behind its back: the bridge diffs the view against the bucket, not
// against its checkpoint alone.
func TestMirrorConvergesToTheView(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"mirror-a", "mirror-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	nats := testenv.StartNATS(t)
	ckpt := filepath.Join(t.TempDir(), "state.db")
	cfg := fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: views
    nats: {url: %q, mirror: {bucket: "view-{rule}"}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [%s]
    sinks: [views]
`, nats.ClientURL(), strings.Join(namespaces, ", "))

	l := startLoad(t, cp, namespaces, false)
	b := startBridge(t, cp, cfg, withRestartFlags(), withCheckpointFile(ckpt))
	for range 3 {
		time.Sleep(time.Second)
		b.kill()
		time.Sleep(300 * time.Millisecond) // changes go on while it is down
		b.start()
	}
	// Down, its checkpoint lost, changes made meanwhile, and keys written
	// behind its back: an object that does not exist, a value that is no
	// envelope.
	time.Sleep(time.Second)
	b.kill()
	time.Sleep(500 * time.Millisecond)
	must(t, os.Remove(ckpt))
	nc, err := natsgo.Connect(nats.ClientURL())
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	kv, err := js.KeyValue(context.Background(), "view-cms")
	must(t, err)
	_, err = kv.Put(context.Background(), mirror.Key("mirror-a", "ghost"), []byte(`{"data":{"object":{"metadata":{"namespace":"mirror-a","name":"ghost","uid":"u-ghost","resourceVersion":"1"}}}}`))
	must(t, err)
	_, err = kv.Put(context.Background(), mirror.Key("mirror-b", "junk"), []byte(`not an envelope`))
	must(t, err)
	b.start()
	time.Sleep(time.Second)
	l.stop()

	want := configMapState(t, cp, namespaces...)
	var last []string
	ok := poll(60*time.Second, func() bool {
		got, err := mirrorState(t, nats.ClientURL(), "view-cms")
		if err != nil {
			last = []string{err.Error()}
			return false
		}
		last = diffStates(want, got)
		return len(last) == 0
	})
	if !ok {
		t.Fatalf("the bucket differs from the view (%d objects) after the faults:\n%s\n%s", len(want), strings.Join(last, "\n"), b.runLogTail())
	}
	t.Logf("the bucket holds the view: %d objects, after %d load operations", len(want), l.ops)
}

// apiserverWatches reads, from the apiserver's metrics, how many watches of
// resource it is serving now.
func apiserverWatches(t *testing.T, cp *testenv.ControlPlane, resource string) int {
	t.Helper()
	raw, err := cp.Clientset(t).CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	must(t, err)
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "apiserver_longrunning_requests{") && strings.Contains(line, `resource="`+resource+`"`) && strings.Contains(line, `verb="WATCH"`) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			must(t, err)
			n += int(v)
		}
	}
	return n
}

// consumer is one client-go informer over a mirror bucket.
type consumer struct {
	inf  cache.SharedIndexInformer
	stop context.CancelFunc
	done chan struct{}
}

func startConsumer(t *testing.T, kv jetstream.KeyValue) *consumer {
	lw := mirror.NewListerWatcher(kv, mirror.Options{Object: &corev1.ConfigMap{}, BookmarkInterval: time.Second})
	c := &consumer{inf: cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{}), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = func() { cancel(); <-c.done }
	go func() {
		defer close(c.done)
		c.inf.Run(ctx.Done())
	}()
	t.Cleanup(c.stop)
	return c
}

// state is what the consumer's store holds: key -> "uid rv", the
// apiserver's resourceVersion read from the annotation.
func (c *consumer) state() map[string]string {
	out := map[string]string{}
	for _, o := range c.inf.GetStore().List() {
		cm := o.(*corev1.ConfigMap)
		out[mirror.Key(cm.Namespace, cm.Name)] = string(cm.UID) + " " + cm.Annotations[mirror.ResourceVersionAnnotation]
	}
	return out
}

// A thousand consumers of a rule's view cost the apiserver nothing: 200
// client-go informers (typed, unchanged but for their ListerWatcher) over
// the bridge's mirror bucket each end holding exactly the view after churn,
// one started late and one restarted mid-churn included, while the
// apiserver serves one watch of ConfigMaps the whole time: the bridge's.
func TestMirrorConsumersCostTheAPIServerOneWatch(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	const ns = "mirror-consumers"
	testenv.EnsureNamespace(t, cp, ns)
	nats := testenv.StartNATS(t)
	before := apiserverWatches(t, cp, "configmaps") // the apiserver's own (its controllers)
	l := startLoad(t, cp, []string{ns}, false)
	time.Sleep(time.Second) // some objects before the start
	startBridge(t, cp, fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: views
    nats: {url: %q, mirror: {}}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [%s]
    sinks: [views]
`, nats.ClientURL(), ns), withRestartFlags())

	js := func() jetstream.JetStream {
		nc, err := natsgo.Connect(nats.ClientURL())
		must(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		must(t, err)
		return js
	}
	var kv jetstream.KeyValue
	if !poll(30*time.Second, func() bool {
		var err error
		kv, err = js().KeyValue(context.Background(), "kubebridge-cms")
		return err == nil
	}) {
		t.Fatal("the mirror bucket was not created")
	}
	watches := []int{apiserverWatches(t, cp, "configmaps")}
	var consumers []*consumer
	for i := range 199 {
		if i%50 == 0 { // a connection per 50 consumers
			var err error
			kv, err = js().KeyValue(context.Background(), "kubebridge-cms")
			must(t, err)
		}
		consumers = append(consumers, startConsumer(t, kv))
	}
	for i, c := range consumers {
		if !cache.WaitForCacheSync(testCtx(t, 60*time.Second).Done(), c.inf.HasSynced) {
			t.Fatalf("consumer %d did not sync", i)
		}
	}
	watches = append(watches, apiserverWatches(t, cp, "configmaps"))
	time.Sleep(time.Second) // churn with every consumer watching
	consumers[7].stop()     // restarted mid-churn
	time.Sleep(500 * time.Millisecond)
	consumers[7] = startConsumer(t, kv)
	watches = append(watches, apiserverWatches(t, cp, "configmaps"))
	time.Sleep(time.Second)
	l.stop()
	consumers = append(consumers, startConsumer(t, kv)) // started late
	watches = append(watches, apiserverWatches(t, cp, "configmaps"))

	want := configMapState(t, cp, ns)
	for i, c := range consumers {
		var diff []string
		if !poll(60*time.Second, func() bool {
			diff = diffStates(want, c.state())
			return len(diff) == 0
		}) {
			t.Fatalf("consumer %d of %d differs from the view (%d objects):\n%s", i, len(consumers), len(want), strings.Join(diff, "\n"))
		}
	}
	watches = append(watches, apiserverWatches(t, cp, "configmaps"))
	for _, n := range watches {
		if n != before+1 {
			t.Errorf("the apiserver served %v watches of ConfigMaps along the test, want %d throughout (its own %d and the bridge's)", watches, before+1, before)
			break
		}
	}
	t.Logf("%d consumers hold the view (%d objects after %d load operations); apiserver watches of ConfigMaps: %d before the bridge, then %v", len(consumers), len(want), l.ops, before, watches)
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A mirror bucket deleted while the bridge runs (an operator, a memory
// stream restarted) is created again and written whole: the sink notices
// the bucket is another and the bridge reads it again and sends what it
// lacks, not only the changes that follow.
func TestMirrorBucketDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	const ns = "mirror-lost"
	testenv.EnsureNamespace(t, cp, ns)
	nats := testenv.StartNATS(t)
	l := startLoad(t, cp, []string{ns}, false)
	b := startBridge(t, cp, fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: views
    nats: {url: %q, mirror: {bucket: "lost-{rule}"}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [%s]
    sinks: [views]
`, nats.ClientURL(), ns), withRestartFlags())
	time.Sleep(2 * time.Second)
	nc, err := natsgo.Connect(nats.ClientURL())
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	must(t, js.DeleteKeyValue(context.Background(), "lost-cms"))
	time.Sleep(2 * time.Second) // changes go on: the bucket is created again
	l.stop()

	want := configMapState(t, cp, ns)
	var diff []string
	if !poll(60*time.Second, func() bool {
		got, err := mirrorState(t, nats.ClientURL(), "lost-cms")
		if err != nil {
			diff = []string{err.Error()}
			return false
		}
		diff = diffStates(want, got)
		return len(diff) == 0
	}) {
		t.Fatalf("the bucket created again differs from the view (%d objects):\n%s\n%s", len(want), strings.Join(diff, "\n"), b.runLogTail())
	}
	if !strings.Contains(b.log(), "created anew") {
		t.Errorf("the loss is not logged:\n%s", b.runLogTail())
	}
}

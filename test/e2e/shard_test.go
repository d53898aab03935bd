package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Replicas share 8 shards of the objects, each through its own Lease,
// against an apiserver that filters lists and watches by shard (gate
// ShardedListAndWatch on) and one that does not. Under churn (and objects
// deleted and re-created under their names, so that their new uid lands
// in another shard), three replicas start; one is SIGKILLed and its shards
// are delivered again by the others once their leases expire; two join (4
// live) and two leave (2 live): the shards rebalance each time, every
// shard delivered by exactly one replica. With the gate on, each replica
// caches only about its share of the objects; with it off, all of them.
// In the end the stream holds every object's final state (nothing lost);
// and in what the replicas published (every publish, before JetStream's
// deduplication): no id stands for two different transitions, each uid's
// resourceVersions never go back (two owners of a shard at once would
// interleave), and no object that exists was ever sent deleted.
func TestShardedReplicas(t *testing.T) {
	t.Parallel()
	for _, gate := range []bool{true, false} {
		name := "apiserver-filters"
		if !gate {
			name = "client-side-only"
		}
		t.Run(name, func(t *testing.T) { t.Parallel(); testShardedReplicas(t, gate) })
	}
}

const testShards = 8

func testShardedReplicas(t *testing.T, gate bool) {
	var cp *testenv.ControlPlane
	tag := "off"
	if gate {
		cp = testenv.StartControlPlaneWithOptions(t, testenv.ControlPlaneOptions{FeatureGates: []string{"ShardedListAndWatch=true"}})
		tag = "on"
	} else {
		cp = testenv.SharedControlPlane(t)
	}
	namespaces := []string{"shard-" + tag + "-a", "shard-" + tag + "-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	srv := testenv.StartNATS(t)
	stream := "SHARDS" + strings.ToUpper(tag)
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: kb-shards-` + tag + `}}
sharding: {shards: ` + strconv.Itoa(testShards) + `}
sinks:
  - name: bus
    nats: {url: "` + srv.ClientURL() + `", jetstream: true, stream: {name: ` + stream + `, duplicateWindow: 10m}}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + strings.Join(namespaces, ", ") + `]
    sinks: [bus]
`
	group := "kb-shards-" + tag
	replica := func(name string) *bridgeProc {
		return startBridge(t, cp, cfg, withConfigCheckpoint(), withLogLevel("info"), withShortLease(),
			withFlags("--leader-elect-namespace", "default", "--leader-elect-name", group, "--identity", name),
			withReadyLog("bridge started; sharing the shards"))
	}
	// Every publish, duplicates included: a core subscription sees what
	// JetStream's duplicate window would hide.
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	t.Cleanup(nc.Close)
	var pubMu sync.Mutex
	var published []ce
	_, err = nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
		var e ce
		if json.Unmarshal(m.Data, &e) == nil {
			pubMu.Lock()
			published = append(published, e)
			pubMu.Unlock()
		}
	})
	must(t, err)
	must(t, nc.Flush())

	a, b, c := replica("replica-a"), replica("replica-b"), replica("replica-c")
	l := startLoad(t, cp, namespaces, false)
	stopRecreate := recreateLoop(t, cp, namespaces[0], l)

	want := 0.0
	if gate {
		want = 1
	}
	for _, r := range []*bridgeProc{a, b, c} {
		if got, ok := scrapeMetric(r, "kubebridge_shards_apiserver_filtered"); !ok || got != want {
			t.Errorf("kubebridge_shards_apiserver_filtered = %v (scraped %v), want %v", got, ok, want)
		}
	}
	waitShardsBalanced(t, "three replicas", a, b, c)

	t0 := time.Now()
	c.kill()
	waitShardsBalanced(t, "after a SIGKILL", a, b)
	t.Logf("a SIGKILLed replica's shards were delivered again after %s (leases of 4s)", time.Since(t0).Round(100*time.Millisecond))

	d, e := replica("replica-d"), replica("replica-e")
	waitShardsBalanced(t, "four replicas", a, b, d, e)

	for _, r := range []*bridgeProc{a, b} {
		if exited, err := r.terminate(30 * time.Second); !exited || err != nil {
			t.Fatalf("a replica did not stop cleanly on SIGTERM (exited %v, %v):\n%s", exited, err, r.runLogTail())
		}
	}
	waitShardsBalanced(t, "two replicas", d, e)
	checkCachedShare(t, cp, namespaces, gate, d, e)
	time.Sleep(500 * time.Millisecond)
	stopRecreate()
	l.stop()

	js := viewJetStream(t, srv)
	verifyByUID(t, cp, namespaces, "3 replicas, a SIGKILL, 3 → 4 → 2", func() []ce { return viewStreamEvents(viewStream(t, js, stream)) })

	time.Sleep(time.Second) // the last publishes reach the subscription
	pubMu.Lock()
	pubs := slices.Clone(published)
	pubMu.Unlock()
	checkPublished(t, cp, namespaces, pubs)
}

// checkPublished checks every publish, in arrival order: one id, one
// transition (a message sent again repeats the first); per uid, the first
// sending of each id never goes back in resourceVersion; no deletion of an
// incarnation that still exists.
func checkPublished(t *testing.T, cp *testenv.ControlPlane, namespaces []string, pubs []ce) {
	t.Helper()
	live := map[string]bool{} // uids that exist at the end
	for _, ns := range namespaces {
		list, err := cp.Clientset(t).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			live[string(cm.UID)] = true
		}
	}
	first := map[string]string{}
	lastRV := map[string]int64{}
	problems, dups := 0, 0
	report := func(format string, args ...any) {
		if problems++; problems <= 15 {
			t.Errorf(format, args...)
		}
	}
	for _, e := range pubs {
		md, _ := e.Data.Object["metadata"].(map[string]any)
		uid, _ := md["uid"].(string)
		rv, _ := strconv.ParseInt(objectRV(e), 10, 64)
		what := e.Type + " rv " + objectRV(e)
		if prev, seen := first[e.ID]; seen {
			dups++
			if prev != what {
				report("id %s stands for %s and for %s", e.ID, prev, what)
			}
			continue
		}
		first[e.ID] = what
		// A deletion found by a reconciliation carries the state the
		// checkpoint kept, which may lag what was sent: only live states
		// must never go back.
		if e.change() != "deleted" {
			if rv < lastRV[uid] {
				report("uid %s (%s): resourceVersion %d sent after %d", uid, e.Subject, rv, lastRV[uid])
			}
			lastRV[uid] = max(lastRV[uid], rv)
		}
		if e.change() == "deleted" && live[uid] {
			report("uid %s (%s) exists, yet was sent deleted (%s)", uid, e.Subject, e.ID)
		}
	}
	t.Logf("%d publishes, %d of them sent again", len(pubs), dups)
}

// recreateLoop deletes and re-creates objects obj-re-0..4 of ns under the
// same names until stopped: each new incarnation's uid may fall in
// another shard than the last.
func recreateLoop(t *testing.T, cp *testenv.ControlPlane, ns string, l *load) func() {
	cs := cp.Clientset(t)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(40 * time.Millisecond):
			}
			name := fmt.Sprintf("obj-re-%d", i%5)
			_ = cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{})
			if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err == nil {
				l.mu.Lock()
				l.created[ns+"/"+name] = true
				l.mu.Unlock()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// verifyByUID applies the events in arrival order as a consumer keyed by
// uid does (added and updated hold the uid at their resourceVersion,
// deleted drops it) and compares what it holds with the apiserver's
// ConfigMaps named obj-*: each at its current resourceVersion, no other
// uid. Across shards, an object re-created under its name has its old
// incarnation's deletion and its new one's addition in either order:
// keyed by uid, that is the same view.
func verifyByUID(t *testing.T, cp *testenv.ControlPlane, namespaces []string, fault string, received func() []ce) {
	t.Helper()
	truth := map[string]string{} // uid -> rv
	for _, ns := range namespaces {
		list, err := cp.Clientset(t).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			if strings.HasPrefix(cm.Name, "obj-") {
				truth[string(cm.UID)] = cm.ResourceVersion
			}
		}
	}
	var problems []string
	var evs []ce
	testenv.Poll(60*time.Second, 300*time.Millisecond, func() bool {
		evs = received()
		held := map[string]string{} // uid -> rv
		subject := map[string]string{}
		for _, e := range evs {
			md, _ := e.Data.Object["metadata"].(map[string]any)
			uid, _ := md["uid"].(string)
			subject[uid] = e.Subject
			if e.change() == "deleted" {
				delete(held, uid)
			} else {
				held[uid] = objectRV(e)
			}
		}
		problems = problems[:0]
		for uid, rv := range truth {
			if held[uid] != rv {
				problems = append(problems, fmt.Sprintf("%s (uid %s): at rv %s, the consumer holds %q", subject[uid], uid, rv, held[uid]))
			}
		}
		for uid, rv := range held {
			if _, ok := truth[uid]; !ok {
				problems = append(problems, fmt.Sprintf("%s (uid %s): deleted, the consumer still holds it at rv %s", subject[uid], uid, rv))
			}
		}
		return len(problems) == 0
	})
	t.Logf("%s: %d events; the consumer's view differs from the apiserver's in %d objects", fault, len(evs), len(problems))
	if len(problems) > 0 {
		t.Errorf("lost:\n  %s", strings.Join(problems[:min(len(problems), 20)], "\n  "))
	}
}

// checkCachedShare compares what the replicas cache with the objects that
// exist: with the apiserver filtering, each holds about its share (here
// half, at most three quarters); without, each holds them all.
func checkCachedShare(t *testing.T, cp *testenv.ControlPlane, namespaces []string, gate bool, replicas ...*bridgeProc) {
	t.Helper()
	total := 0
	for _, ns := range namespaces {
		list, err := cp.Clientset(t).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		total += len(list.Items)
	}
	for _, r := range replicas {
		cached := scrapeSum(r, "kubebridge_informer_cached_objects")
		t.Logf("a replica caches %d of %d ConfigMaps (gate %v)", cached, total, gate)
		switch {
		case gate && cached > total*3/4:
			t.Errorf("with the apiserver filtering by shard, a replica of two caches %d of %d objects: it lists more than its shards", cached, total)
		case !gate && cached < total*9/10:
			t.Errorf("without the apiserver filtering, a replica caches %d of %d objects; want all", cached, total)
		}
	}
}

func objectRV(e ce) string {
	md, _ := e.Data.Object["metadata"].(map[string]any)
	rv, _ := md["resourceVersion"].(string)
	return rv
}

// waitShardsBalanced waits until the replicas hold every shard between
// them, each its fair share (within one), and all are ready.
func waitShardsBalanced(t *testing.T, what string, replicas ...*bridgeProc) {
	t.Helper()
	lo, hi := testShards/len(replicas), (testShards+len(replicas)-1)/len(replicas)
	var last []string
	ok := testenv.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		last = last[:0]
		total := 0
		balanced := true
		for _, r := range replicas {
			n, ok := scrapeMetric(r, "kubebridge_shards_owned")
			ready := false
			if resp, err := http.Get(r.adminURL() + "/readyz"); err == nil {
				ready = resp.StatusCode == http.StatusOK
				resp.Body.Close()
			}
			last = append(last, fmt.Sprintf("%v (ready %v)", n, ready))
			if !ok || !ready || int(n) < lo || int(n) > hi {
				balanced = false
			}
			total += int(n)
		}
		if !balanced || total != testShards {
			return false
		}
		// Each shard delivered by exactly one replica (its deliverer's
		// per-shard metric), not only the right count of claims.
		holders := map[string]int{}
		for _, r := range replicas {
			for _, shard := range scrapeLabels(r, "kubebridge_shard_pending_events", "shard") {
				holders[shard]++
			}
		}
		if len(holders) != testShards {
			return false
		}
		for _, n := range holders {
			if n != 1 {
				return false
			}
		}
		return true
	})
	if !ok {
		for _, r := range replicas {
			t.Logf("replica log:\n%s", r.runLogTail())
		}
		t.Fatalf("%s: the shards did not settle, one per replica's share: %v", what, last)
	}
	t.Logf("%s: shards held %v", what, last)
}

// scrapeMetric reads one unlabelled sample from a replica's /metrics.
func scrapeMetric(b *bridgeProc, name string) (float64, bool) { return viewMetric(b.adminURL(), name) }

// scrapeSum sums the samples of a metric (any labels) from a replica.
func scrapeSum(b *bridgeProc, name string) int {
	resp, err := http.Get(b.adminURL() + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`(?:\{[^}]*\})? (\S+)$`).FindAllSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		total += v
	}
	return int(total)
}

// scrapeLabels returns the values of label in a metric's samples.
func scrapeLabels(b *bridgeProc, name, label string) []string {
	resp, err := http.Get(b.adminURL() + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`\{`+regexp.QuoteMeta(label)+`="([^"]*)"\}`).FindAllSubmatch(body, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Replicas share 8 shards of the objects, each through its own Lease,
// against an apiserver that filters lists and watches by shard (gate
// ShardedListAndWatch on) and one that does not. Under churn, three
// replicas start; one is SIGKILLed and its shards are delivered again by
// the others once their leases expire; two join (4 live) and two leave
// (2 live): the shards rebalance each time. In the end the stream holds
// every object's final state (nothing lost) and no event id stands for two
// different transitions.
func TestShardedReplicas(t *testing.T) {
	for _, gate := range []bool{true, false} {
		name := "apiserver-filters"
		if !gate {
			name = "client-side-only"
		}
		t.Run(name, func(t *testing.T) { testShardedReplicas(t, gate) })
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
	a, b, c := replica("replica-a"), replica("replica-b"), replica("replica-c")
	l := startLoad(t, cp, namespaces, false)

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
	time.Sleep(500 * time.Millisecond)
	l.stop()

	js := viewJetStream(t, srv)
	verifyAgainstTruth(t, cp, namespaces, l, "3 replicas, a SIGKILL, 3 → 4 → 2", func() []ce { return viewStreamEvents(viewStream(t, js, stream)) })

	// One id, one transition: a message sent again (by the same or by the
	// next owner of its shard) repeats the first one.
	first := map[string]string{}
	conflicts := 0
	for _, m := range viewStream(t, js, stream) {
		what := m.ev.Type + " rv " + objectRV(m.ev)
		if prev, seen := first[m.ev.ID]; seen && prev != what {
			if conflicts++; conflicts <= 10 {
				t.Errorf("id %s stands for %s and for %s", m.ev.ID, prev, what)
			}
		}
		first[m.ev.ID] = what
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
		return balanced && total == testShards
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
func scrapeMetric(b *bridgeProc, name string) (float64, bool) {
	resp, err := http.Get(b.adminURL() + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}

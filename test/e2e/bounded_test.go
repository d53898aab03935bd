package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Memory stays within a sink's capacity plus its live objects, whatever the
// churn, for every events setting: with both sinks down from the start,
// N ConfigMaps created and deleted leave at most about capacity events
// pending in a sink whose rule sends only deletions as in one whose rule
// sends everything (an object created and deleted while its added still
// waited cancels out with its deletion: neither sink held it). Before, the
// deletions-only sink held one deletion per object churned (5,066 at
// capacity 100 for 5,000 objects). When the receivers come back, nothing is
// left pending. KUBEBRIDGE_CHURN_N sets N (default 2,000).
func TestChurnWhileDownIsBoundedForEveryEventsSetting(t *testing.T) {
	t.Parallel()
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("KUBEBRIDGE_CHURN_N")); err == nil && v > 0 {
		n = v
	}
	const capacity = 100
	cp := testenv.SharedControlPlane(t)
	ns := "churn-bounded"
	testenv.EnsureNamespace(t, cp, ns)
	del := &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	all := &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	b := startBridge(t, cp, fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: del
    webhook: {url: "http://%s/", batch: {maxEvents: 50, maxWait: 20ms}}
    queue: {capacity: %d}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: all
    webhook: {url: "http://%s/", batch: {maxEvents: 50, maxWait: 20ms}}
    queue: {capacity: %d}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: deletions
    resource: v1/configmaps
    namespaces: [%s]
    events: [deleted]
    sinks: [del]
  - name: everything
    resource: v1/configmaps
    namespaces: [%s]
    sinks: [all]
`, del.addr, capacity, all.addr, capacity, ns, ns))
	admin := b.adminURL()
	depth := func(sink string) int {
		_, text := get(t, admin+"/metrics")
		m := regexp.MustCompile(`(?m)^kubebridge_sink_queue_depth\{sink="` + sink + `"\} (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no queue depth for %s", sink)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return int(v)
	}

	cs := cp.Clientset(t)
	ctx := context.Background()
	// Slack: the batches that were out when the receivers went away (each
	// sink probes with what it holds, one batch at a time).
	const bound = capacity + 2*50
	peak := map[string]int{}
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				name := fmt.Sprintf("c-%05d", i)
				if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
					t.Error(err)
					continue
				}
				if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for i := range n {
		work <- i
		if i%500 == 499 {
			for _, s := range []string{"del", "all"} {
				peak[s] = max(peak[s], depth(s))
			}
		}
	}
	close(work)
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // the last notifications reach the queues
	for _, s := range []string{"del", "all"} {
		peak[s] = max(peak[s], depth(s))
		if peak[s] > bound {
			t.Errorf("sink %s: %d events pending after %d objects created and deleted while it was down; bound capacity+slack %d", s, peak[s], n, bound)
		}
	}
	t.Logf("%d objects churned: peak pending del=%d all=%d (capacity %d)", n, peak["del"], peak["all"], capacity)

	del.up(t)
	all.up(t)
	t.Cleanup(del.down)
	t.Cleanup(all.down)
	testenv.Await(t, 60*time.Second, 100*time.Millisecond, func() error {
		if d, a := depth("del"), depth("all"); d+a > 0 {
			return fmt.Errorf("still pending after the receivers came back: del=%d all=%d", d, a)
		}
		return nil
	})
	// What arrived is consistent: no added for the deletions-only rule, and
	// the full rule's mirror ends empty (every object is gone).
	for _, e := range del.received() {
		if e.change() != "deleted" {
			t.Errorf("deletions-only rule sent %s", e.change())
		}
	}
	mirror := map[string]bool{}
	for _, e := range all.received() {
		uid := e.ID[:36]
		if e.change() == "deleted" {
			delete(mirror, uid)
		} else {
			mirror[uid] = true
		}
	}
	if len(mirror) != 0 {
		t.Errorf("the full rule's consumer holds %d objects that no longer exist", len(mirror))
	}
}

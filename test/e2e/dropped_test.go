package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// deletionHook records the subjects of the deletions it is sent.
type deletionHook struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string
}

func newDeletionHook(t *testing.T) *deletionHook {
	h := &deletionHook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e ce
		if err := json.Unmarshal(body, &e); err == nil && e.change() == "deleted" {
			h.mu.Lock()
			h.got = append(h.got, e.Subject)
			h.mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *deletionHook) subjects() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Clone(h.got)
	slices.Sort(out)
	return out
}

// A rule that sends only deletions, its webhook down (a wrong URL): the
// deletions wait in the sink's queue. A reload that fixes the URL drops
// that queue after the drain timeout, and a SIGTERM whose drain times out
// drops it too; neither loses a deletion of an object the rule had
// recorded: the fixed sink's reconciliation against the checkpoint sends
// exactly the deletions it had not been handed.
func TestDeletionsOnlyRuleLosesNothingWhenItsQueueIsDropped(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "dropped"
	testenv.EnsureNamespace(t, cp, ns)
	hook := newDeletionHook(t)
	config := func(url string) string {
		return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook: {url: "` + url + `", mode: structured}
    retry: {initialInterval: 100ms, maxInterval: 500ms}
rules:
  - name: dels
    resource: v1/configmaps
    namespaces: [` + ns + `]
    events: [deleted]
    sinks: [hook]
`
	}
	down := "http://127.0.0.1:1/events" // nothing listens: refused
	b := startBridge(t, cp, config(down), withFlags("--drain-timeout", "1s"))
	create := func(names ...string) {
		for _, n := range names {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
			must(t, err)
		}
	}
	del := func(names ...string) {
		for _, n := range names {
			must(t, cs.CoreV1().ConfigMaps(ns).Delete(ctx, n, metav1.DeleteOptions{}))
		}
	}
	subjects := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, ns+"/"+n)
		}
		slices.Sort(out)
		return out
	}
	create("a", "b", "c", "d", "e", "f")
	time.Sleep(1500 * time.Millisecond) // recorded (the checkpoint writes every second)
	del("a", "b", "c")
	testenv.Eventually(t, 10*time.Second, "the deletions failing at the down sink", func() bool { return strings.Contains(b.log(), "the destination fails") })
	time.Sleep(500 * time.Millisecond)

	// A reload that fixes the URL: the old queue is dropped after 1s.
	before := strings.Count(b.log(), "config reloaded")
	must(t, os.WriteFile(b.configPath, []byte(config(hook.srv.URL+"/events")), 0o600))
	testenv.Eventually(t, 30*time.Second, "the reload", func() bool { return strings.Count(b.log(), "config reloaded") > before })
	testenv.Eventually(t, 15*time.Second, "the three deletions at the fixed URL", func() bool { return len(hook.subjects()) >= 3 })
	time.Sleep(time.Second) // a duplicate would show by now
	if got, want := hook.subjects(), subjects("a", "b", "c"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the reload the receiver got deletions %v, want %v", got, want)
	}

	// Down again; two deletions wait; SIGTERM with a 1s drain drops them;
	// the next start, with the URL fixed, sends them.
	before = strings.Count(b.log(), "config reloaded")
	must(t, os.WriteFile(b.configPath, []byte(config(down)), 0o600))
	testenv.Eventually(t, 30*time.Second, "the reload to the down URL", func() bool { return strings.Count(b.log(), "config reloaded") > before })
	create("g")
	time.Sleep(1500 * time.Millisecond)
	del("d", "g")
	time.Sleep(time.Second)
	// The drain times out: the bridge says so and exits 1.
	b.signal(syscall.SIGTERM)
	if exited, _ := b.wait(30 * time.Second); !exited {
		t.Fatalf("no exit within 30s of SIGTERM:\n%s", b.log())
	}
	if !strings.Contains(b.log(), "shutdown deadline reached with 2 events undelivered") {
		t.Fatalf("the drain did not time out with the two deletions queued:\n%s", b.log())
	}
	must(t, os.WriteFile(b.configPath, []byte(config(hook.srv.URL+"/events")), 0o600))
	b.start() // on the same checkpoint
	testenv.Eventually(t, 15*time.Second, "the two deletions after the restart", func() bool { return len(hook.subjects()) >= 5 })
	time.Sleep(time.Second)
	if got, want := hook.subjects(), subjects("a", "b", "c", "d", "g"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the restart the receiver got deletions %v, want %v", got, want)
	}
	b.stop()
}

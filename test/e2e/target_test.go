package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The reproduction through the real bridge and apiserver: a
// request whose path is built from the object's name, a receiver that
// answers 404 for /items/hostile and 204 otherwise. Created first, hostile
// used to stop the sink (0 of 10 others in 45 s, its request the only
// probe, re-sent forever); now it is parked alone and the 10 others
// arrive at once. Once the receiver takes it, hostile is delivered too.
func TestObjectNamedToBeRefusedDoesNotStopTheSink(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	const ns = "targets"
	testenv.EnsureNamespace(t, cp, ns)
	var mu sync.Mutex
	seen, refuse := map[string]int{}, true
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		name := strings.TrimPrefix(r.URL.Path, "/items/")
		mu.Lock()
		defer mu.Unlock()
		seen[name]++
		if name == "hostile" && refuse {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	count := func(name string) int { mu.Lock(); defer mu.Unlock(); return seen[name] }
	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: items
    webhook:
      url: `+hook.URL+`
      request: {method: PUT, path: "'items/' + object.metadata.name"}
rules:
  - {name: items, resource: v1/configmaps, namespaces: [`+ns+`], sinks: [items]}
`)
	create := func(name string) {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(t, err)
	}
	create("hostile")
	testenv.Eventually(t, 30*time.Second, "hostile's request", func() bool { return count("hostile") > 0 })
	for i := range 10 {
		create(fmt.Sprint("item-", i))
	}
	testenv.Eventually(t, 15*time.Second, "the 10 others delivered", func() bool {
		for i := range 10 {
			if count(fmt.Sprint("item-", i)) == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	refuse = false
	mu.Unlock()
	before := count("hostile")
	testenv.Eventually(t, 15*time.Second, "hostile retried and delivered", func() bool { return count("hostile") > before })
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// shapedHook records the requests a templated webhook sink sends.
type shapedHook struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []shapedReq
}

type shapedReq struct {
	method, path, query, rule string
	body                      map[string]any
}

func newShapedHook(t *testing.T) *shapedHook {
	h := &shapedHook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.reqs = append(h.reqs, shapedReq{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("X-Rule"), body})
		h.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *shapedHook) got() []shapedReq {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]shapedReq(nil), h.reqs...)
}

// A webhook sink shaped by CEL, through the real bridge and apiserver:
// each change becomes the request the template says (method, path built
// from the object and escaped, query, header, a JSON body whose values
// come from the object as they are). An object the template cannot render
// (a field it lacks) goes to the dead-letter with the error, alone: the
// others are sent, and once the object has the field its next change is.
func TestShapedWebhookRequests(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "actions"
	testenv.EnsureNamespace(t, cp, ns)
	hook := newShapedHook(t)
	dl := filepath.Join(t.TempDir(), "dead.jsonl")
	b := startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook:
      url: "`+hook.srv.URL+`/api/v1"
      request:
        method: PUT
        path: "'settings/' + object.metadata.name"
        query: {change: "event.change"}
        headers: {X-Rule: "event.rule"}
        body: >-
          {"name": object.metadata.name, "value": dyn(object).data.v, "uid": object.metadata.uid}
    retry: {initialInterval: 100ms, maxInterval: 1s}
    deadLetter: {file: `+dl+`}
rules:
  - name: settings
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [hook]
`)
	_ = b
	create := func(name string, data map[string]string) *corev1.ConfigMap {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{})
		must(t, err)
		return cm
	}
	hostile := `"}, "admin": true, {"x": "` + "\n"
	a := create("a", map[string]string{"v": hostile})
	create("no-v", map[string]string{"other": "1"})
	create("c", map[string]string{"v": "3"})
	testenv.Eventually(t, 30*time.Second, "the two requests that render", func() bool { return len(hook.got()) >= 2 })
	testenv.Eventually(t, 10*time.Second, "the dead-letter record of the one that does not", func() bool {
		data, _ := os.ReadFile(dl)
		return bytes.Contains(data, []byte("no-v"))
	})
	byName := map[string]shapedReq{}
	for _, r := range hook.got() {
		byName[r.body["name"].(string)] = r
	}
	ra := byName["a"]
	if ra.method != http.MethodPut || ra.path != "/api/v1/settings/a" || ra.query != "change=added" || ra.rule != "settings" {
		t.Errorf("request for a: %+v", ra)
	}
	if ra.body["value"] != hostile || ra.body["uid"] != string(a.UID) || len(ra.body) != 3 {
		t.Errorf("body for a: %v", ra.body)
	}
	if _, ok := byName["no-v"]; ok {
		t.Error("the object the template cannot render was sent")
	}
	data, _ := os.ReadFile(dl)
	sc := bufio.NewScanner(bytes.NewReader(data))
	var rec struct {
		Error string `json:"error"`
		Event struct {
			Subject string `json:"subject"`
		} `json:"event"`
	}
	for sc.Scan() {
		must(t, json.Unmarshal(sc.Bytes(), &rec))
	}
	if rec.Event.Subject != ns+"/no-v" || !strings.Contains(rec.Error, "request template") || !strings.Contains(rec.Error, "body") {
		t.Errorf("dead-letter record %s", data)
	}
	// Fixed: its next change renders.
	_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, "no-v", types.MergePatchType, []byte(`{"data":{"v":"now"}}`), metav1.PatchOptions{})
	must(t, err)
	testenv.Eventually(t, 30*time.Second, "the fixed object's update", func() bool {
		for _, r := range hook.got() {
			if r.body["name"] == "no-v" && r.body["value"] == "now" && r.query == "change=updated" {
				return true
			}
		}
		return false
	})
}

// updateWindow through the real bridge and apiserver: ten quick updates
// of a ConfigMap after it was sent become one request with the latest
// value, when the window ends; another object is not held by it; the
// deletion goes at once, not after the window.
func TestUpdateWindowSendsTheLatestStateOnce(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "window"
	const window = 4 * time.Second
	testenv.EnsureNamespace(t, cp, ns)
	hook := newShapedHook(t)
	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook:
      url: "`+hook.srv.URL+`/"
      request:
        body: >-
          {"name": object.metadata.name, "v": dyn(object).?data.?v.orValue(""), "change": event.change}
    updateWindow: `+window.String()+`
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: settings
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [hook]
`)
	seen := func(name, change string) []string {
		var vs []string
		for _, r := range hook.got() {
			if r.body["name"] == name && r.body["change"] == change {
				vs = append(vs, r.body["v"].(string))
			}
		}
		return vs
	}
	_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w"}, Data: map[string]string{"v": "0"}}, metav1.CreateOptions{})
	must(t, err)
	testenv.Eventually(t, 30*time.Second, "w's added", func() bool { return len(seen("w", "added")) == 1 })
	sentAt := time.Now()
	for i := 1; i <= 10; i++ {
		_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, "w", types.MergePatchType, []byte(fmt.Sprintf(`{"data":{"v":"%d"}}`, i)), metav1.PatchOptions{})
		must(t, err)
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Data: map[string]string{"v": "x"}}, metav1.CreateOptions{})
	must(t, err)
	testenv.Eventually(t, 10*time.Second, "x's added, while w waits", func() bool { return len(seen("x", "added")) == 1 })
	if got := seen("w", "updated"); len(got) != 0 && time.Since(sentAt) < window-500*time.Millisecond {
		t.Fatalf("w's updates went out inside the window: %q", got)
	}
	testenv.Eventually(t, window+10*time.Second, "w's latest state after the window", func() bool { return len(seen("w", "updated")) > 0 })
	if got := seen("w", "updated"); len(got) != 1 || got[0] != "10" || time.Since(sentAt) < window-500*time.Millisecond {
		t.Errorf("w's updates: %q after %s; want one, 10, after the %s window", got, time.Since(sentAt), window)
	}
	// w is in its window again: the deletion does not wait for it.
	_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, "w", types.MergePatchType, []byte(`{"data":{"v":"11"}}`), metav1.PatchOptions{})
	must(t, err)
	deletedAt := time.Now()
	must(t, cs.CoreV1().ConfigMaps(ns).Delete(ctx, "w", metav1.DeleteOptions{}))
	testenv.Eventually(t, 10*time.Second, "w's deletion", func() bool { return len(seen("w", "deleted")) == 1 })
	if el := time.Since(deletedAt); el > window/2 {
		t.Errorf("the deletion took %s: it waited for the window", el)
	}
	if got := seen("w", "updated"); len(got) != 1 {
		t.Errorf("w's updates %q: the one before the deletion was sent", got)
	}
}

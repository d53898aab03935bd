package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The shipped config/warning-events-to-slack-and-webhook.yaml (the
// kubernetes-event-exporter setup of docs/migrate-from-event-exporter.md)
// against the real apiserver, Slack receivers that check Slack's schema
// and a webhook that checks its API key: a Warning Event reaches its
// namespace's team channel only (the platform channel without a team),
// naming the Pod's Deployment, and the webhook in the exporter's layout
// with the Pod's labels and owner; a Normal Event reaches nothing; the
// Event recurring (its count bumped) is one more message per window with
// the new count; a namespace relabeled sends its Events to the new team.
func TestEventExporterExample(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const pay, plain = "ee-pay", "ee-plain"
	viewNamespace(t, cs, pay, map[string]string{"team": "payments"})
	viewNamespace(t, cs, plain, nil)
	deploymentChain(t, cs, pay, "web", map[string]string{"team": "payments"}, 1) // Pod web-6d4-a

	slack := map[string]func() []string{}
	replace := map[string]string{
		"/var/lib/kubebridge/dead/events-webhook.jsonl": filepath.Join(t.TempDir(), "dead.jsonl"),
	}
	for i, name := range []string{"slack-payments", "slack-search", "slack-platform"} {
		url, texts := slackReceiver(t)
		slack[name] = texts
		replace[fmt.Sprintf("https://hooks.slack.com/services/T00000000/B0000000%d/XXXXXXXXXXXXXXXXXXXXXXXX", i+1)] = url
	}
	keyDir, err := os.MkdirTemp("", "ee-key-") // under --credential-dirs (the temp dir)
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(keyDir) })
	keyFile := filepath.Join(keyDir, "api-key")
	must(t, os.WriteFile(keyFile, []byte("k-123\n"), 0o600))
	replace["/etc/kubebridge/events-webhook/api-key"] = keyFile
	var mu sync.Mutex
	var docs []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var doc map[string]any
		if r.Header.Get("X-API-Key") != "k-123" || json.Unmarshal(body, &doc) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		docs = append(docs, doc)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	replace["https://events.example.com/k8s"] = hook.URL
	cfg := example(t, "warning-events-to-slack-and-webhook.yaml", replace)
	cfg = strings.ReplaceAll(cfg, "resource: v1/events", "resource: v1/events\n    namespaces: ["+pay+", "+plain+"]")
	cfg = strings.ReplaceAll(cfg, "every: 10m", "every: 2s")
	startBridge(t, cp, cfg)

	newEvent := func(ns, pod, name, typ, reason string) {
		now := metav1.NewTime(time.Now())
		_, err := cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod},
			Type:           typ, Reason: reason, Message: reason + " of " + pod, Count: 1,
			FirstTimestamp: now, LastTimestamp: now, Source: corev1.EventSource{Component: "kubelet"},
		}, metav1.CreateOptions{})
		must(t, err)
	}
	newEvent(pay, "web-6d4-a", "web.backoff", corev1.EventTypeWarning, "BackOff")
	newEvent(pay, "web-6d4-a", "web.pulled", corev1.EventTypeNormal, "Pulled")
	newEvent(plain, "web-1", "web-1.failed", corev1.EventTypeWarning, "FailedMount") // of a Pod that does not exist

	// want: each Slack channel's messages, by a part of their text.
	want := map[string][]string{
		"slack-payments": {"Warning BackOff on Pod " + pay + "/web-6d4-a (Deployment web): BackOff of web-6d4-a"},
		"slack-platform": {"Warning FailedMount on Pod " + plain + "/web-1"},
	}
	expectSlack := func(what string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			for name, texts := range slack {
				got := texts()
				if len(got) != len(want[name]) {
					return fmt.Errorf("%s: %s has %d messages %q, want %d containing %q", what, name, len(got), got, len(want[name]), want[name])
				}
				for i, w := range want[name] {
					if !strings.Contains(got[i], w) {
						return fmt.Errorf("%s: %s message %d is %q, want it to contain %q", what, name, i, got[i], w)
					}
				}
			}
			return nil
		})
	}
	expectSlack("the first Events")
	eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		var reasons []string
		for _, d := range docs {
			reasons = append(reasons, fmt.Sprint(d["reason"]))
			if d["reason"] == "BackOff" && (d["kind"] != "Pod" || d["namespace"] != pay || d["name"] != "web-6d4-a" || d["type"] != "Warning" ||
				d["count"] != float64(1) || d["cluster"] != "prod-eu-1" || d["message"] != "BackOff of web-6d4-a" || d["createdAt"] == "" ||
				d["owner"] != "Deployment/web" || fmt.Sprint(d["labels"]) != "map[app:web]") {
				return fmt.Errorf("the webhook's document is not the exporter's layout with the Pod's labels and owner: %v", d)
			}
			if d["reason"] == "FailedMount" && d["owner"] != "" {
				return fmt.Errorf("the Event of a Pod that does not exist names an owner: %v", d)
			}
		}
		slices.Sort(reasons)
		if !slices.Equal(reasons, []string{"BackOff", "FailedMount"}) {
			return fmt.Errorf("the webhook got Events %v, want BackOff and FailedMount (no Normal one)", reasons)
		}
		return nil
	})

	// The BackOff recurs: the kubelet's recorder bumps its count.
	for n := int32(2); n <= 5; n++ {
		_, err := cs.CoreV1().Events(pay).Patch(ctx, "web.backoff", types.MergePatchType,
			[]byte(fmt.Sprintf(`{"count":%d,"lastTimestamp":%q}`, n, time.Now().UTC().Format(time.RFC3339))), metav1.PatchOptions{})
		must(t, err)
	}
	// Four recurrences in one window: the first is sent at once, the rest
	// coalesce into one message with the last count when the window ends.
	eventually(t, 30*time.Second, func() error {
		got := slack["slack-payments"]()
		if n := len(got); n < 2 || n > 3 || !strings.Contains(got[n-1], "BackOff of web-6d4-a (5×") {
			return fmt.Errorf("slack-payments has %q; want the BackOff, then at most two updates, the last at 5×", got)
		}
		return nil
	})
	want["slack-payments"] = slack["slack-payments"]()
	eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		var counts []float64
		for _, d := range docs {
			if d["reason"] == "BackOff" {
				counts = append(counts, d["count"].(float64))
			}
		}
		if !slices.Equal(counts, []float64{1, 2, 3, 4, 5}) {
			return fmt.Errorf("the webhook got the BackOff at counts %v, want 1 to 5, each", counts)
		}
		return nil
	})

	// The plain namespace gets a team: its Event goes to that team's channel
	// (leaving the platform's view sends nothing there: the rule sends no
	// deletions).
	_, err = cs.CoreV1().Namespaces().Patch(ctx, plain, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"search"}}}`), metav1.PatchOptions{})
	must(t, err)
	want["slack-search"] = []string{"Warning FailedMount on Pod " + plain + "/web-1"}
	expectSlack("after " + plain + " was labeled team=search")
}

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// slackReceiver is an incoming webhook as api.slack.com/messaging/webhooks
// documents it: a JSON POST whose "text" is a non-empty string (Slack
// truncates past 40,000 characters); anything else is a 400.
func slackReceiver(t *testing.T) (url string, texts func() []string) {
	url, messages := slackReceiverTimed(t)
	return url, func() []string {
		var out []string
		for _, m := range messages() {
			out = append(out, m.text)
		}
		return out
	}
}

// slackMessage is a text a slackReceiver took, and when.
type slackMessage struct {
	at   time.Time
	text string
}

// slackReceiverTimed is slackReceiver that also says when each text came.
func slackReceiverTimed(t *testing.T) (url string, messages func() []slackMessage) {
	var mu sync.Mutex
	var got []slackMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			Text *string `json:"text"`
		}
		if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") ||
			json.Unmarshal(body, &m) != nil || m.Text == nil || *m.Text == "" || len(*m.Text) > 40000 {
			http.Error(w, "invalid_payload", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, slackMessage{at: time.Now(), text: *m.Text})
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []slackMessage { mu.Lock(); defer mu.Unlock(); return append([]slackMessage(nil), got...) }
}

// The shipped example config/deployment-image-to-slack.yaml against the
// real apiserver and a receiver that checks Slack's schema: an image
// change names the container and the old and new image; an env change
// and reordering the containers send nothing; an image changed while the
// bridge was stopped is reported as a change it cannot tell the old side
// of, never as a made-up one.
func TestSlackExampleSaysWhichContainerChangedImage(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "slack-images"
	testenv.EnsureNamespace(t, cp, ns)
	url, texts := slackReceiver(t)
	cfg := example(t, "deployment-image-to-slack.yaml", map[string]string{
		"https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX": url,
		"/var/lib/kubebridge/dead/slack.jsonl":                                          filepath.Join(t.TempDir(), "dead.jsonl"),
		"resource: apps/v1/deployments":                                                 "resource: apps/v1/deployments\n    namespaces: [" + ns + "]",
	})
	b := startBridge(t, cp, cfg)

	labels := map[string]string{"app": "web"}
	_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: "web", Image: "nginx:1.27", Env: []corev1.EnvVar{{Name: "MODE", Value: "a"}}},
					{Name: "proxy", Image: "envoy:1.30"}}}}}}, metav1.CreateOptions{})
	must(t, err)
	update := func(f func(*corev1.PodSpec)) {
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		must(t, err)
		f(&d.Spec.Template.Spec)
		_, err = cs.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{})
		must(t, err)
	}
	// Not image changes: an env var, the containers reordered.
	update(func(s *corev1.PodSpec) { s.Containers[0].Env[0].Value = "b" })
	update(func(s *corev1.PodSpec) { s.Containers[0], s.Containers[1] = s.Containers[1], s.Containers[0] })
	// The image change. Per-object order: had the others sent anything,
	// it would have come first.
	update(func(s *corev1.PodSpec) { s.Containers[1].Image = "nginx:1.28" })
	testenv.Eventually(t, 30*time.Second, "the image change's message", func() bool { return len(texts()) > 0 })
	want := ":rocket: " + ns + "/web (cluster prod-eu-1)\n• container web: nginx:1.27 → nginx:1.28"
	if got := texts(); got[0] != want {
		t.Fatalf("first message %q, want %q (all: %q)", got[0], want, got)
	}

	// Changed while the bridge is stopped: the start finds the update
	// without the previous state and says so.
	time.Sleep(1500 * time.Millisecond) // acknowledged and in the checkpoint
	b.stop()
	update(func(s *corev1.PodSpec) { s.Containers[0].Image = "envoy:1.31" })
	b.start()
	testenv.Eventually(t, 30*time.Second, "the message for the change made while stopped", func() bool { return len(texts()) > 1 })
	got := texts()
	if len(got) != 2 || !strings.Contains(got[1], "what changed cannot be told") || strings.Contains(got[1], "→") {
		t.Fatalf("after the restart %q", got)
	}
	b.stop()
}

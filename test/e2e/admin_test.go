package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	must(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metric returns the value of one sample in Prometheus text format.
func metric(t *testing.T, text, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("metric %s missing", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	must(t, err)
	return v
}

// /healthz, /readyz and /metrics during a run: the counters agree with what
// the sink received; `bridge replay` re-sends the view through /replay.
func TestAdminMetricsAndReplay(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "admin")
	out := filepath.Join(t.TempDir(), "events.jsonl")
	b := startBridge(t, cp, fileConfig(out, rule("cms", "v1/configmaps", "admin")))
	admin := b.adminURL(t)
	if code, _ := get(t, admin+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, _ := get(t, admin+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d", code)
	}
	cs := cp.Clientset(t)
	for _, name := range []string{"a", "b", "c"} {
		_, err := cs.CoreV1().ConfigMaps("admin").Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(t, err)
	}
	evs := waitEvents(t, out, "three events", func(evs []ce) bool { return len(evs) == 3 })
	var text string
	for i := 0; i < 50; i++ { // the acknowledgement is counted right after the write
		_, text = get(t, admin+"/metrics")
		if metric(t, text, `kubebridge_sink_delivered_total{sink="out"}`) == float64(len(evs)) {
			break
		}
	}
	for name, want := range map[string]float64{
		`kubebridge_sink_delivered_total{sink="out"}`:           3,
		`kubebridge_sink_enqueued_total{sink="out"}`:            3,
		`kubebridge_sink_failed_total{sink="out"}`:              0,
		`kubebridge_sink_queue_depth{sink="out"}`:               0,
		`kubebridge_sink_queue_capacity{sink="out"}`:            10000,
		`kubebridge_delivery_latency_seconds_count{sink="out"}`: 3,
		`kubebridge_informers_synced`:                           1,
		`kubebridge_rule_matched_total{rule="cms"}`:             3,
		`kubebridge_leader`:                                     1,
	} {
		if got := metric(t, text, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	cmd := exec.Command(bridgeBin, "replay", "--admin", admin, "--sink", "out")
	outBytes, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^replay to sink out: 3 events queued$`).Match(outBytes) {
		t.Fatalf("bridge replay: %v\n%s", err, outBytes)
	}
	evs = waitEvents(t, out, "the replay", func(evs []ce) bool { return len(evs) == 6 })
	for _, e := range evs[3:] {
		if e.Replay != "resync" || e.change() != "updated" {
			t.Errorf("replayed event %s", e.raw)
		}
	}
	if r, _ := exec.Command(bridgeBin, "replay", "--admin", admin, "--sink", "nope").CombinedOutput(); !regexp.MustCompile(`404 Not Found: no running sink "nope"`).Match(r) {
		t.Errorf("unknown sink: %s", r)
	}
}

// Standalone `bridge replay --config` delivers the view to one sink and
// exits with the count, without a running bridge.
func TestStandaloneReplay(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "standalone")
	cs := cp.Clientset(t)
	for _, name := range []string{"a", "b"} {
		_, err := cs.CoreV1().ConfigMaps("standalone").Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(t, err)
	}
	dir := t.TempDir()
	out, other := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "other.jsonl")
	cfg := filepath.Join(dir, "c.yaml")
	must(t, writeFile(cfg, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: out
    file: {path: `+out+`}
  - name: other
    file: {path: `+other+`}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [standalone]
    sinks: [out, other]
`))
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	res, err := exec.Command(bridgeBin, "replay", "--config", cfg, "--kubeconfig", kc, "--sink", "out").CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^replay to sink out: 2 events delivered$`).Match(res) {
		t.Fatalf("replay: %v\n%s", err, res)
	}
	evs := readEvents(t, out)
	if len(evs) != 2 || evs[0].Replay != "resync" || evs[1].Replay != "resync" {
		t.Errorf("out got %d events: %v", len(evs), evs)
	}
	if len(readEvents(t, other)) != 0 {
		t.Error("another sink got the replay")
	}
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }

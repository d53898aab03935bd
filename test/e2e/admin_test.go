package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "admin")
	out := filepath.Join(t.TempDir(), "events.jsonl")
	b := startBridge(t, cp, fileConfig(out, rule("cms", "v1/configmaps", "admin")))
	admin := b.adminURL()
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
	poll(10*time.Second, func() bool { // the acknowledgement is counted right after the write
		_, text = get(t, admin+"/metrics")
		return metric(t, text, `kubebridge_sink_delivered_total{sink="out"}`) == float64(len(evs))
	})
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

	// /replay re-sends a sink its whole view: only callers the cluster
	// allows to create replays.kubebridge.io in the bridge's namespace may.
	replay := func(token string, sink string) (string, int) {
		return runBridgeCommandEnv(t, []string{"KUBEBRIDGE_TOKEN=" + token}, "replay", "--admin", admin, "--sink", sink)
	}
	if out, code := replay("", "out"); code == 0 || !strings.Contains(out, "401 Unauthorized: a bearer token is required") {
		t.Errorf("no token: exit status %d\n%s", code, out)
	}
	if out, code := replay("not-a-token", "out"); code == 0 || !strings.Contains(out, "401 Unauthorized: the token is not valid") {
		t.Errorf("bad token: exit status %d\n%s", code, out)
	}
	if out, code := replay(saToken(t, cp, "nobody", false), "out"); code == 0 ||
		!strings.Contains(out, `403 Forbidden: system:serviceaccount:default:nobody may not create replays.kubebridge.io "out" in namespace "default"`) {
		t.Errorf("token without the permission: exit status %d\n%s", code, out)
	}
	replayer := saToken(t, cp, "replayer", true)
	outText, code := replay(replayer, "out")
	if code != 0 || !regexp.MustCompile(`(?m)^replay to sink out: 3 events queued$`).MatchString(outText) {
		t.Fatalf("bridge replay: exit status %d\n%s", code, outText)
	}
	if !strings.Contains(b.log(), "replay requested") || !strings.Contains(b.log(), "user=system:serviceaccount:default:replayer") {
		t.Errorf("the replay and its caller are not logged:\n%s", b.log())
	}
	evs = waitEvents(t, out, "the replay", func(evs []ce) bool { return len(evs) == 6 })
	for _, e := range evs[3:] {
		if e.Replay != "resync" || e.change() != "updated" {
			t.Errorf("replayed event %s", e.raw)
		}
	}
	if r, _ := replay(replayer, "nope"); !strings.Contains(r, `404 Not Found: no running sink "nope"`) {
		t.Errorf("unknown sink: %s", r)
	}
}

// saToken returns a token of service account name in namespace default,
// created with a Role that lets it create replays.kubebridge.io when
// mayReplay.
func saToken(t *testing.T, cp *testenv.ControlPlane, name string, mayReplay bool) string {
	t.Helper()
	ctx := context.Background()
	cs := cp.Clientset(t)
	_, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if mayReplay {
		_, err := cs.RbacV1().Roles("default").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubebridge.io"}, Resources: []string{"replays"}, Verbs: []string{"create"}}}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		_, err = cs.RbacV1().RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: "default"}}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	exp := int64(600)
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// Standalone `bridge replay --config` delivers the view to one sink and
// exits with the count, without a running bridge; of a routing rule, the
// objects routed to that sink only (nothing sent of the others).
func TestStandaloneReplay(t *testing.T) {
	t.Parallel()
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
  - name: routed
    resource: v1/configmaps
    namespaces: [standalone]
    sinks: [out, other]
    route: {sink: "object.metadata.name == 'a' ? 'out' : 'other'", default: other}
`))
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	res, code := runBridgeCommand(t, "replay", "--config", cfg, "--kubeconfig", kc, "--sink", "out")
	if code != 0 || !regexp.MustCompile(`(?m)^replay to sink out: 3 events delivered$`).MatchString(res) {
		t.Fatalf("replay: exit status %d\n%s", code, res)
	}
	evs := readEvents(t, out)
	var got []string
	for _, e := range evs {
		got = append(got, e.Rule+" "+e.change()+" "+e.Subject+" "+e.Replay)
	}
	slices.Sort(got)
	if want := []string{"cms updated standalone/a resync", "cms updated standalone/b resync", "routed updated standalone/a resync"}; !slices.Equal(got, want) {
		t.Errorf("out got %q, want %q", got, want)
	}
	if len(readEvents(t, other)) != 0 {
		t.Error("another sink got the replay")
	}
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }

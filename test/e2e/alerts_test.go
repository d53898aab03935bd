package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The shipped example config/failed-pods-to-alertmanager.yaml against a
// real Alertmanager and the real apiserver (its URL, and its resend and
// endsAt periods shortened): a pod that turns Failed fires an alert, which
// stays active past its endsAt while the pod stays Failed (replayEvery
// re-sends it), resolves when the pod leaves the state, and resolves when
// the pod is deleted while the bridge is SIGKILLed (the start's
// reconciliation against the checkpoint sends its deletion).
func TestAlertsResolveThemselves(t *testing.T) {
	am := testenv.StartAlertmanager(t)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "alerts"
	testenv.EnsureNamespace(t, cp, ns)
	root, err := testenv.RepoRoot()
	must(t, err)
	example, err := os.ReadFile(filepath.Join(root, "config", "failed-pods-to-alertmanager.yaml"))
	must(t, err)
	cfg := string(example)
	for old, repl := range map[string]string{
		"http://127.0.0.1:9093": am.URL,
		`duration("5m")`:        `duration("4s")`,
		"replayEvery: 1m":       "replayEvery: 1s",
		"resource: v1/pods":     "resource: v1/pods\n    namespaces: [" + ns + "]",
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("the example no longer has %q", old)
		}
		cfg = strings.Replace(cfg, old, repl, 1)
	}
	state := filepath.Join(t.TempDir(), "state.db")
	b := startBridgeArgs(t, cp, cfg, "--checkpoint-file", state)

	pod := func(name string) {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
		must(t, err)
	}
	phase := func(name string, p corev1.PodPhase, msg string) {
		got, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		must(t, err)
		got.Status.Phase, got.Status.Message = p, msg
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		must(t, err)
	}
	active := func() map[string]testenv.Alert {
		out := map[string]testenv.Alert{}
		for _, a := range am.Active(t) {
			if a.Labels["namespace"] == ns {
				out[a.Labels["pod"]] = a
			}
		}
		return out
	}
	pod("web")
	pod("db")
	phase("web", corev1.PodFailed, "OOMKilled")
	phase("db", corev1.PodRunning, "")
	testenv.Eventually(t, 30*time.Second, "web's alert", func() bool { _, ok := active()["web"]; return ok })
	a := active()["web"]
	if a.Labels["alertname"] != "PodFailed" || a.Labels["cluster"] != "prod-eu-1" || a.Annotations["description"] != "OOMKilled" ||
		a.Annotations["summary"] != "Pod alerts/web failed" || !a.EndsAt.After(a.StartsAt) {
		t.Errorf("alert %+v", a)
	}
	if _, ok := active()["db"]; ok {
		t.Error("a running pod fired")
	}
	// Past its endsAt (4 s) it stays active: re-sent every second.
	time.Sleep(7 * time.Second)
	if _, ok := active()["web"]; !ok {
		t.Fatalf("web's alert expired while the pod is still Failed:\n%s", b.log())
	}
	// The pod leaves the state: resolved.
	phase("web", corev1.PodRunning, "")
	testenv.Eventually(t, 15*time.Second, "web's alert resolved", func() bool { _, ok := active()["web"]; return !ok })

	// Fired, then deleted while the bridge is SIGKILLed: the start
	// resolves it.
	pod("batch")
	phase("batch", corev1.PodFailed, "exit 1")
	testenv.Eventually(t, 30*time.Second, "batch's alert", func() bool { _, ok := active()["batch"]; return ok })
	time.Sleep(1500 * time.Millisecond) // acknowledged and in the checkpoint
	must(t, b.cmd.Process.Signal(syscall.SIGKILL))
	<-b.done
	must(t, cs.CoreV1().Pods(ns).Delete(ctx, "batch", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	b2 := startBridgeArgs(t, cp, cfg, "--checkpoint-file", state)
	testenv.Eventually(t, 30*time.Second, "batch's alert resolved after the restart", func() bool { _, ok := active()["batch"]; return !ok })
	b2.stop(t)
}

// for: a request's when, re-evaluated at every replay, waits out how long
// the object has been in the view (event.entered, checkpointed): the alert
// fires only once the pod stayed Failed that long, and resolves as usual.
func TestAlertFiresOnlyAfterFor(t *testing.T) {
	am := testenv.StartAlertmanager(t)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "alerts-for"
	testenv.EnsureNamespace(t, cp, ns)
	root, err := testenv.RepoRoot()
	must(t, err)
	example, err := os.ReadFile(filepath.Join(root, "config", "failed-pods-to-alertmanager.yaml"))
	must(t, err)
	cfg := strings.NewReplacer(
		"http://127.0.0.1:9093", am.URL,
		"replayEvery: 1m", "replayEvery: 1s",
		"resource: v1/pods", "resource: v1/pods\n    namespaces: ["+ns+"]",
		"      request:\n", "      request:\n        when: \"type == 'deleted' || timestamp(event.time) - timestamp(event.entered) >= duration('4s')\"\n",
	).Replace(string(example))
	b := startBridgeArgs(t, cp, cfg)
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "slow"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	must(t, err)
	p, err := cs.CoreV1().Pods(ns).Get(ctx, "slow", metav1.GetOptions{})
	must(t, err)
	p.Status.Phase = corev1.PodFailed
	_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	must(t, err)
	failedAt := time.Now()
	firing := func() bool {
		for _, a := range am.Active(t) {
			if a.Labels["namespace"] == ns && a.Labels["pod"] == "slow" {
				return true
			}
		}
		return false
	}
	for time.Since(failedAt) < 2*time.Second {
		if firing() {
			t.Fatalf("fired %s after the pod failed, before its 4 s", time.Since(failedAt))
		}
		time.Sleep(100 * time.Millisecond)
	}
	testenv.Eventually(t, 20*time.Second, "the alert once the pod stayed Failed 4 s", firing)
	must(t, cs.CoreV1().Pods(ns).Delete(ctx, "slow", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	testenv.Eventually(t, 15*time.Second, "the alert resolved", func() bool { return !firing() })
	b.stop(t)
}

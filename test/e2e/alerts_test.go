package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
	t.Parallel()
	am := testenv.StartAlertmanager(t)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "alerts"
	testenv.EnsureNamespace(t, cp, ns)
	cfg := example(t, "failed-pods-to-alertmanager.yaml", map[string]string{
		"http://127.0.0.1:9093": am.URL,
		`duration("5m")`:        `duration("4s")`,
		"replayEvery: 1m":       "replayEvery: 1s",
		"resource: v1/pods":     "resource: v1/pods\n    namespaces: [" + ns + "]",
	})
	b := startBridge(t, cp, cfg)

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
	if a.Labels["alertname"] != "PodUnhealthy" || a.Labels["cluster"] != "prod-eu-1" || a.Annotations["description"] != "OOMKilled" ||
		a.Annotations["summary"] != "Pod alerts/web failed" || !a.EndsAt.After(a.StartsAt) {
		t.Errorf("alert %+v", a)
	}
	if _, ok := active()["db"]; ok {
		t.Error("a running pod fired")
	}
	// Past its endsAt (4 s after the last send) it stays active: re-sent
	// every second. Had the re-sends stopped, it would be gone a second
	// past the endsAt it has now.
	time.Sleep(time.Until(a.EndsAt) + time.Second)
	if _, ok := active()["web"]; !ok {
		t.Fatalf("web's alert expired while the pod is still Failed:\n%s", b.log())
	}
	// The pod leaves the state: resolved.
	phase("web", corev1.PodRunning, "")
	testenv.Eventually(t, 15*time.Second, "web's alert resolved", func() bool { _, ok := active()["web"]; return !ok })

	// A container in CrashLoopBackOff (the pod stays Running) fires too,
	// naming the container; it resolves once the container runs.
	pod("crash")
	crash := func(waiting *corev1.ContainerStateWaiting) {
		got, err := cs.CoreV1().Pods(ns).Get(ctx, "crash", metav1.GetOptions{})
		must(t, err)
		st := corev1.ContainerStatus{Name: "c", Image: "busybox", RestartCount: 5, State: corev1.ContainerState{Waiting: waiting}}
		if waiting == nil {
			st.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.Now()}
		}
		got.Status.Phase, got.Status.ContainerStatuses = corev1.PodRunning, []corev1.ContainerStatus{st}
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		must(t, err)
	}
	crash(&corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container=c"})
	testenv.Eventually(t, 30*time.Second, "crash's alert", func() bool { _, ok := active()["crash"]; return ok })
	if a := active()["crash"]; a.Annotations["summary"] != "Pod alerts/crash: container c in CrashLoopBackOff (5 restarts)" ||
		a.Annotations["description"] != "back-off 5m0s restarting failed container=c" || a.Labels["alertname"] != "PodUnhealthy" {
		t.Errorf("crash-looping pod's alert %+v", a)
	}
	crash(nil)
	testenv.Eventually(t, 15*time.Second, "crash's alert resolved", func() bool { _, ok := active()["crash"]; return !ok })

	// Fired, then deleted while the bridge is SIGKILLed: the start
	// resolves it.
	pod("batch")
	phase("batch", corev1.PodFailed, "exit 1")
	testenv.Eventually(t, 30*time.Second, "batch's alert", func() bool { _, ok := active()["batch"]; return ok })
	time.Sleep(1500 * time.Millisecond) // acknowledged and in the checkpoint
	b.kill()
	must(t, cs.CoreV1().Pods(ns).Delete(ctx, "batch", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	b.start() // on the same checkpoint
	testenv.Eventually(t, 30*time.Second, "batch's alert resolved after the restart", func() bool { _, ok := active()["batch"]; return !ok })
	b.stop()
}

// A request's for, asked again at every replay, waits out how long the
// object has been in the view (when it entered is checkpointed): the alert
// fires only once the pod stayed Failed that long, and resolves as usual.
func TestAlertFiresOnlyAfterFor(t *testing.T) {
	t.Parallel()
	am := testenv.StartAlertmanager(t)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "alerts-for"
	testenv.EnsureNamespace(t, cp, ns)
	cfg := example(t, "failed-pods-to-alertmanager.yaml", map[string]string{
		"http://127.0.0.1:9093": am.URL,
		"replayEvery: 1m":       "replayEvery: 1s",
		"resource: v1/pods":     "resource: v1/pods\n    namespaces: [" + ns + "]",
		"      request:\n":      "      request:\n        for: 4s\n",
	})
	b := startBridge(t, cp, cfg, withLogLevel("debug"))
	_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "slow"},
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
	// What was held back is visible: counted apart from what was sent,
	// and logged at debug (without the receiver's URL, its secret).
	_, text := get(t, b.adminURL()+"/metrics")
	if !regexp.MustCompile(`kubebridge_sink_withheld_total\{reason="for",sink="alertmanager"\} [1-9]`).MatchString(text) {
		t.Errorf("the waits of for are not counted:\n%s", grepLines(text, "withheld"))
	}
	requests := grepLines(b.log(), "request ")
	if !strings.Contains(requests, "request withheld") || !strings.Contains(requests, "reason=for") ||
		!strings.Contains(requests, "request sent") || strings.Contains(requests, "127.0.0.1") {
		t.Errorf("debug log lacks the withheld and sent requests, or names the receiver:\n%s", requests)
	}
	must(t, cs.CoreV1().Pods(ns).Delete(ctx, "slow", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	testenv.Eventually(t, 15*time.Second, "the alert resolved", func() bool { return !firing() })
	b.stop()
}

// The time an object entered the view is the object's: a restart (SIGTERM,
// the object changed while the bridge was down) or a reload of the alert
// sink, which load the view from the checkpoint as a shard handover does,
// neither restarts a request's for nor stops a firing alert's re-sends.
// The shipped example against a real Alertmanager (for 4s, endsAt 5s, a
// replay every second), under two rules: the example's, and one that sends
// no updates (its replays must re-send the alert all the same). Each alert
// carries event.entered as an annotation.
func TestAlertKeepsItsClockAcrossRestartsAndReloads(t *testing.T) {
	t.Parallel()
	am := testenv.StartAlertmanager(t)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns, wait = "alerts-clock", 4 * time.Second
	testenv.EnsureNamespace(t, cp, ns)
	cfg := example(t, "failed-pods-to-alertmanager.yaml", map[string]string{
		"http://127.0.0.1:9093":        am.URL,
		`duration("5m")`:               `duration("5s")`,
		"replayEvery: 1m":              "replayEvery: 1s",
		"      request:\n":             "      request:\n        for: 4s\n",
		`"alertname": "PodUnhealthy",`: `"alertname": "PodUnhealthy", "rule": event.rule,`,
		`"description": dyn(object)`:   `"entered": event.entered, "description": dyn(object)`,
		"resource: v1/pods":            "resource: v1/pods\n    namespaces: [" + ns + "]",
		"    include: [object]\n    sinks: [alertmanager]\n": "    include: [object]\n    sinks: [alertmanager]\n" +
			"  - name: failed-pods-adds\n    resource: v1/pods\n    namespaces: [" + ns + "]\n" +
			"    where: \"dyn(object).?status.?phase.orValue('') == 'Failed'\"\n    include: [object]\n    events: [added, deleted]\n    sinks: [alertmanager]\n",
	})
	b := startBridge(t, cp, cfg)
	rules := []string{"unhealthy-pods", "failed-pods-adds"}
	alerts := func() map[string]testenv.Alert { // by rule
		out := map[string]testenv.Alert{}
		for _, a := range am.Active(t) {
			if a.Labels["namespace"] == ns {
				out[a.Labels["rule"]] = a
			}
		}
		return out
	}
	setStatus := func(msg string) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		must(t, err)
		p.Status.Phase, p.Status.Message = corev1.PodFailed, msg
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		must(t, err)
	}
	_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	must(t, err)
	setStatus("OOMKilled")
	failedAt := time.Now()

	// Restarted during the wait, the pod changed meanwhile: the alert fires
	// once the pod has been Failed for 4 s, not 4 s after the restart.
	time.Sleep(1500 * time.Millisecond)
	b.stop()
	setStatus("OOMKilled again")
	restartedAt := time.Now()
	b.start()
	testenv.Eventually(t, 20*time.Second, "both rules' alerts", func() bool { return len(alerts()) == len(rules) })
	firedAt := time.Now()
	if firedAt.Before(failedAt.Add(wait)) || !firedAt.Before(restartedAt.Add(wait)) {
		t.Errorf("fired %s after the pod failed, %s after the restart; want its for (%s) counted from the failure",
			firedAt.Sub(failedAt).Round(time.Millisecond), firedAt.Sub(restartedAt).Round(time.Millisecond), wait)
	}
	first := alerts()
	for _, r := range rules {
		entered, err := time.Parse(time.RFC3339Nano, first[r].Annotations["entered"])
		if err != nil || entered.Sub(failedAt).Abs() > time.Second {
			t.Errorf("rule %s: event.entered %q (%v), want when the pod failed, %s", r, first[r].Annotations["entered"], err, failedAt.Format(time.RFC3339Nano))
		}
	}

	// steady checks, until, that both alerts stay active with the startsAt
	// and event.entered they had: nothing expires, nothing fires anew.
	steady := func(what string, until time.Time) {
		t.Helper()
		for time.Now().Before(until) {
			now := alerts()
			for _, r := range rules {
				a, ok := now[r]
				switch {
				case !ok:
					t.Fatalf("%s: rule %s's alert is no longer active while the pod is still Failed:\n%s", what, r, b.runLogTail())
				case !a.StartsAt.Equal(first[r].StartsAt) || a.Annotations["entered"] != first[r].Annotations["entered"]:
					t.Fatalf("%s: rule %s's alert fired anew: startsAt %s, entered %s; before: startsAt %s, entered %s", what, r,
						a.StartsAt.Format(time.RFC3339Nano), a.Annotations["entered"], first[r].StartsAt.Format(time.RFC3339Nano), first[r].Annotations["entered"])
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	// Restarted after firing, the pod changed meanwhile: the alert stays.
	b.stop()
	setStatus("OOMKilled a third time")
	b.start()
	steady("after a restart", time.Now().Add(wait+1500*time.Millisecond))

	// The alert sink changes: the reload replaces it, and the new one loads
	// its view from the checkpoint.
	must(t, os.WriteFile(b.configPath, []byte(strings.Replace(cfg, "maxInterval: 30s", "maxInterval: 20s", 1)), 0o600))
	testenv.Eventually(t, 30*time.Second, "the reload", func() bool { return strings.Contains(b.log(), "config reloaded") })
	steady("after a reload of the alert sink", time.Now().Add(wait+1500*time.Millisecond))

	must(t, cs.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	testenv.Eventually(t, 15*time.Second, "the alerts resolved", func() bool { return len(alerts()) == 0 })
	b.stop()
}

// The shipped example config/deployment-unavailable-to-pagerduty.yaml
// (its URL, key file and periods shortened) through the real bridge and
// apiserver, against a receiver that checks PagerDuty's Events API v2
// schema and keeps the open incidents by dedup_key: a Deployment with
// unavailable replicas triggers only once it stayed so for its "for", with
// the routing key read from its file; one that recovers sooner never
// triggers; the incident resolves when the Deployment recovers.
func TestPagerDutyExample(t *testing.T) {
	t.Parallel()
	in, srv := testenv.ServeIncidents(t, http.StatusAccepted, testenv.PagerDutyEvent)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "pagerduty"
	testenv.EnsureNamespace(t, cp, ns)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "routing-key")
	must(t, os.WriteFile(keyFile, []byte("R0UTING-KEY-e2e\n"), 0o600))
	cfg := example(t, "deployment-unavailable-to-pagerduty.yaml", map[string]string{
		"https://events.pagerduty.com":             srv.URL,
		"/etc/kubebridge/pagerduty/routing-key":    keyFile,
		"/var/lib/kubebridge/dead/pagerduty.jsonl": filepath.Join(dir, "dead.jsonl"),
		"for: 10m":                      "for: 4s",
		"replayEvery: 1m":               "replayEvery: 1s",
		"resource: apps/v1/deployments": "resource: apps/v1/deployments\n    namespaces: [" + ns + "]",
	})
	b := startBridge(t, cp, cfg)
	deploy := func(name string) *appsv1.Deployment {
		labels := map[string]string{"app": name}
		d, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}, metav1.CreateOptions{})
		must(t, err)
		return d
	}
	unavailable := func(name string, n int32) {
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		must(t, err)
		d.Status.Replicas, d.Status.UnavailableReplicas = 1, n
		_, err = cs.AppsV1().Deployments(ns).UpdateStatus(ctx, d, metav1.UpdateOptions{})
		must(t, err)
	}
	isOpen := func(uid types.UID) bool {
		open, refused, _ := in.State()
		if len(refused) > 0 {
			t.Fatalf("PagerDuty would refuse: %v\n%s", refused, b.log())
		}
		for _, k := range open {
			if strings.HasSuffix(k, "/"+string(uid)) {
				return true
			}
		}
		return false
	}
	api, blip := deploy("api"), deploy("blip")
	unavailable("api", 1)
	unavailable("blip", 1)
	since := time.Now()
	time.Sleep(1500 * time.Millisecond)
	unavailable("blip", 0) // recovers before its 4 s
	for time.Since(since) < 3*time.Second {
		if isOpen(api.UID) {
			t.Fatalf("triggered %s after the replicas went unavailable, before its 4 s", time.Since(since))
		}
		time.Sleep(100 * time.Millisecond)
	}
	testenv.Eventually(t, 20*time.Second, "api's incident once it stayed unavailable 4 s", func() bool { return isOpen(api.UID) })
	if isOpen(blip.UID) {
		t.Error("blip recovered before its 4 s and still triggered")
	}
	if _, _, keys := in.State(); keys[len(keys)-1] != "R0UTING-KEY-e2e" {
		t.Errorf("routing key %q", keys[len(keys)-1])
	}
	if strings.Contains(b.log(), "R0UTING-KEY") {
		t.Error("the routing key is in the bridge's log")
	}
	unavailable("api", 0)
	testenv.Eventually(t, 15*time.Second, "api's incident resolved", func() bool { return !isOpen(api.UID) })
	b.stop()
}

// example is the shipped config/<name> with each key of replace replaced
// once by its value (a URL, a shorter period): the test fails when the
// example no longer has one, so the tests follow the examples.
func example(t *testing.T, name string, replace map[string]string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	must(t, err)
	data, err := os.ReadFile(filepath.Join(root, "config", name))
	must(t, err)
	cfg := string(data)
	for old, repl := range replace {
		if !strings.Contains(cfg, old) {
			t.Fatalf("config/%s no longer has %q", name, old)
		}
		cfg = strings.Replace(cfg, old, repl, 1)
	}
	return cfg
}

// grepLines is the lines of text that contain substr.
func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

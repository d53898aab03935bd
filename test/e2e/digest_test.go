package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A digest and a mute window against the real apiserver, each posting to
// a receiver that checks Slack's schema. The digest sends one message per
// period listing exactly what entered and left the view and what changed
// in it (an object created and deleted within the period is not in it);
// after a SIGKILL and a restart it repeats none. The muted sink sends
// nothing during its window, shows what it holds in its metrics, holds
// again what a SIGKILL lost (the view's pending work, recomputed at the
// start; a reload that rebuilds the sink too), and when the window ends
// sends what is still true: the objects created and deleted within the
// window send nothing.
func TestDigestAndMuteOnSlack(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "digest-mute"
	testenv.EnsureNamespace(t, cp, ns)
	digestURL, digests := slackReceiver(t)
	mutedURL, muted := slackReceiver(t)

	const every = 4 * time.Second
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	windowEnd := time.Now().Add(55 * time.Second)
	from, to := time.Now().Add(-time.Minute).In(berlin).Format("15:04:05"), windowEnd.In(berlin).Format("15:04:05")
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: digest
    webhook: {url: %q, preset: slack}
    digest: {every: %s, groupBy: object.metadata.namespace}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: muted
    webhook: {url: %q, preset: slack}
    mute: {windows: [{from: %q, to: %q, timeZone: Europe/Berlin}]}
    retry: {initialInterval: 100ms, maxInterval: %s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [%s]
    labelSelector: e2e=digest
    sinks: [digest, muted]
`
	config := func(maxInterval string) string {
		return fmt.Sprintf(cfg, digestURL, every, mutedURL, from, to, maxInterval, ns)
	}
	cms := cs.CoreV1().ConfigMaps(ns)
	must(t, cms.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "e2e=digest"})) // a run before
	b := startBridge(t, cp, config("1s"), withRestartFlags(), withKillAtEnd())

	create := func(name, v string) {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"e2e": "digest"}},
			Data: map[string]string{"k": v}}, metav1.CreateOptions{})
		must(t, err)
	}
	del := func(name string) { must(t, cms.Delete(ctx, name, metav1.DeleteOptions{})) }

	create("keep", "1")
	create("gone", "1")
	testenv.Eventually(t, 30*time.Second, "the first digest", func() bool { return len(digests()) > 0 })
	first := strings.Split(digests()[0], "\n")
	slices.Sort(first[1:]) // the two entered together: their order is the queue's
	if want := []string{"kubebridge digest for " + ns + " (cluster e2e, 4s): 2 entered, 0 changed, 0 left",
		"• added ConfigMap " + ns + "/gone", "• added ConfigMap " + ns + "/keep"}; !slices.Equal(first, want) || len(digests()) != 1 {
		t.Fatalf("first digest %q, want %q", digests(), want)
	}

	// The next period: one left, one changed, one entered, one came and went.
	del("gone")
	cm, err := cms.Get(ctx, "keep", metav1.GetOptions{})
	must(t, err)
	cm.Data["k"] = "2"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	must(t, err)
	create("new", "1")
	create("blip", "1")
	del("blip")
	testenv.Eventually(t, 30*time.Second, "the second digest", func() bool { return len(digests()) > 1 })
	second := "kubebridge digest for " + ns + " (cluster e2e, 4s): 1 entered, 1 changed, 1 left\n" +
		"• added ConfigMap " + ns + "/new\n• updated ConfigMap " + ns + "/keep: data.k: 1 → 2\n• deleted ConfigMap " + ns + "/gone"
	if got := digests(); len(got) != 2 || got[1] != second {
		t.Fatalf("second digest %q\nwant %q", got[1:], second)
	}
	if got := muted(); len(got) != 0 {
		t.Fatalf("the muted sink sent during its window: %q", got)
	}
	_, text := get(t, b.adminURL()+"/metrics")
	if !regexp.MustCompile(`kubebridge_sink_held_events\{sink="muted"\} 2\n`).MatchString(text) ||
		!regexp.MustCompile(`kubebridge_sink_withheld_total\{reason="mute",sink="muted"\} [1-9]`).MatchString(text) {
		t.Errorf("the metrics do not show what the mute holds:\n%s", grepLines(text, "kubebridge_sink_"))
	}

	// SIGKILL: the digests sent are acknowledged (the checkpoint is written
	// every second), what the mute held is recomputed at the start.
	time.Sleep(1500 * time.Millisecond)
	b.kill()
	b.start()
	if time.Now().After(windowEnd.Add(-5 * time.Second)) {
		t.Fatalf("the window ended before the restart could be checked in it (a slow machine): rerun")
	}
	time.Sleep(every + time.Second)
	if got := digests(); len(got) != 2 {
		t.Errorf("after the restart the digest sink sent again: %q", got[2:])
	}
	if got := muted(); len(got) != 0 {
		t.Fatalf("the muted sink sent during its window after the restart: %q", got)
	}

	// A reload that rebuilds the muted sink (its config changed): the new
	// one recomputes what is held from the checkpoint, as a start does.
	before := strings.Count(b.log(), "config reloaded")
	must(t, os.WriteFile(b.configPath, []byte(config("2s")), 0o600))
	testenv.Eventually(t, 30*time.Second, "the reload", func() bool { return strings.Count(b.log(), "config reloaded") > before })
	if time.Now().After(windowEnd.Add(-3 * time.Second)) {
		t.Fatalf("the window ended before the reload could be checked in it (a slow machine): rerun")
	}
	time.Sleep(time.Second)
	if got := muted(); len(got) != 0 {
		t.Fatalf("the muted sink sent during its window after the reload: %q", got)
	}

	testenv.Eventually(t, time.Until(windowEnd)+30*time.Second, "the muted sink's messages once the window ended", func() bool { return len(muted()) >= 2 })
	time.Sleep(time.Second)
	got := muted()
	slices.Sort(got)
	wantMuted := []string{"added ConfigMap " + ns + "/keep (rule cms, cluster e2e)", "added ConfigMap " + ns + "/new (rule cms, cluster e2e)"}
	if !slices.Equal(got, wantMuted) {
		t.Errorf("after the window %q, want %q (what is still true: gone and blip came and went)", got, wantMuted)
	}
	if time.Now().Before(windowEnd) {
		t.Errorf("sent before the window ended (%s)", windowEnd)
	}
}

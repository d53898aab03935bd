package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A shard handed over to another replica keeps its objects' clocks: the new
// owner loads the shard's view from the NATS KV checkpoint, and a pod that
// entered the view before keeps that time (event.entered, the for counted
// from it), while its firing alert stays active in a real Alertmanager with
// its startsAt through a handover that follows. Against a real Alertmanager
// (for 8s, endsAt 4s, a replay every second): the pod's shard is taken
// over from a SIGKILLed replica while the pod waits out its for, the pod
// changed meanwhile (the new owner's first sync finds it changed); once it
// fires, the shard moves again as replicas join and leave.
func TestAlertKeepsItsClockAcrossShardHandovers(t *testing.T) {
	t.Parallel()
	am := testenv.StartAlertmanager(t)
	srv := testenv.StartNATS(t)
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns, wait = "alerts-handover", 8 * time.Second
	testenv.EnsureNamespace(t, cp, ns)
	cfg := example(t, "failed-pods-to-alertmanager.yaml", map[string]string{
		"http://127.0.0.1:9093":      am.URL,
		`duration("5m")`:             `duration("4s")`,
		"replayEvery: 1m":            "replayEvery: 1s",
		"      request:\n":           "      request:\n        for: 8s\n",
		`"description": dyn(object)`: `"entered": event.entered, "description": dyn(object)`,
		"resource: v1/pods":          "resource: v1/pods\n    namespaces: [" + ns + "]",
		"\nsinks:\n": "\ncheckpoint: {natsKV: {sink: bus, bucket: kb-alert-shards}}\nsharding: {shards: " + strconv.Itoa(testShards) + "}\nsinks:\n" +
			"  - name: bus\n    nats: {url: \"" + srv.ClientURL() + "\", jetstream: true, stream: {name: KBALERTS}}\n",
	})
	replica := func(name string) *bridgeProc {
		return startBridge(t, cp, cfg, withConfigCheckpoint(), withLogLevel("info"), withShortLease(), withKillAtEnd(),
			withFlags("--leader-elect-namespace", "default", "--leader-elect-name", "kb-alert-shards", "--identity", name),
			withReadyLog("bridge started; sharing the shards"))
	}
	alert := func() (testenv.Alert, bool) {
		for _, a := range am.Active(t) {
			if a.Labels["namespace"] == ns {
				return a, true
			}
		}
		return testenv.Alert{}, false
	}
	a, b := replica("replica-a"), replica("replica-b")
	waitShardsBalanced(t, "two replicas", a, b)
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	must(t, err)
	shard := strconv.Itoa(shards.Space{N: testShards, Key: shards.KeyUID}.OfHash(shards.Hash(string(pod.UID))))
	holder, other := a, b
	if !slices.Contains(scrapeLabels(a, "kubebridge_shard_pending_events", "shard"), shard) {
		holder, other = b, a
	}
	setStatus := func(msg string) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		must(t, err)
		p.Status.Phase, p.Status.Message = corev1.PodFailed, msg
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		must(t, err)
	}
	setStatus("OOMKilled")
	failedAt := time.Now()

	// Handed over while it waits: its shard's holder is SIGKILLed, the pod
	// changes, and the other replica takes the shard once its Lease expired.
	time.Sleep(1500 * time.Millisecond)
	holder.kill()
	handedAt := time.Now() // the earliest the other replica can take the shard
	setStatus("OOMKilled again")
	waitShardsBalanced(t, "one replica", other)
	if d := time.Since(failedAt); d >= wait {
		t.Fatalf("the handover ended %s after the pod failed, not within its for (%s): nothing was handed over while it waited", d, wait)
	}
	testenv.Eventually(t, 20*time.Second, "the alert", func() bool { _, ok := alert(); return ok })
	if firedAt := time.Now(); firedAt.Before(failedAt.Add(wait)) || !firedAt.Before(handedAt.Add(wait)) {
		t.Errorf("fired %s after the pod failed, %s after the handover; want its for (%s) counted from the failure",
			firedAt.Sub(failedAt).Round(time.Millisecond), firedAt.Sub(handedAt).Round(time.Millisecond), wait)
	}
	first, _ := alert()
	if entered, err := time.Parse(time.RFC3339Nano, first.Annotations["entered"]); err != nil || entered.Sub(failedAt).Abs() > 500*time.Millisecond {
		t.Errorf("event.entered %q (%v), want when the pod failed, %s", first.Annotations["entered"], err, failedAt.Format(time.RFC3339Nano))
	}

	// Handed over again once firing: the first holder comes back (takes
	// half the shards), the other leaves (SIGTERM). The alert stays active
	// with its startsAt, watched meanwhile and past an endsAt after.
	stop := make(chan struct{})
	watched := make(chan string, 1)
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			got, ok := alert()
			switch {
			case !ok:
				watched <- "the alert is no longer active while the pod is still Failed"
				return
			case !got.StartsAt.Equal(first.StartsAt) || got.Annotations["entered"] != first.Annotations["entered"]:
				watched <- fmt.Sprintf("the alert fired anew: startsAt %s, entered %s; before: startsAt %s, entered %s",
					got.StartsAt.Format(time.RFC3339Nano), got.Annotations["entered"], first.StartsAt.Format(time.RFC3339Nano), first.Annotations["entered"])
				return
			}
		}
	}()
	holder.start()
	waitShardsBalanced(t, "two replicas again", holder, other)
	other.stop()
	setStatus("OOMKilled a third time")
	waitShardsBalanced(t, "the first holder alone", holder)
	time.Sleep(5500 * time.Millisecond)
	close(stop)
	if problem := <-watched; problem != "" {
		t.Fatalf("%s:\n%s", problem, holder.runLogTail())
	}
	holder.stop()
}

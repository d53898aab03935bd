package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// slackLine is the slack preset's line for a Kubernetes Event: "Normal
// ScalingReplicaSet on Deployment ns/web: Scaled up replica set web-x
// from 1 to 2 (3× in 9 s) (rule ..., cluster ...)".
var slackLine = regexp.MustCompile(`^(\w+) (\w+) on (\w+) (\S+): (.*?)(?: \((\d+)× in [^)]*\))? \(rule `)

// A Deployment scaled up and down ten times by the real
// kube-controller-manager, whose controllers write real Events
// (ScalingReplicaSet on the Deployment, SuccessfulCreate and
// SuccessfulDelete on its ReplicaSet: a recurring message is one Event
// whose count grows, distinct ones several Events), into the slack preset
// with a window per involved object and reason: each key sends at most
// one message per window (the first at once), far fewer than the Events'
// changes, and its last message is the latest Event's latest state, with
// its final count. The receiver checks Slack's documented schema.
func TestEventWindowPerKeyWithKubeControllerManager(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t) // its own: kube-controller-manager changes every namespace
	cp.StartControllerManager(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "scaling"
	const window = 3 * time.Second
	testenv.EnsureNamespace(t, cp, ns)

	url, messages := slackReceiverTimed(t)
	startBridge(t, cp, fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: slack
    webhook:
      url: %q
      preset: slack
    updateWindow:
      every: %s
      key: "object.involvedObject.uid + '/' + object.reason"
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: scaling
    resource: v1/events
    namespaces: [%s]
    sinks: [slack]
`, url, window, ns))

	labels := map[string]string{"app": "web"}
	d, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}}},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	settled := func(replicas int32) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, fmt.Sprintf("web at %d replicas", replicas), func() bool {
			got, err := cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
			if err != nil || got.Status.ObservedGeneration < got.Generation || got.Status.Replicas != replicas {
				return false
			}
			pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil && countLive(pods.Items) == int(replicas)
		})
	}
	settled(1)
	scale := func(n int32) {
		t.Helper()
		_, err := cs.AppsV1().Deployments(ns).Patch(ctx, "web", types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)), metav1.PatchOptions{})
		must(t, err)
		settled(n)
	}
	for range 10 {
		scale(2)
		scale(1)
	}

	// The truth: the latest Event of the Deployment's ScalingReplicaSet,
	// a scale down, with the count it ends with.
	var want string
	testenv.Eventually(t, 30*time.Second, "the scale-down Event", func() bool {
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == d.UID && e.Reason == "ScalingReplicaSet" && strings.HasPrefix(e.Message, "Scaled down") {
				want = fmt.Sprintf("%s (count %d)", e.Message, eventCount(e))
				return eventCount(e) >= 10
			}
		}
		return false
	})
	type message struct {
		at           time.Time
		text, detail string
	}
	byKey := func() map[string][]message {
		out := map[string][]message{}
		for _, got := range messages() {
			text := got.text
			m := slackLine.FindStringSubmatch(text)
			if m == nil {
				t.Fatalf("not an Event's line: %q", text)
			}
			count := m[6]
			if count == "" {
				count = "1"
			}
			key := m[3] + " " + m[4] + " " + m[2]
			out[key] = append(out[key], message{at: got.at, text: text, detail: m[5] + " (count " + count + ")"})
		}
		return out
	}
	dkey := "Deployment " + ns + "/web ScalingReplicaSet"
	last := func() string {
		ms := byKey()[dkey]
		if len(ms) == 0 {
			return ""
		}
		return ms[len(ms)-1].detail
	}
	testenv.Eventually(t, 3*window+10*time.Second, "the Deployment's last message: "+want, func() bool { return last() == want })
	time.Sleep(window + time.Second) // nothing more comes: the key's last window ends empty
	if got := last(); got != want {
		t.Errorf("after the last window: the Deployment's last message is %q, want %q", got, want)
	}

	keys := byKey()
	if len(keys) < 3 {
		t.Errorf("messages for %d keys, want at least the Deployment's scaling and its ReplicaSet's creates and deletes: %v", len(keys), keys)
	}
	for key, ms := range keys {
		for i := 1; i < len(ms); i++ {
			if gap := ms[i].at.Sub(ms[i-1].at); gap < window-300*time.Millisecond {
				t.Errorf("%s: two messages %s apart, within the %s window:\n  %s\n  %s", key, gap.Round(time.Millisecond), window, ms[i-1].text, ms[i].text)
			}
		}
	}
	// Twenty scalings (and one to start) bumped the Deployment's two Events
	// twenty-one times: the window folded them into a few messages.
	if n := len(keys[dkey]); n == 0 || n > 10 {
		t.Errorf("%d messages for the Deployment's scaling, want a few (one per window): %v", n, keys[dkey])
	}
	t.Logf("messages per key: %v", func() map[string]int {
		c := map[string]int{}
		for k, ms := range keys {
			c[k] = len(ms)
		}
		return c
	}())
}

// countLive counts the pods not being deleted.
func countLive(pods []corev1.Pod) (n int) {
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

// eventCount is how often a core/v1 Event occurred: its series' count, else
// its count, at least 1 (as the presets count).
func eventCount(e corev1.Event) int32 {
	switch {
	case e.Series != nil && e.Series.Count > 0:
		return e.Series.Count
	case e.Count > 0:
		return e.Count
	}
	return 1
}

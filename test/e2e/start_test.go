package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The initial list streams into the sinks while it arrives, and the
// reconciliation after the sync settles the rest. Whatever the start, the
// sink must get exactly the difference between what it was handed and
// the cluster: a cold start every object once, a warm restart with nothing
// changed no event at all, and a restart after changes exactly those
// changes: deletions (including objects that left a namespace selector's
// view, which the initial list alone must not conclude), updates,
// creations, and nothing else. Every event carries its object's apiVersion
// and kind, the deletions found at a restart too.
func TestStartsDeliverExactlyTheDifference(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns, n = "starts", 600
	testenv.EnsureNamespace(t, cp, ns)
	_, err := cs.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"starts":"yes"}}}`), metav1.PatchOptions{})
	must(t, err)
	for i := range n {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%04d", i), Labels: map[string]string{"in": "yes"}},
			Data: map[string]string{"v": "0"}}, metav1.CreateOptions{})
		must(t, err)
	}
	out := filepath.Join(t.TempDir(), "events.jsonl")
	cfg := fileConfig(out,
		rule("byns", "v1/configmaps", ns),
		"  - name: bysel\n    resource: v1/configmaps\n    namespaceSelector: starts=yes\n    labelSelector: in=yes\n    sinks: [out]\n")
	count := func(evs []ce) map[string]int {
		m := map[string]int{}
		for _, e := range evs {
			c := e.Rule + " " + e.change()
			if e.Reason != "" {
				c += ":" + e.Reason
			}
			m[c]++
		}
		return m
	}
	eqCounts := func(step string, got, want map[string]int) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: events by rule and change = %v, want %v", step, got, want)
		}
	}

	// Cold: every object once per rule, found by the start (kbreplay checkpoint).
	b := startBridge(t, cp, cfg, withRestartFlags())
	evs := waitEvents(t, out, "the initial view", func(evs []ce) bool { return len(evs) >= 2*n })
	time.Sleep(time.Second) // a duplicate from the reconciliation would show by now
	evs = readEvents(t, out)
	eqCounts("cold start", count(evs), map[string]int{"byns added": n, "bysel added": n})
	for _, e := range evs {
		if e.Replay != "checkpoint" {
			t.Fatalf("cold start: %s %s has kbreplay %q, want checkpoint", e.Rule, e.Subject, e.Replay)
		}
	}
	b.stop()

	// Warm, nothing changed: nothing.
	before := len(evs)
	b.start() // on the same checkpoint
	time.Sleep(2 * time.Second)
	if evs = readEvents(t, out); len(evs) != before {
		t.Fatalf("warm restart with nothing changed delivered %d events, first %s %s %s", len(evs)-before, evs[before].Rule, evs[before].change(), evs[before].Subject)
	}
	b.stop()

	// Changed while away: 10 deleted, 10 updated, 10 created, 10 out of
	// bysel's view (label), then restart.
	for i := range 10 {
		must(t, cs.CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprintf("c-%04d", i), metav1.DeleteOptions{}))
		_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, fmt.Sprintf("c-%04d", 100+i), types.MergePatchType, []byte(`{"data":{"v":"1"}}`), metav1.PatchOptions{})
		must(t, err)
		_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("new-%d", i), Labels: map[string]string{"in": "yes"}}}, metav1.CreateOptions{})
		must(t, err)
		_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, fmt.Sprintf("c-%04d", 200+i), types.MergePatchType, []byte(`{"metadata":{"labels":{"in":"no"}}}`), metav1.PatchOptions{})
		must(t, err)
	}
	b.start() // on the same checkpoint
	want := map[string]int{
		"byns deleted": 10, "byns updated": 20, "byns added": 10, // the relabelled ones are updates to byns
		"bysel deleted": 10, "bysel updated": 10, "bysel added": 10, "bysel deleted:unmatched": 10,
	}
	total := 0
	for _, c := range want {
		total += c
	}
	evs = waitEvents(t, out, "the changes made while away", func(evs []ce) bool { return len(evs) >= before+total })
	time.Sleep(time.Second)
	evs = readEvents(t, out)
	eqCounts("restart after changes", count(evs[before:]), want)
	for _, e := range evs[before:] {
		if strings.HasPrefix(e.Subject, ns+"/c-02") && e.Rule == "bysel" && e.Reason != "unmatched" {
			t.Errorf("relabelled %s: bysel sent %s without kbreason unmatched", e.Subject, e.change())
		}
	}
	// Every event says its change in kbchange and carries the object's
	// apiVersion and kind, also a deletion found at the start, which is
	// built from the metadata the checkpoint kept.
	for _, e := range evs {
		if e.Change != e.change() {
			t.Fatalf("%s %s: kbchange %q, type %s", e.Rule, e.Subject, e.Change, e.Type)
		}
		if e.Data.Object["apiVersion"] != "v1" || e.Data.Object["kind"] != "ConfigMap" {
			t.Fatalf("%s %s %s: data.object has apiVersion %v, kind %v; want v1, ConfigMap:\n%s", e.Rule, e.change(), e.Subject, e.Data.Object["apiVersion"], e.Data.Object["kind"], e.raw)
		}
	}
	b.stop()
}

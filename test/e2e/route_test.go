package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
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

// A rule routes each object to its team's sink by a namespace label: an
// object reaches that sink only; a namespace without the label, or with a
// team that has no sink, reaches the default (counted, by reason); when a
// namespace's team label changes, its objects leave one sink's view
// (deleted, kbreason unmatched) and enter the other's (added), and their
// later changes go to the new team only.
func TestRouteByNamespaceLabel(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	namespaces := map[string]map[string]string{
		"rt-pay":    {"team": "payments"},
		"rt-search": {"team": "search"},
		"rt-none":   nil,                   // no team label: the expression fails
		"rt-mkt":    {"team": "marketing"}, // a team without a sink
	}
	for ns, l := range namespaces {
		viewNamespace(t, cs, ns, l)
	}
	recv := map[string]*hookReceiver{}
	var sinks strings.Builder
	for _, name := range []string{"team-payments", "team-search", "ops"} {
		h := &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
		h.up(t)
		t.Cleanup(h.down)
		recv[name] = h
		fmt.Fprintf(&sinks, "  - name: %s\n    webhook: {url: \"http://%s/\", batch: {maxEvents: 10, maxWait: 10ms}}\n    retry: {initialInterval: 100ms, maxInterval: 1s}\n", name, h.addr)
	}
	for ns := range namespaces {
		viewCreateCM(t, cs, ns, "cfg", map[string]string{"v": "1"})
	}
	b := startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
`+sinks.String()+`rules:
  - name: teams
    resource: v1/configmaps
    namespaces: [rt-pay, rt-search, rt-none, rt-mkt]
    sinks: [team-payments, team-search, ops]
    route: {sink: "'team-' + namespaceLabels.team", default: ops}
`)

	// got is what each receiver holds: "subject change[:reason]", in order.
	got := func() map[string][]string {
		out := map[string][]string{}
		for name, h := range recv {
			for _, e := range h.received() {
				c := e.Subject + " " + e.change()
				if e.Reason != "" {
					c += ":" + e.Reason
				}
				out[name] = append(out[name], c)
			}
		}
		return out
	}
	expect := func(what string, want map[string][]string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			g := got()
			for name := range recv {
				if !slices.Equal(g[name], want[name]) {
					return fmt.Errorf("%s: sink %s holds\n  %s\nwant\n  %s", what, name, strings.Join(g[name], "\n  "), strings.Join(want[name], "\n  "))
				}
			}
			return nil
		})
	}
	want := map[string][]string{
		"team-payments": {"rt-pay/cfg added"},
		"team-search":   {"rt-search/cfg added"},
		"ops":           nil, // rt-none and rt-mkt, in either order
	}
	eventually(t, 30*time.Second, func() error {
		ops := got()["ops"]
		slices.Sort(ops)
		if !slices.Equal(ops, []string{"rt-mkt/cfg added", "rt-none/cfg added"}) {
			return fmt.Errorf("ops holds %v; want rt-mkt/cfg and rt-none/cfg added", ops)
		}
		return nil
	})
	want["ops"] = got()["ops"]
	expect("at the start", want)
	for reason, n := range map[string]float64{"undeclared": 1, "failed": 1} {
		metric := `kubebridge_rule_route_defaulted_total{reason="` + reason + `",rule="teams"}`
		if v, ok := viewMetric(b.adminURL(), metric); !ok || v < n {
			t.Errorf("%s = %v (found %v), want at least %v", metric, v, ok, n)
		}
	}

	// The payments namespace moves to search: its object leaves payments'
	// view and enters search's; a change of it then goes to search only.
	_, err := cs.CoreV1().Namespaces().Patch(ctx, "rt-pay", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"search"}}}`), metav1.PatchOptions{})
	must(t, err)
	want["team-payments"] = append(want["team-payments"], "rt-pay/cfg deleted:unmatched")
	want["team-search"] = append(want["team-search"], "rt-pay/cfg added")
	expect("after rt-pay was relabeled team=search", want)
	_, err = cs.CoreV1().ConfigMaps("rt-pay").Patch(ctx, "cfg", types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{})
	must(t, err)
	want["team-search"] = append(want["team-search"], "rt-pay/cfg updated")
	expect("after an update of rt-pay/cfg", want)

	// A namespace whose team gains a sink leaves the default's view.
	_, err = cs.CoreV1().Namespaces().Patch(ctx, "rt-none", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"payments"}}}`), metav1.PatchOptions{})
	must(t, err)
	want["ops"] = append(want["ops"], "rt-none/cfg deleted:unmatched")
	want["team-payments"] = append(want["team-payments"], "rt-none/cfg added")
	expect("after rt-none was labeled team=payments", want)
}

// Routing the real Events kube-controller-manager writes (ScalingReplicaSet,
// SuccessfulCreate) by their namespace's team label: each team's sink holds
// exactly the Events of its namespaces (applied by uid, equal to the
// apiserver's list), the default's none; relabeling a namespace moves its
// Events to the other team's sink, the first keeping none of them.
func TestRouteRealEventsWithKubeControllerManager(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t) // its own: kube-controller-manager changes every namespace
	cp.StartControllerManager(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const pay, search = "rt-kcm-pay", "rt-kcm-search"
	viewNamespace(t, cs, pay, map[string]string{"team": "payments"})
	viewNamespace(t, cs, search, map[string]string{"team": "search"})
	dir := t.TempDir()
	path := func(sink string) string { return filepath.Join(dir, sink+".jsonl") }
	startBridge(t, cp, fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - {name: team-payments, file: {path: %s}}
  - {name: team-search, file: {path: %s}}
  - {name: ops, file: {path: %s}}
rules:
  - name: events
    resource: v1/events
    namespaces: [%s, %s]
    sinks: [team-payments, team-search, ops]
    route: {sink: "'team-' + namespaceLabels.team", default: ops}
`, path("team-payments"), path("team-search"), path("ops"), pay, search))
	for _, ns := range []string{pay, search} {
		sel := map[string]string{"app": "web"}
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}}}}}, metav1.CreateOptions{})
		must(t, err)
	}

	// held applies a sink's events by uid: namespace/name of what it holds.
	held := func(sink string) map[string]bool {
		out := map[string]bool{}
		for _, e := range readEvents(t, path(sink)) {
			md, _ := e.Data.Object["metadata"].(map[string]any)
			uid, _ := md["uid"].(string)
			if e.change() == "deleted" {
				delete(out, uid)
			} else {
				out[uid] = true
			}
		}
		return out
	}
	// truth is the Events of each namespace in the apiserver, by uid, and
	// their reasons.
	truth := func(ns string) (map[string]bool, []string) {
		list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		must(t, err)
		uids := map[string]bool{}
		var reasons []string
		for _, e := range list.Items {
			uids[string(e.UID)] = true
			if !slices.Contains(reasons, e.Reason) {
				reasons = append(reasons, e.Reason)
			}
		}
		slices.Sort(reasons)
		return uids, reasons
	}
	expect := func(what string, want map[string][]string) {
		t.Helper()
		eventually(t, 60*time.Second, func() error {
			for _, sink := range []string{"team-payments", "team-search", "ops"} {
				w := map[string]bool{}
				for _, ns := range want[sink] {
					uids, reasons := truth(ns)
					if !slices.Contains(reasons, "ScalingReplicaSet") || !slices.Contains(reasons, "SuccessfulCreate") {
						return fmt.Errorf("%s: %s has Events %v so far; waiting for ScalingReplicaSet and SuccessfulCreate", what, ns, reasons)
					}
					maps.Copy(w, uids)
				}
				if got := held(sink); !maps.Equal(got, w) {
					return fmt.Errorf("%s: %s holds %d Events, want the %d of %v", what, sink, len(got), len(w), want[sink])
				}
			}
			return nil
		})
	}
	expect("at first", map[string][]string{"team-payments": {pay}, "team-search": {search}})
	_, err := cs.CoreV1().Namespaces().Patch(ctx, pay, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"search"}}}`), metav1.PatchOptions{})
	must(t, err)
	expect("after "+pay+" moved to team search", map[string][]string{"team-search": {pay, search}})
	for _, e := range readEvents(t, path("team-payments")) {
		if e.change() == "deleted" && e.Reason != "unmatched" {
			t.Errorf("team-payments: %s %s left without kbreason unmatched", e.change(), e.Subject)
		}
	}
}

// A rule routes Pods by their Deployment's team label (owners, through
// their ReplicaSet; chains made by hand): relabelling the Deployment moves
// its Pods from one team's sink to the other's (deleted, kbreason
// unmatched; added) at once, the Pods themselves untouched, and a
// ReplicaSet adopted by another Deployment moves its Pods the same way.
func TestRouteByOwnerLabel(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "rt-owners"
	viewNamespace(t, cs, ns, nil)
	recv := map[string]*hookReceiver{}
	var sinks strings.Builder
	for _, name := range []string{"team-payments", "team-search", "ops", "payments-events"} {
		h := &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
		h.up(t)
		t.Cleanup(h.down)
		recv[name] = h
		fmt.Fprintf(&sinks, "  - name: %s\n    webhook: {url: \"http://%s/\", batch: {maxEvents: 10, maxWait: 10ms}}\n    retry: {initialInterval: 100ms, maxInterval: 1s}\n", name, h.addr)
	}
	web, _ := deploymentChain(t, cs, ns, "web", map[string]string{"team": "payments"}, 2)
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "web-6d4-a", metav1.GetOptions{})
	must(t, err)
	now := metav1.Now()
	_, err = cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4-a.backoff"},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID},
		Type:           "Warning", Reason: "BackOff", Message: "Back-off restarting failed container c", Count: 1,
		FirstTimestamp: now, LastTimestamp: now, Source: corev1.EventSource{Component: "kubelet"}}, metav1.CreateOptions{})
	must(t, err)
	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
`+sinks.String()+`rules:
  - name: teams
    resource: v1/pods
    namespaces: [`+ns+`]
    include: [metadata, owners]
    ownerLabels: [team]
    sinks: [team-payments, team-search, ops]
    route: {sink: "'team-' + owners[size(owners) - 1].labels.team", default: ops}
  - name: payments-events
    resource: v1/events
    namespaces: [`+ns+`]
    include: [metadata, owners]
    ownerLabels: [team]
    sinks: [payments-events]
    where: "involved.owners.exists(o, o.labels.?team.orValue('') == 'payments')"
`)
	// got is what each receiver holds: "subject change[:reason]", sorted
	// (the two Pods' events come in either order).
	got := func() map[string][]string {
		out := map[string][]string{}
		for name, h := range recv {
			for _, e := range h.received() {
				c := e.Subject + " " + e.change()
				if e.Reason != "" {
					c += ":" + e.Reason
				}
				out[name] = append(out[name], c)
			}
			slices.Sort(out[name])
		}
		return out
	}
	expect := func(what string, want map[string][]string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			g := got()
			for name := range recv {
				slices.Sort(want[name])
				if !slices.Equal(g[name], want[name]) {
					return fmt.Errorf("%s: sink %s holds\n  %s\nwant\n  %s", what, name, strings.Join(g[name], "\n  "), strings.Join(want[name], "\n  "))
				}
			}
			return nil
		})
	}
	pods := []string{ns + "/web-6d4-a", ns + "/web-6d4-b"}
	each := func(change string) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p+" "+change)
		}
		return out
	}
	want := map[string][]string{"team-payments": each("added"), "payments-events": {ns + "/web-6d4-a.backoff added"}}
	expect("at the start", want)
	podRV := map[string]string{}
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	for _, p := range list.Items {
		podRV[p.Name] = p.ResourceVersion
	}

	// The Deployment moves to search: its Pods leave payments' sink and
	// enter search's, without a change of their own.
	_, err = cs.AppsV1().Deployments(ns).Patch(ctx, web.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"search"}}}`), metav1.PatchOptions{})
	must(t, err)
	want["team-payments"] = append(want["team-payments"], each("deleted:unmatched")...)
	want["team-search"] = each("added")
	want["payments-events"] = append(want["payments-events"], ns+"/web-6d4-a.backoff deleted:unmatched")
	expect("after the Deployment was relabelled team=search", want)

	// A label the rule does not read: nothing moves.
	_, err = cs.AppsV1().Deployments(ns).Patch(ctx, web.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"tier":"web"}}}`), metav1.PatchOptions{})
	must(t, err)

	// The ReplicaSet is adopted by a Deployment of payments: its Pods go back.
	shop, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "payments"}},
		Spec: web.Spec}, metav1.CreateOptions{})
	must(t, err)
	_, err = cs.AppsV1().ReplicaSets(ns).Patch(ctx, "web-6d4", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"apps/v1","kind":"Deployment","name":"shop","uid":%q,"controller":true}]}}`, shop.UID)), metav1.PatchOptions{})
	must(t, err)
	want["team-search"] = append(want["team-search"], each("deleted:unmatched")...)
	want["team-payments"] = append(want["team-payments"], each("added")...)
	want["payments-events"] = append(want["payments-events"], ns+"/web-6d4-a.backoff added")
	expect("after the ReplicaSet was adopted by a Deployment of payments", want)

	list, err = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	for _, p := range list.Items {
		if podRV[p.Name] != p.ResourceVersion {
			t.Errorf("Pod %s changed (resourceVersion %s, was %s): the test meant to move it by its owners alone", p.Name, p.ResourceVersion, podRV[p.Name])
		}
	}
}

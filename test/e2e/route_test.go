package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

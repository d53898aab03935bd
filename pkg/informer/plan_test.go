package informer

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/filters"
)

func TestPlan(t *testing.T) {
	cms := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	nodes := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	deps := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	rule := func(name string, gvr schema.GroupVersionResource) *filters.Rule {
		return &filters.Rule{Name: name, GVR: gvr}
	}
	a, b, c, d, e := rule("a", cms), rule("b", cms), rule("c", deps), rule("d", deps), rule("e", nodes)
	sel := map[*filters.Rule]RuleSelectors{
		a: {Namespaces: []string{"x", "y"}, LabelSelector: "t=1"},
		b: {Namespaces: []string{"y"}, LabelSelector: "t=2", FieldSelector: "metadata.name=n"},
		c: {Namespaces: []string{"x"}, LabelSelector: "t=1", FieldSelector: "status.phase=Up"},
		d: {LabelSelector: "t=1"},
		e: {LabelSelector: "role=edge"},
	}
	plan := Plan([]*filters.Rule{a, b, c, d, e}, sel, map[schema.GroupVersionResource]bool{cms: true, deps: true, nodes: false})
	var got []string
	for _, p := range plan {
		var names []string
		for _, r := range p.Rules {
			names = append(names, r.Name)
		}
		got = append(got, fmt.Sprintf("%s %v", p.Spec, names))
	}
	want := []string{
		"configmaps in x labels t=1 [a]",    // per namespace: every rule names its namespaces
		"configmaps in y [a b]",             // selectors differ: client-side
		"deployments.apps labels t=1 [c d]", // d watches all namespaces; the non-universal field selector stays client-side
		"nodes labels role=edge [e]",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("plan:\n%q\nwant:\n%q", got, want)
	}
}

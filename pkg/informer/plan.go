package informer

import (
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/filters"
)

// Spec identifies one informer.
type Spec struct {
	GVR           schema.GroupVersionResource
	Namespace     string // "" = all namespaces (or a cluster-scoped resource)
	LabelSelector string // sent to the apiserver
	FieldSelector string // sent to the apiserver
}

func (s Spec) String() string {
	var b strings.Builder
	b.WriteString(s.GVR.Resource)
	if s.GVR.Group != "" {
		b.WriteString("." + s.GVR.Group)
	}
	if s.Namespace != "" {
		b.WriteString(" in " + s.Namespace)
	}
	if s.LabelSelector != "" {
		b.WriteString(" labels " + s.LabelSelector)
	}
	if s.FieldSelector != "" {
		b.WriteString(" fields " + s.FieldSelector)
	}
	return b.String()
}

// Watch is one informer to run and the rules it feeds.
type Watch struct {
	Spec  Spec
	Rules []*filters.Rule
	// Absent: the cluster does not serve the resource (yet); the informer
	// starts when Discover finds it.
	Absent bool
}

// RuleSelectors are a rule's selectors as written, for planning.
type RuleSelectors struct {
	Namespaces    []string
	LabelSelector string
	FieldSelector string
}

// Plan groups rules into the informers to watch them through (see the
// package doc). namespaced says whether each resource is namespaced; sel
// gives each rule's selectors.
func Plan(rules []*filters.Rule, sel map[*filters.Rule]RuleSelectors, namespaced map[schema.GroupVersionResource]bool) []Watch {
	byGVR := map[schema.GroupVersionResource][]*filters.Rule{}
	var order []schema.GroupVersionResource
	for _, r := range rules {
		if _, seen := byGVR[r.GVR]; !seen {
			order = append(order, r.GVR)
		}
		byGVR[r.GVR] = append(byGVR[r.GVR], r)
	}
	var out []Watch
	for _, gvr := range order {
		rs := byGVR[gvr]
		perNamespace := namespaced[gvr]
		for _, r := range rs {
			if len(sel[r].Namespaces) == 0 {
				perNamespace = false
			}
		}
		if !perNamespace {
			out = append(out, newWatch(Spec{GVR: gvr}, rs, sel))
			continue
		}
		byNS := map[string][]*filters.Rule{}
		for _, r := range rs {
			for _, ns := range sel[r].Namespaces {
				byNS[ns] = append(byNS[ns], r)
			}
		}
		namespaces := make([]string, 0, len(byNS))
		for ns := range byNS {
			namespaces = append(namespaces, ns)
		}
		sort.Strings(namespaces)
		for _, ns := range namespaces {
			out = append(out, newWatch(Spec{GVR: gvr, Namespace: ns}, byNS[ns], sel))
		}
	}
	return out
}

// newWatch returns the Watch of rs through s, with the server-side selectors
// all of rs share. Field selectors go to the apiserver only when they use
// metadata.name and metadata.namespace, which every resource supports;
// others (status.phase, spec.nodeName, ...) are supported per resource, and
// a list the apiserver refuses would keep the informer from ever syncing,
// so they are evaluated client-side.
func newWatch(s Spec, rs []*filters.Rule, sel map[*filters.Rule]RuleSelectors) Watch {
	s.LabelSelector, s.FieldSelector = sel[rs[0]].LabelSelector, sel[rs[0]].FieldSelector
	for _, r := range rs[1:] {
		if sel[r].LabelSelector != s.LabelSelector {
			s.LabelSelector = ""
		}
		if sel[r].FieldSelector != s.FieldSelector {
			s.FieldSelector = ""
		}
	}
	if !universalFields(s.FieldSelector) {
		s.FieldSelector = ""
	}
	return Watch{Spec: s, Rules: rs}
}

// universalFields reports whether selector uses only fields every resource
// supports (an unparsable one does not).
func universalFields(selector string) bool {
	if selector == "" {
		return true
	}
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return false
	}
	for _, req := range sel.Requirements() {
		if req.Field != "metadata.name" && req.Field != "metadata.namespace" {
			return false
		}
	}
	return true
}

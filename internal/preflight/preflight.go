// Package preflight checks a config against a live cluster before a
// bridge runs it (at the start, at every reload, and in bridge validate
// --cluster): whether each rule's resource is served, fits the rule's
// namespace settings, and may be listed and watched by the identity the
// bridge runs as. Its problems name the config's keys and lines; a
// missing permission is reported as the RBAC rule that would grant it.
package preflight

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/openapi3"
	"k8s.io/kube-openapi/pkg/spec3"

	"github.com/kubebridge/kubebridge/internal/owners"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// watchVerbs are what a shared informer needs: an initial list, then a watch.
var watchVerbs = []string{"list", "watch"}

// Check checks cfg against a live cluster through cs: whether each rule's resource
// exists (discovery, so CRDs count once installed; one that does not is a
// warning: the rule waits for it), that it can be listed and
// watched, that namespace settings fit its scope, and that the current
// identity may list and watch it wherever the rule looks. A missing permission
// is reported as the RBAC rule that would grant it. Problems carry the
// config's lines. The error is for a cluster that cannot be asked at all.
func Check(ctx context.Context, cfg *config.Config, cs kubernetes.Interface) (*ClusterInfo, []config.Problem, error) {
	p := &preflight{cs: cs, cfg: cfg, groups: map[string]*metav1.APIResourceList{}, access: map[authzv1.ResourceAttributes]bool{}, schemas: map[schema.GroupVersion]*spec3.OpenAPI{},
		info: &ClusterInfo{Namespaced: map[schema.GroupVersionResource]bool{}, Kinds: map[schema.GroupVersionResource]string{}, Absent: map[schema.GroupVersionResource]bool{}}}
	if err := p.whoAmI(ctx); err != nil {
		return nil, nil, err
	}
	for i := range cfg.Rules {
		if err := p.checkRule(ctx, i); err != nil {
			return nil, nil, err
		}
		if err := p.checkOwners(ctx, i); err != nil {
			return nil, nil, err
		}
	}
	p.info.Owners = mergeWatches(p.info.Owners)
	return p.info, p.problems, nil
}

// ClusterInfo is what Check learnt about the rules' resources.
type ClusterInfo struct {
	Namespaced map[schema.GroupVersionResource]bool
	// Kinds are the kinds discovery names for the resources: events rebuilt
	// from a checkpoint (a deletion found at a restart) carry them.
	Kinds map[schema.GroupVersionResource]string
	// Absent are the resources the cluster does not serve: their rules
	// wait for them.
	Absent map[schema.GroupVersionResource]bool
	// Owners are the metadata caches the rules that include owners read
	// (internal/owners), each resource once per namespace, or once for all.
	Owners []owners.Watch
}

// Errors are the problems that refuse a config (not the warnings).
func Errors(problems []config.Problem) []config.Problem {
	var out []config.Problem
	for _, p := range problems {
		if !p.Warning {
			out = append(out, p)
		}
	}
	return out
}

type preflight struct {
	cs       kubernetes.Interface
	cfg      *config.Config
	identity string
	groups   map[string]*metav1.APIResourceList // group/version -> resources; nil when absent
	access   map[authzv1.ResourceAttributes]bool
	problems []config.Problem
	info     *ClusterInfo
	openapi  openapi3.Root // made on first use: only rules with changed paths read it
	schemas  map[schema.GroupVersion]*spec3.OpenAPI
}

func (p *preflight) warnf(path, format string, args ...any) {
	p.problems = append(p.problems, config.Problem{Path: path, Line: p.cfg.LineOf(path), Message: fmt.Sprintf(format, args...), Warning: true})
}

func (p *preflight) addf(path, format string, args ...any) {
	p.problems = append(p.problems, config.Problem{Path: path, Line: p.cfg.LineOf(path), Message: fmt.Sprintf(format, args...)})
}

// whoAmI names the identity in messages; clusters without SelfSubjectReview get "the current identity".
func (p *preflight) whoAmI(ctx context.Context) error {
	p.identity = "the current identity"
	r, err := p.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	switch {
	case err == nil && r.Status.UserInfo.Username != "":
		p.identity = fmt.Sprintf("%q", r.Status.UserInfo.Username)
	case err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err):
		return fmt.Errorf("asking the cluster who we are: %w", err)
	}
	return nil
}

func (p *preflight) resources(gv string) (*metav1.APIResourceList, error) {
	if l, ok := p.groups[gv]; ok {
		return l, nil
	}
	l, err := p.cs.Discovery().ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		l, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discovery of %s: %w", gv, err)
	}
	p.groups[gv] = l
	return l, nil
}

func (p *preflight) checkRule(ctx context.Context, i int) error {
	r := p.cfg.Rules[i]
	path := fmt.Sprintf("rules[%d]", i)
	gvr, err := config.ParseResource(r.Resource)
	if err != nil {
		return nil // already reported by Load
	}
	gv := gvr.GroupVersion().String()
	list, err := p.resources(gv)
	if err != nil {
		return err
	}
	if list == nil {
		return p.absent(ctx, i, gvr, fmt.Sprintf("the cluster does not serve %s (is the CRD installed?)", gv))
	}
	var res *metav1.APIResource
	var names []string
	for j := range list.APIResources {
		ar := &list.APIResources[j]
		if strings.Contains(ar.Name, "/") {
			continue // subresource
		}
		names = append(names, ar.Name)
		if ar.Name == gvr.Resource {
			res = ar
		}
	}
	if res == nil {
		slices.Sort(names)
		return p.absent(ctx, i, gvr, fmt.Sprintf("the cluster has no resource %q in %s (have: %s)", gvr.Resource, gv, strings.Join(names, ", ")))
	}
	for _, v := range watchVerbs {
		if !slices.Contains(res.Verbs, v) {
			p.addf(path+".resource", "%s does not support %s, so it cannot be watched", r.Resource, v)
			return nil
		}
	}
	p.info.Namespaced[gvr] = res.Namespaced
	p.info.Kinds[gvr] = res.Kind
	p.checkChanged(i, gvr.GroupVersion().WithKind(res.Kind))
	if !res.Namespaced {
		if len(r.Namespaces) > 0 {
			p.addf(path+".namespaces", "%s is cluster-scoped; namespaces do not apply", r.Resource)
			return nil
		}
		if r.NamespaceSelector != "" {
			p.addf(path+".namespaceSelector", "%s is cluster-scoped; namespaceSelector does not apply", r.Resource)
			return nil
		}
	}
	return p.checkRuleAccess(ctx, i, gvr)
}

// checkRuleAccess checks that the identity may list and watch rule i's
// resource wherever the rule looks, and namespaces when it reads their
// labels (a namespaceSelector, a route).
func (p *preflight) checkRuleAccess(ctx context.Context, i int, gvr schema.GroupVersionResource) error {
	r := p.cfg.Rules[i]
	path := fmt.Sprintf("rules[%d]", i)
	namespaces := r.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	for _, ns := range namespaces {
		if err := p.checkAccess(ctx, path, gvr, ns); err != nil {
			return err
		}
	}
	if r.ReadsNamespaceLabels() {
		at := path + ".namespaceSelector"
		if r.NamespaceSelector == "" {
			at = path + ".route.sink"
		}
		return p.checkAccess(ctx, at, schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, "")
	}
	return nil
}

// absent records that rule i's resource is not served: a state of the
// cluster (a CRD not installed yet, or uninstalled), not a mistake in the
// config, so the rule waits for it while the others run (a warning). What
// the identity may do is still checked: RBAC names resources whether they
// exist or not.
//
// A group without a dot (the core group, apps, batch...) is built in:
// no CRD can add to it (a CRD's group is a domain), so a resource missing
// there is a typo, refused as one.
func (p *preflight) absent(ctx context.Context, i int, gvr schema.GroupVersionResource, msg string) error {
	path := fmt.Sprintf("rules[%d]", i)
	if !strings.Contains(gvr.Group, ".") {
		p.addf(path+".resource", "%s", msg)
		return nil
	}
	p.warnf(path+".resource", "%s; the rule waits for it (the other rules run)", msg)
	p.info.Absent[gvr] = true
	return p.checkRuleAccess(ctx, i, gvr)
}

// checkAccess asks the apiserver whether the identity may list and watch gvr
// in ns ("" = all namespaces), and reports what is missing as an RBAC rule.
func (p *preflight) checkAccess(ctx context.Context, path string, gvr schema.GroupVersionResource, ns string) error {
	return p.checkAccessFor(ctx, path, "", gvr, ns)
}

// checkAccessFor is checkAccess whose message starts with why the access
// is needed.
func (p *preflight) checkAccessFor(ctx context.Context, path, why string, gvr schema.GroupVersionResource, ns string) error {
	var denied []string
	for _, verb := range watchVerbs {
		attrs := authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: gvr.Group, Resource: gvr.Resource}
		allowed, ok := p.access[attrs]
		if !ok {
			review, err := p.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("access review for %s %s: %w", verb, gvr.GroupResource(), err)
			}
			allowed = review.Status.Allowed
			p.access[attrs] = allowed
		}
		if !allowed {
			denied = append(denied, verb)
		}
	}
	if len(denied) == 0 {
		return nil
	}
	rule := fmt.Sprintf(`{apiGroups: [%q], resources: [%q], verbs: [%s]}`, gvr.Group, gvr.Resource, quoteJoin(denied))
	if ns == "" {
		p.addf(path, "%s%s may not %s %s in all namespaces; grant it with a ClusterRole rule %s and a ClusterRoleBinding",
			why, p.identity, strings.Join(denied, " or "), gvr.GroupResource(), rule)
	} else {
		p.addf(path, "%s%s may not %s %s in namespace %q; grant it with a Role rule %s and a RoleBinding in %q",
			why, p.identity, strings.Join(denied, " or "), gvr.GroupResource(), ns, rule, ns)
	}
	return nil
}

func quoteJoin(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// checkOwners finds the resources rule i reads owners from (include
// owners: the built-in owners of its resource and its ownerResources) and
// checks that the identity may list and watch them where the rule looks.
// An ownerResource the cluster does not serve is a warning: its owners are
// named from their references until it is served (after a restart).
func (p *preflight) checkOwners(ctx context.Context, i int) error {
	r := p.cfg.Rules[i]
	if !slices.Contains(r.Include, "owners") {
		return nil
	}
	path := fmt.Sprintf("rules[%d]", i)
	gvr, err := config.ParseResource(r.Resource)
	if err != nil {
		return nil // already reported by Load
	}
	need := owners.Needs(gvr)
	clusterScoped := map[schema.GroupVersionResource]bool{} // ownerResources without namespaces
	for j, res := range r.OwnerResources {
		ogvr, err := config.ParseResource(res)
		if err != nil {
			continue // reported by Load
		}
		rpath := fmt.Sprintf("%s.ownerResources[%d]", path, j)
		list, err := p.resources(ogvr.GroupVersion().String())
		if err != nil {
			return err
		}
		kind := ""
		if list != nil {
			for _, ar := range list.APIResources {
				if ar.Name == ogvr.Resource {
					kind, clusterScoped[ogvr] = ar.Kind, !ar.Namespaced
				}
			}
		}
		if kind == "" {
			p.warnf(rpath, "the cluster does not serve %s: owners of that kind are named from their ownerReferences (without labels) until it is served and the bridge restarts", res)
			continue
		}
		need = append(need, owners.Resource{GVR: ogvr, Kind: kind, Cluster: clusterScoped[ogvr]})
	}
	namespaces := r.Namespaces
	if len(namespaces) == 0 || r.NamespaceSelector != "" {
		namespaces = []string{""}
	}
	for _, res := range need {
		why := fmt.Sprintf("rule %s includes owners, which reads %s objects: ", r.Name, res.Kind)
		scopes := namespaces
		if clusterScoped[res.GVR] {
			// A cluster-scoped owner (a namespaced object's owner may be
			// one) is listed whole, whatever namespaces the rule names.
			scopes = []string{""}
		}
		for _, ns := range scopes {
			if err := p.checkAccessFor(ctx, path+".include", why, res.GVR, ns); err != nil {
				return err
			}
			p.info.Owners = append(p.info.Owners, owners.Watch{Resource: res, Namespace: ns})
		}
	}
	return nil
}

// mergeWatches keeps each resource once per namespace, and only once
// when one watch covers all namespaces.
func mergeWatches(ws []owners.Watch) []owners.Watch {
	all := map[schema.GroupVersionResource]bool{}
	for _, w := range ws {
		if w.Namespace == "" {
			all[w.GVR] = true
		}
	}
	seen := map[owners.Watch]bool{}
	var out []owners.Watch
	for _, w := range ws {
		if seen[w] || w.Namespace != "" && all[w.GVR] {
			continue
		}
		seen[w] = true
		out = append(out, w)
	}
	return out
}

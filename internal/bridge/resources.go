package bridge

import (
	"context"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
)

// Rules whose resource the cluster does not serve: a CRD not installed
// yet, or uninstalled. Such a rule waits (logged, /readyz, the
// kubebridge_rule_waiting metric) while every other rule runs; when the
// resource appears its informer starts and the rule delivers its view;
// when it goes away its objects are gone and their deletions are
// delivered. Either way the rule's view is reconciled from the cache, the
// one level every trigger computes from.

// followResources has informers ask discovery whether their resources are
// served and report changes to resourcesChanged.
func (b *Bridge) followResources(in *informer.Informers) error {
	c, err := b.clients()
	if err != nil {
		return err
	}
	dc := c.Kube.Discovery()
	in.PollEvery = b.opts.ResourcePoll
	in.Discover = func(ctx context.Context, gvr schema.GroupVersionResource) (bool, error) {
		return served(ctx, dc, gvr)
	}
	in.OnChange = b.resourcesChanged
	return nil
}

// served asks discovery whether gvr is served. A group-version that is not
// found is absent; an error (an aggregated API down) is not an answer.
func served(ctx context.Context, dc discovery.DiscoveryInterface, gvr schema.GroupVersionResource) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	list, err := dc.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource }), nil
}

// resourcesChanged reconciles the views of rules whose informer started
// (its resource appeared and was listed) or stopped (its resource went
// away: the empty cache makes every object of the view a deletion).
func (b *Bridge) resourcesChanged(rules []*filters.Rule) {
	n := 0
	b.readingCaches(func() {
		for _, d := range b.deliverers() {
			if d.delivering() { // else the reconciliation when it starts covers this
				n += d.reconcileRules(rules)
			}
		}
	})
	b.logger.Info("rules reconciled after their resource changed", "rules", len(rules), "events", n)
}

// waitingRule is a rule that does not hold its view now, and why.
type waitingRule struct {
	rule string
	err  error
}

// waitingRules lists the rules waiting for their resource, in config order.
func (b *Bridge) waitingRules() []waitingRule {
	rules, in := b.snapshot()
	if in == nil {
		return nil
	}
	waiting := in.Waiting()
	var out []waitingRule
	for _, r := range rules {
		if err := waiting[r]; err != nil {
			out = append(out, waitingRule{rule: r.Name, err: err})
		}
	}
	return out
}

// warn logs the warnings of a config checked against the cluster.
func (b *Bridge) warn(problems []config.Problem) {
	for _, p := range problems {
		if p.Warning {
			b.logger.Warn("config: " + p.Format(""))
		}
	}
}

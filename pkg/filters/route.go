package filters

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// route is a compiled route: the expression that chooses, per object, one
// of the rule's sinks, and the sink of objects it chooses none for.
type route struct {
	prg            cel.Program
	def            string
	readsNamespace bool // the expression reads namespaceLabels
	readsBody      bool // the expression reads more of the object than its metadata
	readsRelated   bool // the expression reads owners or involved
	defaulted      [2]atomic.Uint64
	lastErrLog     atomic.Int64 // unix nanos of the last logged default
}

// RouteReason says why an object went to its route's default sink.
type RouteReason int

const (
	// RouteUndeclared: the expression gave a name that is not one of the
	// rule's sinks.
	RouteUndeclared RouteReason = iota
	// RouteFailed: the expression failed (e.g. a label the namespace does
	// not have) or gave something other than a string.
	RouteFailed
)

// String is the reason's metric label value.
func (r RouteReason) String() string {
	if r == RouteUndeclared {
		return "undeclared"
	}
	return "failed"
}

func compileRoute(rc config.Rule) (*route, error) {
	ast, errs := celsandbox.CompileRoute(rc.Route.Sink)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	env, _ := celsandbox.CELRouteEnv()
	prg, err := env.Program(ast, celsandbox.CELProgramOptions()...)
	if err != nil {
		return nil, err
	}
	return &route{prg: prg, def: rc.Route.Default, readsNamespace: celsandbox.References(ast, celsandbox.CELNamespaceLabels), readsBody: readsBody(ast), readsRelated: readsRelated(ast)}, nil
}

// Routes reports whether the rule sends each object to one of its sinks
// (Route) rather than to all of them.
func (r *Rule) Routes() bool { return r.route != nil }

// RouteNamespaceLabels returns the labels of obj's namespace as its route
// reads them now (nil when the route reads none, or obj is cluster-scoped):
// the part of the route that is not the object's own. known is false for a
// namespace not known yet: like a namespaceSelector, the route then puts
// the object in no sink's view until the namespace's arrival re-evaluates
// it, rather than in the default's for a moment.
func (r *Rule) RouteNamespaceLabels(obj *unstructured.Unstructured) (set labels.Set, known bool) {
	if r.route == nil || !r.route.readsNamespace {
		return nil, true
	}
	ns := obj.GetNamespace()
	if ns == "" {
		return nil, true
	}
	return r.nsLabels(ns)
}

// Route returns the sink the rule sends an object to: the one its route
// names if the rule has it, else the route's default (counted, by reason,
// and logged at most once per rule every 10 seconds, at info: a default is
// a configured outcome, e.g. a namespace without a team, not a fault). seen is what the rule sees of the object (Seen), nsLabels
// its namespace's labels (RouteNamespaceLabels) and rel its owners
// (Related: a route may choose by owners). Only for a rule that Routes.
func (r *Rule) Route(seen *unstructured.Unstructured, nsLabels labels.Set, rel *event.Related) string {
	rt := r.route
	vars := &activation{object: seen.Object, namespaceLabels: map[string]string(nsLabels), related: rel}
	out, _, err := rt.prg.Eval(vars)
	reason := RouteFailed
	if err == nil {
		s, ok := out.(types.String)
		switch {
		case !ok:
			err = fmt.Errorf("route evaluated to %s, not a string", out.Type())
		case slices.Contains(r.Sinks, string(s)):
			return string(s)
		default:
			reason, err = RouteUndeclared, fmt.Errorf("%q is not one of the rule's sinks", string(s))
		}
	}
	rt.defaulted[reason].Add(1)
	now := r.now().UnixNano()
	if last := rt.lastErrLog.Load(); now-last > int64(10*time.Second) && rt.lastErrLog.CompareAndSwap(last, now) {
		r.logger.Info("route names none of the rule's sinks; sent to its default",
			"object", seen.GetNamespace()+"/"+seen.GetName(), "default", rt.def, "error", clip(err.Error(), maxRouteErrorLog))
	}
	return rt.def
}

// maxRouteErrorLog bounds the error logged for a route's default: it may
// quote a name the object chose (an annotation of up to 256 KiB).
const maxRouteErrorLog = 200

// clip cuts s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// RouteDefaulted counts the evaluations of the route that chose its
// default, by reason (zero without a route).
func (r *Rule) RouteDefaulted(reason RouteReason) uint64 {
	if r.route == nil {
		return 0
	}
	return r.route.defaulted[reason].Load()
}

// ReadsNamespaceLabels reports whether what the rule decides depends on
// the labels of its objects' namespaces (a namespaceSelector, a route
// reading namespaceLabels): the bridge then tracks namespaces and
// re-evaluates a namespace's objects when NamespaceChanged.
func (r *Rule) ReadsNamespaceLabels() bool {
	return r.nsSelector != nil || (r.route != nil && r.route.readsNamespace)
}

// NamespaceChanged reports whether a namespace's labels going from before
// to after may change what the rule decides of its objects.
func (r *Rule) NamespaceChanged(before, after labels.Set) bool {
	if r.route != nil && r.route.readsNamespace && !maps.Equal(before, after) {
		return true
	}
	return r.MatchesNamespace(before) != r.MatchesNamespace(after)
}

// readsRelated reports whether a checked expression reads the owners or
// the involved object.
func readsRelated(ast *cel.Ast) bool {
	return celsandbox.References(ast, celsandbox.CELOwners) || celsandbox.References(ast, celsandbox.CELInvolved)
}

// ReadsOwners reports whether what the rule decides of an object (its
// where as a view, its route) depends on the object's owners or involved
// object: the bridge then re-evaluates the objects below an owner when
// OwnerChanged, as it does a namespace's objects.
func (r *Rule) ReadsOwners() bool {
	return r.IncludesOwners() && (r.where != nil && r.whereIsView && r.whereReadsRel || r.route != nil && r.route.readsRelated)
}

// OwnerChanged reports whether an owner's (or involved object's) labels
// going from before to after may change what the rule decides of the
// objects below it: those it reads (ownerLabels; all without) differ.
func (r *Rule) OwnerChanged(before, after labels.Set) bool {
	if !r.ReadsOwners() {
		return false
	}
	if r.ownerLabels == nil {
		return !maps.Equal(before, after)
	}
	for k := range r.ownerLabels {
		b, okb := before[k]
		a, oka := after[k]
		if okb != oka || a != b {
			return true
		}
	}
	return false
}

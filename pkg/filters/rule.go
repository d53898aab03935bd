// Package filters compiles rules into the predicates that decide which
// objects are in a rule's view and which of its transitions are sent
// (internal/view computes the transitions).
//
// A rule is a view: the set of objects that currently match its namespaces,
// namespace selector, label and field selectors, index terms and (when it
// only looks at object) its where expression. An update that makes an
// object enter the view is delivered as added; one that makes it leave, as
// deleted with kbreason "unmatched" (client-go's FilteringResourceEventHandler
// rule), so a consumer mirroring a rule's events holds exactly its view.
// events and changed then choose which of those transitions are delivered;
// a where expression that uses oldObject or type is an event filter, not a
// view predicate, and only drops notifications.
//
// Rules are compiled once, at load; evaluating one allocates little and
// never blocks. A where expression that fails at run time counts as false
// (a view predicate: the object is not in the view; an event filter: the
// event is not sent), counts the error and logs it (at most once per rule
// every 10 seconds).
package filters

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/fieldpath"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// NamespaceLabels looks up a namespace's current labels; ok is false for a
// namespace it does not know.
type NamespaceLabels func(namespace string) (labels.Set, bool)

// Relations resolves what include: [owners] adds to an object of resource
// gvr: its owner chain and, for a Kubernetes Event, its involved object
// (internal/owners). An owner not cached yet is waited for until deadline
// (zero: not at all).
type Relations func(gvr schema.GroupVersionResource, obj *unstructured.Unstructured, deadline time.Time) *event.Related

// OwnersWait is how long the rules stage waits for an owner not cached
// yet, at most, for a live change's state: an owner's watch event normally
// comes before its children's (it was created first); this covers the
// skew. The resolver waits only for a young object, within a budget.
const OwnersWait = time.Second

// Resolution says how Related resolves, and whether it counts, what is not
// cached yet.
type Resolution int

const (
	// Reread is a re-evaluation of a state: the caches as they are, not
	// counted.
	Reread Resolution = iota
	// Notified is the state a notification of a list, a resync or a
	// replay carries: the owners' caches synced before the rules'
	// informers started, so what is missing is not waited for; counted.
	Notified
	// Live is the state a live change carries: what is missing may be
	// waited for (OwnersWait, bounded by the resolver); counted.
	Live
)

// Rule is a compiled rule.
type Rule struct {
	Name  string
	GVR   schema.GroupVersionResource
	Sinks []string
	Event *event.Rule // what events of this rule carry

	namespaces     map[string]bool // nil: all
	nsSelector     labels.Selector // nil: none
	nsLabels       NamespaceLabels
	labelSel       labels.Selector // nil: everything
	fieldSel       fields.Selector // nil: everything
	fieldPaths     map[string][]string
	events         changes // the transitions the rule delivers
	index          []indexTerm
	where          cel.Program
	whereIsView    bool
	whereReadsBody bool // where reads more of object or oldObject than apiVersion, kind and metadata
	whereReadsRel  bool // where reads owners or involved
	changed        []fieldpath.Path
	route          *route // nil: every sink

	// ownerLabels are the owners' labels the rule shows (ownerLabels;
	// nil: all).
	ownerLabels map[string]bool
	relations   Relations // set by SetRelations (include owners)
	incomplete  atomic.Uint64

	logger     *slog.Logger
	received   atomic.Uint64 // notifications evaluated
	matched    atomic.Uint64 // events produced
	evalErrors atomic.Uint64
	lastErrLog atomic.Int64 // unix nanos of the last logged evaluation error
	now        func() time.Time
}

// changes is a set of event.Change, one bit each.
type changes uint8

func changeBit(c event.Change) changes {
	switch c {
	case event.Added:
		return 1
	case event.Updated:
		return 2
	case event.Deleted:
		return 4
	}
	return 0
}

type indexTerm struct {
	key    config.IndexKey
	fn     cache.IndexFunc
	values map[string]bool
}

// Compile builds rule i of a loaded (valid) config. nsLabels is needed when
// the rule has a namespaceSelector.
func Compile(cfg *config.Config, i int, nsLabels NamespaceLabels, logger *slog.Logger) (*Rule, error) {
	rc := cfg.Rules[i]
	path := fmt.Sprintf("rules[%d]", i)
	gvr, err := config.ParseResource(rc.Resource)
	if err != nil {
		return nil, fmt.Errorf("%s.resource: %w", path, err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Rule{
		Name:     rc.Name,
		GVR:      gvr,
		Sinks:    rc.Sinks,
		nsLabels: nsLabels,
		logger:   logger.With("rule", rc.Name, "resource", rc.Resource),
		now:      time.Now,
		Event: &event.Rule{
			Name: rc.Name, Cluster: cfg.Cluster, GVR: gvr, AllowSecretData: rc.AllowSecretData,
			SecretAnnotations: append(slices.Clone(event.AlwaysRedactedAnnotations), cfg.Redaction.SecretAnnotations...),
		},
	}
	for _, inc := range rc.Include {
		switch inc {
		case "object":
			r.Event.IncludeObject = true
		case "oldObject":
			r.Event.IncludeOld = true
		case "patch":
			r.Event.IncludePatch = true
		case "metadata":
			r.Event.IncludeMeta = true
		case "owners":
			r.Event.IncludeOwners = true
		}
	}
	if r.Event.IncludeOwners && len(rc.Include) == 1 {
		r.Event.IncludeObject = true // owners adds to the default
	}
	if rc.OwnerLabels != nil {
		r.ownerLabels = map[string]bool{}
		for _, k := range rc.OwnerLabels {
			r.ownerLabels[k] = true
		}
	}
	for _, e := range rc.Events {
		r.events |= changeBit(event.Change(e))
	}
	if len(rc.Namespaces) > 0 {
		r.namespaces = map[string]bool{}
		for _, ns := range rc.Namespaces {
			r.namespaces[ns] = true
		}
	}
	if rc.NamespaceSelector != "" {
		if r.nsSelector, err = labels.Parse(rc.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("%s.namespaceSelector: %w", path, err)
		}
		if nsLabels == nil {
			return nil, fmt.Errorf("%s.namespaceSelector: no namespace labels source", path)
		}
	}
	if rc.LabelSelector != "" {
		if r.labelSel, err = labels.Parse(rc.LabelSelector); err != nil {
			return nil, fmt.Errorf("%s.labelSelector: %w", path, err)
		}
	}
	if rc.FieldSelector != "" {
		if r.fieldSel, err = fields.ParseSelector(rc.FieldSelector); err != nil {
			return nil, fmt.Errorf("%s.fieldSelector: %w", path, err)
		}
		r.fieldPaths = map[string][]string{}
		for _, req := range r.fieldSel.Requirements() {
			r.fieldPaths[req.Field] = strings.Split(req.Field, ".")
		}
	}
	for key, values := range rc.Index {
		k, err := config.ParseIndexKey(key)
		if err != nil {
			return nil, fmt.Errorf("%s.index: %w", path, err)
		}
		t := indexTerm{key: k, fn: IndexFunc(k), values: map[string]bool{}}
		for _, v := range values {
			t.values[v] = true
		}
		r.index = append(r.index, t)
	}
	if rc.Where != "" {
		ast, errs := celsandbox.CompileWhere(rc.Where)
		if len(errs) > 0 {
			return nil, fmt.Errorf("%s.where: %w", path, errs[0])
		}
		env, _ := celsandbox.CELEnv()
		if r.where, err = env.Program(ast, celsandbox.CELProgramOptions()...); err != nil {
			return nil, fmt.Errorf("%s.where: %w", path, err)
		}
		r.whereIsView = !celsandbox.References(ast, celsandbox.CELOldObject) && !celsandbox.References(ast, celsandbox.CELType)
		r.whereReadsBody = readsBody(ast)
		r.whereReadsRel = readsRelated(ast)
	}
	for _, p := range rc.Changed {
		fp, err := fieldpath.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("%s.changed: %w", path, err)
		}
		r.changed = append(r.changed, fp)
	}
	r.Event.Changed = r.changed
	if rc.Route != nil {
		if r.route, err = compileRoute(rc); err != nil {
			return nil, fmt.Errorf("%s.route.sink: %w", path, err)
		}
		if r.route.readsNamespace && nsLabels == nil {
			return nil, fmt.Errorf("%s.route.sink: no namespace labels source", path)
		}
	}
	return r, nil
}

// IncludesOwners reports whether the rule includes owners.
func (r *Rule) IncludesOwners() bool { return r.Event.IncludeOwners }

// OwnerLabels are the owners' labels the rule shows (ownerLabels), nil
// for all of them.
func (r *Rule) OwnerLabels() []string {
	if r.ownerLabels == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(r.ownerLabels))
}

// SetRelations sets what resolves the rule's owners (include owners),
// before the rule evaluates anything.
func (r *Rule) SetRelations(fn Relations) { r.relations = fn }

// Related resolves obj's owners (and involved object) for the rule: nil
// when the rule does not include owners. how says whether an owner not
// cached yet may be waited for (Live: once per notification, in the rules
// stage) and whether a chain still incomplete is counted
// (OwnersIncomplete): a notification's state is, a re-evaluation's not.
func (r *Rule) Related(obj *unstructured.Unstructured, how Resolution) *event.Related {
	if !r.Event.IncludeOwners || obj == nil {
		return nil
	}
	if r.relations == nil {
		return &event.Related{Incomplete: true}
	}
	var deadline time.Time
	if how == Live {
		deadline = r.now().Add(OwnersWait)
	}
	rel := r.relations(r.GVR, obj, deadline)
	if r.ownerLabels != nil {
		rel = rel.WithLabels(r.ownerLabels)
	}
	if how != Reread && (rel.Incomplete || rel.Involved != nil && rel.Involved.Incomplete) {
		r.incomplete.Add(1)
	}
	return rel
}

// OwnersIncomplete counts the notifications whose owners (or involved
// object) were not all found (after the wait, if any).
func (r *Rule) OwnersIncomplete() uint64 { return r.incomplete.Load() }

// MetadataOnly reports whether the rule needs nothing of an object but its
// apiVersion, kind and metadata: its events include metadata only, and its
// where, route, changed, field selector and index read only those. Index keys
// (namespace, labels, annotations, owners) always do. A Kubernetes Event's
// involved object and the times it was reported are in its body: owners
// of an Event (involved) need it.
func (r *Rule) MetadataOnly() bool {
	if !r.Event.IncludeMeta || r.whereReadsBody || r.route != nil && r.route.readsBody ||
		r.Event.IncludeOwners && config.IsKubernetesEvent(r.GVR) {
		return false
	}
	for _, p := range r.changed {
		if !metadataPath(p.Segments()[0].Key) {
			return false
		}
	}
	for _, p := range r.fieldPaths {
		if !metadataPath(p[0]) {
			return false
		}
	}
	return true
}

func metadataPath(top string) bool { return top == "metadata" || top == "apiVersion" || top == "kind" }

// readsBody reports whether a checked expression reads object or oldObject
// other than through .metadata, .apiVersion or .kind (conservatively: any
// other use of the variables, e.g. passing them whole or optional
// selection, counts as reading the body).
func readsBody(a *cel.Ast) bool {
	uses, metaSelects := 0, 0
	isVar := func(e celast.Expr) bool {
		if e.Kind() != celast.IdentKind {
			return false
		}
		n := e.AsIdent()
		return n == celsandbox.CELObject || n == celsandbox.CELOldObject
	}
	celast.PostOrderVisit(a.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		switch {
		case isVar(e):
			uses++
		case e.Kind() == celast.SelectKind && isVar(e.AsSelect().Operand()) && metadataPath(e.AsSelect().FieldName()):
			metaSelects++
		}
	}))
	return uses != metaSelects
}

// IndexKeys returns the rule's index keys; the informer registers an
// IndexFunc under each key's String().
func (r *Rule) IndexKeys() []config.IndexKey {
	keys := make([]config.IndexKey, len(r.index))
	for i, t := range r.index {
		keys[i] = t.key
	}
	return keys
}

// IndexLookup names the rule's first index term and its values, for
// enumerating the rule's candidates with the informer's ByIndex.
func (r *Rule) IndexLookup() (index string, values []string, ok bool) {
	if len(r.index) == 0 {
		return "", nil, false
	}
	t := r.index[0]
	for v := range t.values {
		values = append(values, v)
	}
	return t.key.String(), values, true
}

// Delivers reports whether the rule delivers events of type t.
func (r *Rule) Delivers(t event.Change) bool { return r.events&changeBit(t) != 0 }

// Counts returns how many notifications the rule evaluated and how many
// of them produced an event to send (the difference was filtered out).
func (r *Rule) Counts() (received, matched uint64) { return r.received.Load(), r.matched.Load() }

// Count records one evaluated notification and whether it produced an
// event to send.
func (r *Rule) Count(matched bool) {
	r.received.Add(1)
	if matched {
		r.matched.Add(1)
	}
}

// EvalErrors counts where evaluations that failed.
func (r *Rule) EvalErrors() uint64 { return r.evalErrors.Load() }

// Changed reports whether an update from old to obj is one the rule's
// changed paths let through (always, without changed paths).
// Without the previous state (nil old) every update passes.
func (r *Rule) Changed(old, obj *unstructured.Unstructured) bool {
	return old == nil || r.anyChanged(old, obj)
}

// PassesEventFilter reports whether a transition of type t passes the
// rule's where when where is an event filter (it reads oldObject or type);
// a where that is a view predicate is part of InView instead. old may be
// nil (added, deleted, and updates whose previous state is unknown, e.g.
// found in a checkpoint).
func (r *Rule) PassesEventFilter(obj, old *unstructured.Unstructured, t event.Change) bool {
	if !r.HasEventFilter() {
		return true
	}
	return r.PassesSeen(r.Seen(obj), r.Seen(old), t, r.Related(obj, Reread))
}

// HasEventFilter reports whether the rule's where is an event filter
// (PassesEventFilter can be false).
func (r *Rule) HasEventFilter() bool { return r.where != nil && !r.whereIsView }

// PassesSeen is PassesEventFilter for a caller that holds what the rule
// sees of both states already (Seen) and the object's Related.
func (r *Rule) PassesSeen(seen, seenOld *unstructured.Unstructured, t event.Change, rel *event.Related) bool {
	if !r.HasEventFilter() {
		return true
	}
	return r.eval(seen, seenOld, t, rel)
}

// AsUnstructured unwraps tombstones; it returns nil for anything else.
func AsUnstructured(obj any) *unstructured.Unstructured {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

// InView reports whether obj is in the rule's view (its owners read from
// the caches as they are, without waiting).
func (r *Rule) InView(obj *unstructured.Unstructured) bool {
	return r.InViewSeen(obj, r.Seen(obj), r.Related(obj, Reread))
}

// InViewSeen is InView for a caller that holds what the rule sees of obj
// already (seen: Seen(obj); rel: Related(obj)), to judge the same state's
// events with it too: the rules stage evaluates each notified state once,
// for every sink.
func (r *Rule) InViewSeen(obj, seen *unstructured.Unstructured, rel *event.Related) bool {
	return r.ObjectInView(obj, seen, rel) && r.InSelectedNamespace(obj)
}

// InSelectedNamespace reports whether obj's namespace is selected by the
// rule's namespaceSelector now (true without one): the part of InView that
// is not the object's own, which the namespace's labels change.
func (r *Rule) InSelectedNamespace(obj *unstructured.Unstructured) bool {
	if r.nsSelector == nil {
		return true
	}
	set, ok := r.nsLabels(obj.GetNamespace())
	return ok && r.nsSelector.Matches(set)
}

// ObjectInView is InViewSeen but for the namespaceSelector: what obj alone
// (and its owners) decides.
func (r *Rule) ObjectInView(obj, seen *unstructured.Unstructured, rel *event.Related) bool {
	md, _ := obj.Object["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	if r.namespaces != nil && !r.namespaces[ns] {
		return false
	}
	if r.labelSel != nil {
		lbls, _ := md["labels"].(map[string]any)
		if !r.labelSel.Matches(objLabels(lbls)) {
			return false
		}
	}
	if r.fieldSel != nil && !r.fieldSel.Matches(r.fieldSet(seen)) {
		return false
	}
	for i := range r.index {
		if !r.index[i].matches(seen) {
			return false
		}
	}
	if r.where != nil && r.whereIsView {
		return r.eval(seen, nil, event.Added, rel)
	}
	return true
}

// MatchesNamespace reports whether a namespace with these labels is
// selected by the rule's namespaceSelector (true when it has none).
func (r *Rule) MatchesNamespace(set labels.Set) bool {
	return r.nsSelector == nil || r.nsSelector.Matches(set)
}

// eval runs the where expression; obj and old are what Seen gives, rel
// obj's Related.
func (r *Rule) eval(obj, old *unstructured.Unstructured, t event.Change, rel *event.Related) bool {
	vars := &activation{object: obj.Object, typ: t, related: rel}
	if old != nil {
		vars.oldObject = old.Object
	}
	out, _, err := r.where.Eval(vars)
	if err == nil {
		if b, ok := out.(types.Bool); ok {
			return bool(b)
		}
		err = fmt.Errorf("where evaluated to %s, not a bool", out.Type())
	}
	r.evalErrors.Add(1)
	now := r.now().UnixNano()
	if last := r.lastErrLog.Load(); now-last > int64(10*time.Second) && r.lastErrLog.CompareAndSwap(last, now) {
		r.logger.Warn("where expression failed; event not delivered",
			"object", obj.GetNamespace()+"/"+obj.GetName(), "error", err, "failures", r.evalErrors.Load())
	}
	return false
}

// Seen is what the rule's filters (field selector, index terms, where)
// see of obj: the object as the rule's events show its values
// (event.SecretPolicy): a Secret whose data stays redacted, redacted.
// Otherwise a where, a field selector or an index term could test guesses
// against the values, and the rule's name (kbrule) or an error in the log
// would tell which guess was right. Labels, namespaces and uids are never
// redacted. obj may be nil (Seen is then nil).
func (r *Rule) Seen(obj *unstructured.Unstructured) *unstructured.Unstructured {
	secrets := r.Event.Secrets()
	if obj == nil || !secrets.Redacts() {
		return obj
	}
	return &unstructured.Unstructured{Object: secrets.Redact(obj.Object)}
}

// fieldSet is obj's fields as the apiserver selects them: at their path,
// but for core/v1 Events' source, which it computes (eventSource).
func (r *Rule) fieldSet(obj *unstructured.Unstructured) fields.Set {
	set := make(fields.Set, len(r.fieldPaths))
	for name, path := range r.fieldPaths {
		if name == "source" && r.GVR == coreEvents {
			set[name] = eventSource(obj.Object)
			continue
		}
		v, found, _ := unstructured.NestedFieldNoCopy(obj.Object, path...)
		if found {
			set[name] = fmt.Sprint(v)
		} else {
			set[name] = ""
		}
	}
	return set
}

var coreEvents = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// eventSource is the field selector source of a core/v1 Event, as the
// apiserver computes it: source.component, else reportingComponent.
func eventSource(obj map[string]any) string {
	src, _ := obj["source"].(map[string]any)
	if c, _ := src["component"].(string); c != "" {
		return c
	}
	c, _ := obj["reportingComponent"].(string)
	return c
}

func (r *Rule) anyChanged(old, obj *unstructured.Unstructured) bool {
	if len(r.changed) == 0 {
		return true
	}
	for _, path := range r.changed {
		if path.Changed(old.Object, obj.Object) {
			return true
		}
	}
	return false
}

package filters

import (
	"github.com/google/cel-go/interpreter"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// Hot-path helpers: unstructured's GetLabels and friends copy maps on every
// call; these read the cached object in place (it is never modified).

// metaMap returns obj.metadata[field] as a map, without copying.
func metaMap(obj *unstructured.Unstructured, field string) map[string]any {
	md, _ := obj.Object["metadata"].(map[string]any)
	m, _ := md[field].(map[string]any)
	return m
}

// objLabels is a labels.Labels over an object's labels, without copying.
type objLabels map[string]any

func (l objLabels) Has(k string) bool { _, ok := l[k]; return ok }
func (l objLabels) Get(k string) string {
	v, _ := l[k].(string)
	return v
}
func (l objLabels) Lookup(k string) (string, bool) {
	v, ok := l[k]
	s, _ := v.(string)
	return s, ok
}

// matches tests an index term without calling the IndexFunc where a direct
// lookup gives the same answer.
func (t *indexTerm) matches(obj *unstructured.Unstructured) bool {
	switch t.key.Kind {
	case config.IndexNamespace:
		return t.values[obj.GetNamespace()]
	case config.IndexLabel, config.IndexAnnotation:
		field := "labels"
		if t.key.Kind == config.IndexAnnotation {
			field = "annotations"
		}
		v, ok := metaMap(obj, field)[t.key.Arg].(string)
		return ok && t.values[v]
	}
	vals, err := t.fn(obj)
	if err != nil {
		return false
	}
	for _, v := range vals {
		if t.values[v] {
			return true
		}
	}
	return false
}

// activation feeds a where expression its variables without building a map.
type activation struct {
	object, oldObject map[string]any
	typ               event.Change
	namespaceLabels   map[string]string    // a route's namespaceLabels
	related           *event.Related       // owners and involved (include owners)
	budget            celsandbox.CELBudget // what this evaluation's guarded calls allocated
}

// eventVars is the activation of an expression over a built event (a
// sink's updateWindow key, its mute where): the event's object, old
// object and change, and the owners and involved object its rule's
// include: [owners] resolved.
func eventVars(e *event.Event) *activation {
	vars := &activation{typ: e.Change, related: e.Related()}
	if o := e.Object(); o != nil {
		vars.object = o.Object
	}
	if o := e.OldObject(); o != nil {
		vars.oldObject = o.Object
	}
	return vars
}

func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case celsandbox.CELObject:
		return a.object, true
	case celsandbox.CELOldObject:
		if a.oldObject == nil {
			return nil, true
		}
		return a.oldObject, true
	case celsandbox.CELType:
		return string(a.typ), true
	case celsandbox.CELNamespaceLabels:
		return a.namespaceLabels, true
	case celsandbox.CELOwners:
		return a.related.OwnersValue(), true
	case celsandbox.CELInvolved:
		if v := a.related.InvolvedValue(); v != nil {
			return v, true
		}
		return nil, true
	case celsandbox.CELBudgetVar:
		return &a.budget, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }

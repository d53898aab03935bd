package event

import (
	"github.com/kubebridge/kubebridge/pkg/fieldpath"
)

// MaxChanges bounds the changes Changes lists; the rest are counted.
const MaxChanges = 50

// bookkeeping is what every write of an object changes and no person
// asked about.
var bookkeeping = []string{"resourceVersion", "managedFields", "generation"}

// Changes is what an update changed, leaf by leaf (a keyed list's elements
// named by their merge key: spec.template.spec.containers[name=web].image),
// in what the rule's changed paths select, else in the whole object but
// its bookkeeping metadata; of the object as the rule's events carry it
// (metadata only for include: [metadata]) and its values as the rule may
// show them (a Secret's redacted). At most MaxChanges, and how many more.
// known is false when there is nothing to tell (not an update, a rule
// whose events carry no object) or it cannot be told (Untold).
func (e *Event) Changes() (changes []fieldpath.Change, more int, known bool) {
	if e.rule == nil || e.Change != Updated || e.object == nil || e.oldObject == nil || !(e.rule.IncludeObject || e.rule.IncludeMeta) {
		return nil, 0, false
	}
	old, obj := e.oldObject.Object, e.object.Object
	if !e.rule.IncludeObject {
		old, obj = MetadataOnly(old), MetadataOnly(obj)
	}
	if len(e.rule.Changed) == 0 {
		changes, more = fieldpath.Leaves(withoutBookkeeping(old), withoutBookkeeping(obj), nil, nil, MaxChanges)
	} else {
		for _, p := range e.rule.Changed {
			cs, m := p.Changes(old, obj, MaxChanges-len(changes))
			changes, more = append(changes, cs...), more+m
		}
	}
	if secrets := e.rule.Secrets(); secrets.Redacts() {
		// Decided on what the cache holds, shown as the rule may show it;
		// a path that cannot be looked up again shows nothing.
		ro, rn := secrets.Redact(old), secrets.Redact(obj)
		for i := range changes {
			p, err := fieldpath.Parse(changes[i].Path)
			if err != nil {
				changes[i].Old, changes[i].New = Redacted, Redacted
				continue
			}
			changes[i].Old, _ = p.Get(ro)
			changes[i].New, _ = p.Get(rn)
		}
	}
	return changes, more, true
}

// Untold reports whether e is an update whose changes cannot be told: found
// at a start, without the previous state (the checkpoint keeps none), for a
// rule whose events carry the object. A message says so rather than guess.
func (e *Event) Untold() bool {
	return e.rule != nil && e.Change == Updated && e.object != nil && e.oldObject == nil && (e.rule.IncludeObject || e.rule.IncludeMeta)
}

// withoutBookkeeping is obj without the metadata every write changes.
func withoutBookkeeping(obj map[string]any) map[string]any {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		return obj
	}
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		out[k] = v
	}
	m := make(map[string]any, len(md))
	for k, v := range md {
		m[k] = v
	}
	for _, k := range bookkeeping {
		delete(m, k)
	}
	if ann, ok := md["annotations"].(map[string]any); ok {
		if _, ok := ann[lastAppliedAnnotation]; ok {
			a := make(map[string]any, len(ann))
			for k, v := range ann {
				a[k] = v
			}
			delete(a, lastAppliedAnnotation) // the whole object again, as a string
			m["annotations"] = a
		}
	}
	out["metadata"] = m
	return out
}

const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

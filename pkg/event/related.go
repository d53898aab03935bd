package event

import "encoding/json"

// Related is what a rule's include: [owners] adds to an object's events,
// its expressions and its request templates: the object's owner chain
// and, for a Kubernetes Event, the object it is about (involved). It is
// resolved once per notification by the rules stage and shared, read-only,
// by every sink the notification goes to.
type Related struct {
	// Owners is the owner chain, nearest first: the owner the object's
	// ownerReferences name as controller (else the first one), its own,
	// and so on; the top controller (a Pod's Deployment) is last.
	Owners []Owner
	// Incomplete says the chain may stop short of the top: an owner was
	// not found in the bridge's caches within the wait (named from its
	// ownerReference, without labels, and the chain ends there), or the
	// chain reached the depth bound.
	Incomplete bool
	// Involved is, for a core/v1 or events.k8s.io/v1 Event, the object the
	// Event is about (involvedObject, regarding); nil otherwise.
	Involved *Involved
}

// Owner is one link of an owner chain.
type Owner struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
	Labels     map[string]string `json:"labels,omitempty"` // nil when named from the ownerReference only
}

// Involved is the object a Kubernetes Event is about and its owner chain.
// Found is false when it was not in the bridge's caches: what is known
// comes from the Event's reference (no labels, no owners).
type Involved struct {
	APIVersion string
	Kind       string
	Namespace  string
	Name       string
	UID        string
	Labels     map[string]string
	Owners     []Owner
	Incomplete bool
	Found      bool
}

// WithLabels returns r with only the labels keep names, on owners and the
// involved object alike (a rule's ownerLabels); r itself is not changed
// (it may be shared).
func (r *Related) WithLabels(keep map[string]bool) *Related {
	if r == nil {
		return nil
	}
	out := *r
	out.Owners = ownersWithLabels(r.Owners, keep)
	if r.Involved != nil {
		in := *r.Involved
		in.Labels = labelsWith(in.Labels, keep)
		in.Owners = ownersWithLabels(in.Owners, keep)
		out.Involved = &in
	}
	return &out
}

func ownersWithLabels(owners []Owner, keep map[string]bool) []Owner {
	if owners == nil {
		return nil
	}
	out := make([]Owner, len(owners))
	for i, o := range owners {
		o.Labels = labelsWith(o.Labels, keep)
		out[i] = o
	}
	return out
}

// labelsWith is l with only the keys keep names (nil stays nil: an owner
// named from its reference only).
func labelsWith(l map[string]string, keep map[string]bool) map[string]string {
	if l == nil {
		return nil
	}
	out := make(map[string]string, min(len(l), len(keep)))
	for k, v := range l {
		if keep[k] {
			out[k] = v
		}
	}
	return out
}

// Top is the top controller of the chain: its last owner (false: none).
func (r *Related) Top() (Owner, bool) {
	if r == nil || len(r.Owners) == 0 {
		return Owner{}, false
	}
	return r.Owners[len(r.Owners)-1], true
}

// OwnersValue is the chain as CEL and templates see it (owners): a list
// of {apiVersion, kind, name, uid, labels} maps, nearest first, labels
// always a map (empty when unknown). Empty for nil.
func (r *Related) OwnersValue() []any {
	if r == nil {
		return []any{}
	}
	return ownersValue(r.Owners)
}

func ownersValue(owners []Owner) []any {
	out := make([]any, len(owners))
	for i, o := range owners {
		out[i] = map[string]any{"apiVersion": o.APIVersion, "kind": o.Kind, "name": o.Name, "uid": o.UID, "labels": labelsValue(o.Labels)}
	}
	return out
}

func labelsValue(l map[string]string) map[string]string {
	if l == nil {
		return map[string]string{}
	}
	return l
}

// InvolvedValue is the involved object as CEL and templates see it
// (involved): {apiVersion, kind, namespace, name, uid, labels, owners}; nil
// when there is none (the object is not a Kubernetes Event).
func (r *Related) InvolvedValue() map[string]any {
	if r == nil || r.Involved == nil {
		return nil
	}
	in := r.Involved
	return map[string]any{
		"apiVersion": in.APIVersion, "kind": in.Kind, "namespace": in.Namespace, "name": in.Name, "uid": in.UID,
		"labels": labelsValue(in.Labels), "owners": ownersValue(in.Owners),
	}
}

// appendRelated appends the data's members of r (after others when more
// is set): "owners" (always, [] when none), "ownersIncomplete" when
// incomplete, and "involved" for a Kubernetes Event.
func appendRelated(b []byte, r *Related, more bool) ([]byte, error) {
	if more {
		b = append(b, ',')
	}
	b = append(b, `"owners":`...)
	var err error
	if b, err = appendOwners(b, r.Owners); err != nil {
		return b, err
	}
	if r.Incomplete {
		b = append(b, `,"ownersIncomplete":true`...)
	}
	if in := r.Involved; in != nil {
		b = append(b, `,"involved":`...)
		v := struct {
			APIVersion       string            `json:"apiVersion,omitempty"`
			Kind             string            `json:"kind"`
			Namespace        string            `json:"namespace,omitempty"`
			Name             string            `json:"name"`
			UID              string            `json:"uid,omitempty"`
			Labels           map[string]string `json:"labels,omitempty"`
			Owners           []Owner           `json:"owners"`
			OwnersIncomplete bool              `json:"ownersIncomplete,omitempty"`
		}{in.APIVersion, in.Kind, in.Namespace, in.Name, in.UID, in.Labels, in.Owners, in.Incomplete}
		if v.Owners == nil {
			v.Owners = []Owner{}
		}
		if b, err = appendMarshal(b, v); err != nil {
			return b, err
		}
	}
	return b, nil
}

func appendOwners(b []byte, owners []Owner) ([]byte, error) {
	if owners == nil {
		return append(b, "[]"...), nil
	}
	out, err := json.Marshal(owners)
	return append(b, out...), err
}

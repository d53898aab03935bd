package filters

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// An updateWindow key is evaluated over the event's object; a value that
// is not a string (known only when evaluated) is an error, not a key.
func TestWindowKey(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata":       map[string]any{"name": "web.1", "namespace": "prod", "uid": "e1"},
		"involvedObject": map[string]any{"kind": "Deployment", "uid": "d1"},
		"reason":         "ScalingReplicaSet",
		"count":          int64(3),
	}}
	e := event.New(&event.Rule{Name: "r"}, event.Updated, obj, nil, time.Now())
	k, err := NewWindowKey("object.involvedObject.uid + '/' + object.reason + '/' + type")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k.Of(e); err != nil || got != "d1/ScalingReplicaSet/updated" {
		t.Errorf("key = %q, %v", got, err)
	}
	n, err := NewWindowKey("object.count")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := n.Of(e); err == nil {
		t.Errorf("a count as key = %q, want an error", got)
	}
	if _, err := NewWindowKey("object.metadata.generation"); err == nil {
		t.Error("an int key compiled")
	}

	// A key an object makes long (an annotation) is kept bounded, and
	// still tells objects apart and groups equal ones.
	long, err := NewWindowKey("object.reason")
	if err != nil {
		t.Fatal(err)
	}
	withReason := func(r string) *event.Event {
		o := obj.DeepCopy()
		o.Object["reason"] = r
		return event.New(&event.Rule{Name: "r"}, event.Updated, o, nil, time.Now())
	}
	a1, _ := long.Of(withReason(strings.Repeat("a", 256<<10)))
	a2, _ := long.Of(withReason(strings.Repeat("a", 256<<10)))
	b, _ := long.Of(withReason(strings.Repeat("a", 256<<10-1) + "b"))
	if len(a1) > MaxWindowKey || a1 != a2 || a1 == b {
		t.Errorf("a 256 KiB key kept as %d bytes; equal keys equal %v, different ones different %v", len(a1), a1 == a2, a1 != b)
	}
}

// A key and a mute where read the owners the event's rule resolved: an
// Event keyed by its involved object's top owner, a mute by a team.
func TestWindowKeyAndMatcherReadOwners(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Event", "reason": "BackOff",
		"metadata": map[string]any{"name": "web-1.1", "namespace": "prod", "uid": "e1"}}}
	deploy := event.Owner{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Labels: map[string]string{"team": "payments"}}
	e := event.Build(&event.Rule{Name: "r", IncludeOwners: true}, event.Transition{Change: event.Updated, Object: obj, Time: time.Now(),
		Related: &event.Related{Involved: &event.Involved{Kind: "Pod", Name: "web-1", Owners: []event.Owner{{Kind: "ReplicaSet", Name: "web-6d4"}, deploy}}}})
	k, err := NewWindowKey("involved.owners[size(involved.owners) - 1].name + '/' + object.reason")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k.Of(e); err != nil || got != "web/BackOff" {
		t.Errorf("key = %q, %v", got, err)
	}
	m, err := CompileMatcher("involved.owners.exists(o, o.labels.?team.orValue('') == 'payments')")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := m(e); !ok || err != nil {
		t.Errorf("the mute where does not see the owners: %v, %v", ok, err)
	}
}

// A key over involved (a rule that includes owners) gives the Events of a
// Deployment, of its ReplicaSet and of its Pods one key: the top owner of
// the object each is about, or that object itself when it has none.
func TestWindowKeyOverInvolved(t *testing.T) {
	k, err := NewWindowKey("(size(involved.owners) > 0 ? involved.owners[size(involved.owners) - 1].uid : involved.uid) + '/' + object.type")
	if err != nil {
		t.Fatal(err)
	}
	deploy := event.Owner{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d1"}
	rs := event.Owner{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5c8", UID: "r1"}
	about := func(in event.Involved) *event.Event {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Event", "type": "Warning",
			"metadata": map[string]any{"name": "e-" + in.UID, "namespace": "prod", "uid": "e-" + in.UID},
		}}
		in.Found = true
		return event.Build(&event.Rule{Name: "r"}, event.Transition{Change: event.Added, Object: obj, Time: time.Now(), Related: &event.Related{Involved: &in}})
	}
	for _, e := range []*event.Event{
		about(event.Involved{Kind: "Deployment", Name: "web", UID: "d1"}),
		about(event.Involved{Kind: "ReplicaSet", Name: "web-5c8", UID: "r1", Owners: []event.Owner{deploy}}),
		about(event.Involved{Kind: "Pod", Name: "web-5c8-x", UID: "p1", Owners: []event.Owner{rs, deploy}}),
	} {
		if got, err := k.Of(e); err != nil || got != "d1/Warning" {
			t.Errorf("%s: key = %q, %v; want d1/Warning", e.Related().Involved.Kind, got, err)
		}
	}
	// Without owners resolved, involved is null: an error, so the object
	// has a window of its own.
	plain := event.New(&event.Rule{Name: "r"}, event.Added, &unstructured.Unstructured{Object: map[string]any{"kind": "Event", "metadata": map[string]any{"name": "e"}}}, nil, time.Now())
	if got, err := k.Of(plain); err == nil {
		t.Errorf("without involved: key = %q, want an error", got)
	}
}

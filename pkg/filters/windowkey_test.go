package filters

import (
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
	if !m(e) {
		t.Error("the mute where does not see the owners")
	}
}

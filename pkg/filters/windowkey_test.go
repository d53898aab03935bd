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

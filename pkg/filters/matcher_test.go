package filters

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// A mute's where sees what a rule's where sees: the object, its old state
// and the change; what fails to evaluate is not matched.
func TestCompileMatcher(t *testing.T) {
	rule := &event.Rule{Name: "r", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}
	prod := cm("prod", "x", "1", map[string]string{"team": "a"}, nil)
	m, err := CompileMatcher("object.metadata.namespace == 'prod' && type != 'deleted' && object.metadata.labels['team'] == 'a'")
	if err != nil {
		t.Fatal(err)
	}
	if !m(event.New(rule, event.Updated, prod, nil, time.Now())) {
		t.Error("an update in prod: not matched")
	}
	if m(event.New(rule, event.Deleted, prod, nil, time.Now())) {
		t.Error("a deletion: matched")
	}
	if m(event.New(rule, event.Updated, cm("prod", "y", "1", nil, nil), nil, time.Now())) {
		t.Error("no labels (an evaluation error): matched")
	}
	if _, err := CompileMatcher("object.metadata.name"); err == nil {
		t.Error("a string expression compiled as a matcher")
	}
}

package filters

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// A mute's where sees what a rule's where sees: the object, its old state
// and the change; what fails to evaluate (a label the object lacks, even
// under !=) is an error, not a quiet false: the mute holds it rather than
// send it during quiet hours.
func TestCompileMatcher(t *testing.T) {
	rule := &event.Rule{Name: "r", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}
	prod := cm("prod", "x", "1", map[string]string{"team": "a"}, nil)
	m, err := CompileMatcher("object.metadata.namespace == 'prod' && type != 'deleted' && object.metadata.labels['team'] == 'a'")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := m(event.New(rule, event.Updated, prod, nil, time.Now())); !ok || err != nil {
		t.Errorf("an update in prod: %v, %v; want matched", ok, err)
	}
	if ok, err := m(event.New(rule, event.Deleted, prod, nil, time.Now())); ok || err != nil {
		t.Errorf("a deletion: %v, %v; want not matched", ok, err)
	}
	notSRE, err := CompileMatcher("object.metadata.labels.team != 'sre'")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := notSRE(event.New(rule, event.Updated, cm("prod", "y", "1", nil, nil), nil, time.Now())); err == nil {
		t.Error("no labels: no error; want the failure reported, for the mute to hold the event")
	}
	if _, err := CompileMatcher("object.metadata.name"); err == nil {
		t.Error("a string expression compiled as a matcher")
	}
}

package event

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The data of a rule that includes owners: the chain nearest first, the
// top controller last; an incomplete chain says so; an Event's involved
// object with its owners; an event whose owners were never resolved (a
// deletion found in a checkpoint) says they are incomplete rather than
// that there are none. Copies keep them.
func TestDataCarriesOwners(t *testing.T) {
	pods := &Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, IncludeMeta: true, IncludeOwners: true}
	chain := []Owner{
		{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-6d4", UID: "rs", Labels: map[string]string{"app": "web"}},
		{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Labels: map[string]string{"team": "payments"}},
	}
	now := time.Unix(1, 0)
	for _, tc := range []struct {
		rel  *Related
		want string
	}{
		{&Related{Owners: chain}, `"owners":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-6d4","uid":"rs","labels":{"app":"web"}},{"apiVersion":"apps/v1","kind":"Deployment","name":"web","uid":"d","labels":{"team":"payments"}}]}`},
		{&Related{Owners: chain[:1:1], Incomplete: true}, `"owners":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-6d4","uid":"rs","labels":{"app":"web"}}],"ownersIncomplete":true}`},
		{&Related{}, `"owners":[]}`},
		{nil, `"owners":[],"ownersIncomplete":true}`},
		{&Related{Involved: &Involved{APIVersion: "v1", Kind: "Pod", Namespace: "a", Name: "web-6d4-x", UID: "p", Labels: map[string]string{"app": "web"}, Owners: chain, Found: true}},
			`"owners":[],"involved":{"apiVersion":"v1","kind":"Pod","namespace":"a","name":"web-6d4-x","uid":"p","labels":{"app":"web"},"owners":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-6d4","uid":"rs","labels":{"app":"web"}},{"apiVersion":"apps/v1","kind":"Deployment","name":"web","uid":"d","labels":{"team":"payments"}}]}}`},
	} {
		ev := Build(pods, Transition{Change: Added, Object: obj("a", "web-6d4-x", "1", nil), Time: now, Entered: now.UnixNano(), Related: tc.rel})
		data, err := ev.WithReplay(ReplayResync).Data()
		if err != nil {
			t.Fatal(err)
		}
		if s := string(data); len(s) < len(tc.want) || s[len(s)-len(tc.want):] != tc.want || s[len(s)-len(tc.want)-1] != ',' {
			t.Errorf("data %s\nwant it to end with ,%s", s, tc.want)
		}
	}
	if top, ok := (&Related{Owners: chain}).Top(); !ok || top.Kind != "Deployment" {
		t.Errorf("top %+v", top)
	}
}

// An added and an update merged on a queue's overflow keep the newer
// state's owners.
func TestCoalesceKeepsOwners(t *testing.T) {
	r := &Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, IncludeObject: true, IncludeOwners: true}
	now := time.Unix(1, 0)
	rel := &Related{Owners: []Owner{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-6d4", UID: "rs"}}}
	added := Build(r, Transition{Change: Added, Object: obj("a", "p", "1", nil), Time: now, Entered: now.UnixNano(), Related: &Related{}})
	updated := Build(r, Transition{Change: Updated, Object: obj("a", "p", "2", nil), Time: now, Entered: now.UnixNano(), Related: rel})
	if merged, keep := Coalesce(added, updated); !keep || merged.Change != Added || merged.Related() != rel {
		t.Errorf("merged %v %+v", keep, merged.Related())
	}
}

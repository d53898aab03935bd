package event

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// change is an event of object name (uid u-<name>) at resource version rv.
func change(name, rv string, c Change) *Event {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetUID(types.UID("u-" + name))
	u.SetResourceVersion(rv)
	return New(&Rule{Name: "r", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}, c, u, nil, time.Now())
}

// freshAdded is the added of an object the sink's view held nothing of.
func freshAdded(name, rv string) *Event {
	e := change(name, rv, Added)
	return Build(e.RuleInfo(), Transition{Change: Added, Object: e.Object(), Time: e.Time, Entered: e.Entered, Fresh: true})
}

// Coalescing keeps an unseen object added and the newest state; a fresh
// added and its deletion cancel out, any other added does not.
func TestCoalesce(t *testing.T) {
	added, updated, deleted := change("a", "1", Added), change("a", "2", Updated), change("a", "3", Deleted)
	if c, keep := Coalesce(added, updated); !keep || c.Change != Added || c.ID != ID("r", "u-a", "2", Added, added.Entered, "") || c.Fresh {
		t.Errorf("added+updated = %s (fresh %v, keep %v)", c.ID, c.Fresh, keep)
	}
	// An added sent again after a checkpoint's load (a new stamp, the entry
	// time kept) keeps both: its id is the stamp's.
	again := Build(added.RuleInfo(), Transition{Change: Added, Object: added.Object(), Entered: added.Entered, Stamp: added.Entered + 7})
	if c, _ := Coalesce(again, updated); c.Entered != added.Entered || c.ID != ID("r", "u-a", "2", Added, added.Entered+7, "") {
		t.Errorf("restamped added+updated = %s, entered %d", c.ID, c.Entered)
	}
	if c, keep := Coalesce(updated, change("a", "4", Updated).WithQuiet(true)); !keep || c.Quiet {
		t.Error("a change to send was made quiet by a newer one outside the changed paths")
	}
	if c, keep := Coalesce(updated, deleted); !keep || c != deleted {
		t.Errorf("updated+deleted = %s", c.ID)
	}
	if c, keep := Coalesce(added, deleted); !keep || c != deleted {
		t.Errorf("added (not fresh)+deleted = %v, %v: the deletion must stay", c, keep)
	}
	fresh := freshAdded("a", "1")
	c, keep := Coalesce(fresh, updated)
	if !keep || c.Change != Added || !c.Fresh {
		t.Fatalf("fresh added+updated = %v (fresh %v), want a fresh added", c.Change, c.Fresh)
	}
	if _, keep := Coalesce(c, deleted); keep {
		t.Error("fresh added+deleted kept: they cancel out")
	}
	// A deletion queued before a fresh added (the object left a server-side
	// selector's view, then came back) makes the merge not fresh: a later
	// deletion must not cancel it away with the deletion it carries.
	c, keep = Coalesce(deleted, freshAdded("a", "5"))
	if !keep || c.Change != Added || c.Fresh {
		t.Fatalf("deleted+fresh added = %v (fresh %v), want an added that is not fresh", c.Change, c.Fresh)
	}
	if c, keep := Coalesce(c, change("a", "6", Deleted)); !keep || c.Change != Deleted {
		t.Errorf("deleted+fresh added+deleted = %v, %v: the deletion must stay", c, keep)
	}
}

// Fold merges runs of one incarnation and counts as a queue does; a
// replaced object's deletion and its successor's added both stay.
func TestFold(t *testing.T) {
	a1, a2, a3 := freshAdded("a", "1"), change("a", "2", Updated), change("a", "3", Updated)
	b := change("b", "1", Deleted)
	out, coalesced, cancelled := Fold([]*Event{a1, a2, a3, b})
	if len(out) != 2 || out[0].Change != Added || out[0].Object().GetResourceVersion() != "3" || out[1] != b || coalesced != 2 || cancelled != 0 {
		t.Fatalf("Fold = %d events (first %v@%s), coalesced %d, cancelled %d", len(out), out[0].Change, out[0].Object().GetResourceVersion(), coalesced, cancelled)
	}
	out, coalesced, cancelled = Fold([]*Event{freshAdded("c", "1"), change("c", "2", Deleted)})
	if len(out) != 0 || coalesced != 0 || cancelled != 2 {
		t.Errorf("fresh added+deleted folded to %d events, coalesced %d, cancelled %d; want none, 0, 2", len(out), coalesced, cancelled)
	}
	old := change("d", "1", Deleted)
	u := change("d", "2", Added).Object()
	u.SetUID("u-d2")
	next := New(old.RuleInfo(), Added, u, nil, time.Now())
	if out, _, _ := Fold([]*Event{old, next}); len(out) != 2 {
		t.Errorf("two incarnations folded to %d events, want both", len(out))
	}
}

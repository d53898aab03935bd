package bridge

import (
	"testing"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// What a destination holds is what the diff starts from; the checkpoint
// adds only its clocks and its intents.
func TestHeldViewTrustsTheDestination(t *testing.T) {
	stored := map[string]*checkpoint.Slot{
		// acknowledged and held: the checkpoint's clocks are kept
		"ns/a": {Acked: &checkpoint.Entry{UID: "ua", ResourceVersion: "3", Name: "a", Namespace: "ns", Entered: 111, Stamp: 222}},
		// acknowledged, but the destination lost it: not held, sent again
		"ns/b": {Acked: &checkpoint.Entry{UID: "ub", ResourceVersion: "4", Name: "b", Namespace: "ns"}},
		// an intent in flight: kept, so the diff deletes it if it left the view
		"ns/c": {Pending: []checkpoint.Entry{{UID: "uc", Name: "c", Namespace: "ns", Entered: 5}}},
	}
	held := []sinks.HeldObject{
		{Namespace: "ns", Name: "a", UID: "ua", ResourceVersion: "7"},
		{Namespace: "ns", Name: "d", UID: "ud", ResourceVersion: "1"},     // written, never recorded (a crash)
		{Namespace: "ns", Name: "e", UID: "ue"},                           // a marker
		{Namespace: "ns", Name: "d", UID: "ud-old", ResourceVersion: "1"}, // a stale uid under d
		{Namespace: "other", Name: "f", UID: "uf", ResourceVersion: "1"},  // another shard's
	}
	got := heldView(stored, held, func(h sinks.HeldObject) bool { return h.Namespace == "ns" })

	if a := got["ns/a"].Acked; a == nil || a.ResourceVersion != "7" || a.Entered != 111 || a.Stamp != 222 {
		t.Errorf("ns/a = %+v, want the destination's resourceVersion 7 with the checkpoint's clocks", a)
	}
	if sl := got["ns/b"]; sl != nil {
		t.Errorf("ns/b = %+v: the destination lacks it, so it is not held", sl)
	}
	if sl := got["ns/c"]; sl == nil || len(sl.Pending) != 1 || sl.Pending[0].UID != "uc" {
		t.Errorf("ns/c = %+v, want the checkpoint's intent", sl)
	}
	if sl := got["ns/d"]; sl == nil || sl.Acked == nil || sl.Acked.UID != "ud" || len(sl.Pending) != 1 || sl.Pending[0].UID != "ud-old" {
		t.Errorf("ns/d = %+v, want ud held and ud-old a ghost", sl)
	}
	if e := got["ns/e"].Acked; e == nil || e.ResourceVersion != "0" {
		t.Errorf("ns/e = %+v, want a marker held at resourceVersion 0 (older than any state: sent again)", e)
	}
	if sl := got["other/f"]; sl != nil {
		t.Errorf("other/f = %+v: not this deliverer's", sl)
	}
}

// Only a sink whose destination holds the view replaces the checkpoint's
// view with it: a nats sink publishing changes holds no view (its
// checkpoint entries are what it acknowledged).
func TestOnlyAMirrorHoldsTheView(t *testing.T) {
	if h := holderOf(&natssink.Sink{}); h != nil {
		t.Error("a nats sink publishing changes counts as holding the view")
	}
	if h := holderOf(natssink.Mirroring{Sink: &natssink.Sink{}}); h == nil {
		t.Error("a mirroring nats sink does not count as holding the view")
	}
	if h := holderOf(&sharedSink{Sink: natssink.Mirroring{Sink: &natssink.Sink{}}}); h == nil {
		t.Error("a mirroring nats sink shared by shards does not count as holding the view")
	}
}

package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/event"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"))
}

// contract: what every store must do.
func contract(t *testing.T, s Store) {
	ctx := context.Background()
	a := &Entry{UID: "u1", ResourceVersion: "5", Namespace: "ns", Name: "a.b", Labels: map[string]string{"x": "y"}, Entered: 1764115200123456789, Stamp: 1764115300123456789}
	b := &Entry{UID: "u2", ResourceVersion: "7", Name: "cluster-scoped"}
	must(t, s.Apply(ctx, []Change{{Sink: "bus", Rule: "r1", Key: "ns/a.b", Entry: a}, {Sink: "bus", Rule: "r1", Key: "cluster-scoped", Entry: b},
		{Sink: "bus", Rule: "r2", Key: "ns/a.b", Entry: a}, {Sink: "hook", Rule: "r1", Key: "ns/a.b", Entry: a}}))
	must(t, s.Apply(ctx, []Change{{Sink: "bus", Rule: "r1", Key: "cluster-scoped"},
		{Sink: "bus", Rule: "r1", Key: "ns/a.b", Entry: &Entry{UID: "u1", ResourceVersion: "6", Namespace: "ns", Name: "a.b"}},
		// a deletion of another incarnation leaves the entry alone
		{Sink: "bus", Rule: "r2", Key: "ns/a.b", IfUID: "u-other"}, {Sink: "hook", Rule: "r1", Key: "ns/a.b", IfUID: "u1"}}))
	got, err := s.Load(ctx, "bus", "r1")
	must(t, err)
	want := map[string]Entry{"ns/a.b": {UID: "u1", ResourceVersion: "6", Namespace: "ns", Name: "a.b"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("bus/r1 = %+v, want %+v", got, want)
	}
	if got, _ := s.Load(ctx, "bus", "r2"); !reflect.DeepEqual(got["ns/a.b"], *a) || len(got) != 1 {
		t.Errorf("bus/r2 = %+v", got)
	}
	if got, _ := s.Load(ctx, "hook", "r1"); len(got) != 0 {
		t.Errorf("hook/r1 = %+v: the deletion of its uid was not applied", got)
	}
	if got, _ := s.Load(ctx, "nobody", "r1"); len(got) != 0 {
		t.Errorf("unknown sink = %+v", got)
	}
}

func TestBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "state.db")
	s, err := OpenBolt(path, false)
	must(t, err)
	contract(t, s)
	must(t, s.Close())
	s, err = OpenBolt(path, false) // survives a reopen
	must(t, err)
	defer s.Close()
	if got, _ := s.Load(context.Background(), "bus", "r1"); got["ns/a.b"].ResourceVersion != "6" {
		t.Errorf("after reopen: %+v", got)
	}
}

func TestBoltCorruptIsAnErrorUnlessReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	must(t, os.WriteFile(path, []byte(strings.Repeat("not a bbolt file ", 512)), 0o600))
	_, err := OpenBolt(path, false)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "--reset-checkpoint") || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want ErrCorrupt naming the file and the flag", err)
	}
	s, err := OpenBolt(path, true)
	must(t, err)
	defer s.Close()
	if got, _ := s.Load(context.Background(), "bus", "r1"); len(got) != 0 {
		t.Errorf("after reset: %+v", got)
	}
	aside, _ := filepath.Glob(path + ".reset-*")
	if len(aside) != 1 {
		t.Errorf("corrupt file not kept aside: %v", aside)
	}
}

func TestKV(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	b, err := natssink.OpenKV(context.Background(), nc, "kubebridge")
	must(t, err)
	s := NewKV(b)
	contract(t, s)
	// Another process (a new leader) sees the same view.
	nc2, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc2.Close()
	b2, err := natssink.OpenKV(context.Background(), nc2, "kubebridge")
	must(t, err)
	s2 := NewKV(b2)
	if got, _ := s2.Load(context.Background(), "bus", "r1"); got["ns/a.b"].ResourceVersion != "6" || len(got) != 1 {
		t.Errorf("second client: %+v", got)
	}
}

func ev(name, rv string, change event.Change) *event.Event {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetUID(types.UID("u-" + name))
	u.SetResourceVersion(rv)
	return event.New(&event.Rule{Name: "r", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}, change, u, nil, time.Now())
}

// Intents are durable before sending; acknowledgements batch up; deletes remove.
func TestRecorder(t *testing.T) {
	s, err := OpenBolt(filepath.Join(t.TempDir(), "state.db"), false)
	must(t, err)
	defer s.Close()
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), nil)
	go r.Run()
	stopped := false
	defer func() {
		if !stopped { // the test failed before Stop: end Run all the same
			r.Abandon()
		}
	}()
	ctx := context.Background()
	added := ev("a", "1", event.Added)
	must(t, r.Intend(ctx, "bus", []*event.Event{added, ev("gone", "1", event.Deleted), ev("q", "1", event.Added).WithQuiet(true)}))
	view, _ := LoadView(ctx, s, "bus", "r")
	if sl := view["ns/a"]; sl == nil || sl.Acked != nil || len(sl.Pending) != 1 || sl.Pending[0].UID != "u-a" || sl.Pending[0].Entered != added.Entered || len(view) != 2 || view["ns/q"] == nil {
		t.Fatalf("after intent: %+v, want ns/a and ns/q (quiet: its rule may send only the deletion) pending with their entry time, deletions need none", view)
	}
	r.Acked("bus", []*event.Event{added, ev("b", "2", event.Added), ev("q", "1", event.Deleted)})
	updated := event.Build(added.RuleInfo(), event.Transition{Change: event.Updated, Object: ev("a", "3", event.Updated).Object(), Entered: added.Entered})
	r.Acked("bus", []*event.Event{updated, ev("b", "4", event.Deleted)})
	if view, _ := LoadView(ctx, s, "bus", "r"); view["ns/a"].Acked != nil {
		t.Errorf("acks written before a flush: %+v", view)
	}
	stopped = true // (Stop is not idempotent, and it ends Run even when it fails)
	must(t, r.Stop(ctx))
	view, _ = LoadView(ctx, s, "bus", "r")
	if sl := view["ns/a"]; len(view) != 1 || sl.Acked == nil || sl.Acked.ResourceVersion != "3" || sl.Acked.Entered != added.Entered || len(sl.Pending) != 0 {
		t.Errorf("after stop: %+v, want only ns/a at 3, its intent settled", view)
	}
}

// failing fails every Apply while down is set.
type failing struct {
	Store
	down atomic.Bool
}

func (f *failing) Apply(ctx context.Context, changes []Change) error {
	if f.down.Load() {
		return errors.New("disk full")
	}
	return f.Store.Apply(ctx, changes)
}

// An intent counts only once written: a send retried after a failed intent
// writes it again instead of going out without it.
func TestIntentDurableBeforeItCounts(t *testing.T) {
	bolt := openBolt(t)
	s := &failing{Store: bolt}
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	batch := []*event.Event{ev("a", "1", event.Added)}
	s.down.Store(true)
	if err := r.Intend(ctx, "bus", batch); err == nil {
		t.Fatal("Intend succeeded on a failing store")
	}
	s.down.Store(false)
	must(t, r.Intend(ctx, "bus", batch))
	if view, _ := LoadView(ctx, bolt, "bus", "r"); view["ns/a"] == nil || len(view["ns/a"].Pending) != 1 {
		t.Fatalf("the retried intent was not written: %+v", view)
	}
}

// A restart that finds an intent beside an acknowledged entry (a
// replacement was in flight) knows the sink may hold either.
func TestIntentBesideAcknowledged(t *testing.T) {
	bolt := openBolt(t)
	r := NewRecorder(bolt, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	first := ev("a", "1", event.Added)
	must(t, r.Intend(ctx, "bus", []*event.Event{first}))
	r.Acked("bus", []*event.Event{first})
	must(t, r.Flush(ctx))
	repl := ev("a", "2", event.Added)
	o := repl.Object().DeepCopy()
	o.SetUID("u-a2")
	repl = event.Build(repl.RuleInfo(), event.Transition{Change: event.Added, Object: o, Time: time.Now(), Entered: 2})
	must(t, r.Intend(ctx, "bus", []*event.Event{ev("a", "1", event.Deleted), repl}))
	view, _ := LoadView(ctx, bolt, "bus", "r")
	sl := view["ns/a"]
	if sl == nil || sl.Acked == nil || sl.Acked.UID != "u-a" || len(sl.Pending) != 1 || sl.Pending[0].UID != "u-a2" {
		t.Fatalf("crash point: %+v, want u-a acknowledged and u-a2 pending", sl)
	}
	// A fresh recorder (the restart) learns it and settles it on the ack.
	r2 := NewRecorder(bolt, time.Hour, slog.New(slog.DiscardHandler), nil)
	r2.Known("bus", "r", view)
	must(t, r2.Intend(ctx, "bus", []*event.Event{repl}))
	r2.Acked("bus", []*event.Event{ev("a", "1", event.Deleted), repl})
	must(t, r2.Flush(ctx))
	view, _ = LoadView(ctx, bolt, "bus", "r")
	if sl := view["ns/a"]; sl == nil || sl.Acked == nil || sl.Acked.UID != "u-a2" || len(sl.Pending) != 0 {
		t.Fatalf("after the ack: %+v, want u-a2 acknowledged, nothing pending", sl)
	}
}

// slowStore counts writes, each taking as long as an fsync on a slow disk.
type slowStore struct {
	Store
	applies atomic.Int32
}

func (s *slowStore) Apply(ctx context.Context, changes []Change) error {
	s.applies.Add(1)
	time.Sleep(5 * time.Millisecond)
	return s.Store.Apply(ctx, changes)
}

// Intents of several sinks sent at once share writes (group commit), and
// each caller returns only once its own intents are durable.
func TestRecorderIntentsGroupCommit(t *testing.T) {
	bolt := openBolt(t)
	s := &slowStore{Store: bolt}
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	const sinks = 16
	var wg sync.WaitGroup
	for i := range sinks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sink := fmt.Sprintf("sink-%d", i)
			must(t, r.Intend(ctx, sink, []*event.Event{ev("a", "1", event.Added)}))
			if got, _ := bolt.Load(ctx, sink, "r"); len(got) != 1 {
				t.Errorf("%s: Intend returned before its intent was written: %+v", sink, got)
			}
		}()
	}
	wg.Wait()
	if n := s.applies.Load(); n > sinks/2 {
		t.Errorf("%d sinks' intents took %d writes; want them shared", sinks, n)
	}
	t.Logf("%d intents in %d writes", sinks, s.applies.Load())
}

// Acknowledgements recorded while intents wait for their write do not
// make each intent write again: an intent a write already took is durable
// when that write succeeds.
func TestIntentsShareWritesWhileAcknowledgementsArrive(t *testing.T) {
	bolt := openBolt(t)
	s := &slowStore{Store: bolt}
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	stop := make(chan struct{})
	acking := make(chan struct{})
	go func() { // a steady stream of acknowledgements, as from batches delivered meanwhile
		defer close(acking)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
			r.Acked("other", []*event.Event{ev(fmt.Sprintf("o%d", i), "1", event.Added)})
		}
	}()
	const batches = 16
	var wg sync.WaitGroup
	for i := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("b%d", i)
			must(t, r.Intend(ctx, "bus", []*event.Event{ev(key, "1", event.Added)}))
			if got, _ := bolt.Load(ctx, "bus", "r"); got["ns/"+key].UID == "" {
				t.Errorf("%s: Intend returned before its intent was written", key)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-acking
	if n := s.applies.Load(); n > batches/2 {
		t.Errorf("%d intents took %d writes while acknowledgements arrived; want them shared", batches, n)
	}
	t.Logf("%d intents in %d writes", batches, s.applies.Load())
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A sent deletion of an object that still exists is an intent (it may come
// back unchanged); the acknowledgement of a ghost's deletion never erases
// the entry of the incarnation the key holds.
func TestLeavingIntentsAndConditionalDeletes(t *testing.T) {
	bolt := openBolt(t)
	r := NewRecorder(bolt, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	in := ev("a", "1", event.Added)
	must(t, r.Intend(ctx, "bus", []*event.Event{in}))
	r.Acked("bus", []*event.Event{in})
	must(t, r.Flush(ctx))
	left := event.Build(in.RuleInfo(), event.Transition{Change: event.Deleted, Object: in.Object(), Entered: in.Entered, Reason: event.ReasonUnmatched})
	must(t, r.Intend(ctx, "bus", []*event.Event{left, ev("gone", "1", event.Deleted)}))
	view, _ := LoadView(ctx, bolt, "bus", "r")
	if sl := view["ns/a"]; sl == nil || sl.Acked == nil || len(sl.Pending) != 1 || !sl.Pending[0].Leaving || len(view) != 1 {
		t.Fatalf("before sending an unmatched deletion: %+v, want ns/a acked with a leaving intent (plain deletions need none)", view)
	}
	ghost := ev("a", "1", event.Deleted)
	o := ghost.Object().DeepCopy()
	o.SetUID("u-ghost")
	r.Acked("bus", []*event.Event{event.Build(ghost.RuleInfo(), event.Transition{Change: event.Deleted, Object: o, Entered: 7})})
	must(t, r.Flush(ctx))
	if view, _ := LoadView(ctx, bolt, "bus", "r"); view["ns/a"] == nil || view["ns/a"].Acked == nil || view["ns/a"].Acked.UID != "u-a" {
		t.Fatalf("a ghost's deletion erased the entry of u-a: %+v", view["ns/a"])
	}
}

// An update right after an acknowledged create (before the next checkpoint
// write) needs no intent of its own: the store still holds the create's.
func TestNoSecondIntentForAnAcknowledgedIncarnation(t *testing.T) {
	bolt := openBolt(t)
	s := &slowStore{Store: bolt}
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	added := ev("a", "1", event.Added)
	must(t, r.Intend(ctx, "bus", []*event.Event{added}))
	r.Acked("bus", []*event.Event{added})
	updated := event.Build(added.RuleInfo(), event.Transition{Change: event.Updated, Object: ev("a", "2", event.Updated).Object(), Entered: added.Entered})
	before := s.applies.Load()
	must(t, r.Intend(ctx, "bus", []*event.Event{updated}))
	if s.applies.Load() != before {
		t.Error("an update of an incarnation whose intent the store holds wrote another intent")
	}
	must(t, r.Flush(ctx))
	if view, _ := LoadView(ctx, bolt, "bus", "r"); view["ns/a"] == nil || view["ns/a"].Acked == nil || len(view["ns/a"].Pending) != 0 {
		t.Errorf("after the write: %+v", view["ns/a"])
	}
}

// openBolt opens a fresh file store, closed when the test ends.
func openBolt(t *testing.T) *Bolt {
	t.Helper()
	b, err := OpenBolt(filepath.Join(t.TempDir(), "state.db"), false)
	must(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// hangingStore blocks Apply until its context ends while hang is set.
type hangingStore struct {
	Store
	hang    atomic.Bool
	entered chan struct{}
}

func (h *hangingStore) Apply(ctx context.Context, changes []Change) error {
	if h.hang.Load() {
		h.entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Store.Apply(ctx, changes)
}

// A write in flight when its hold lapses (a shard's Lease not renewed in
// time) is cut short, as a send is, and its changes stay pending: written
// by the next flush under a renewed hold, not lost and not left running
// into another replica's tenure.
func TestRecorderWriteBoundedByItsHold(t *testing.T) {
	bolt := openBolt(t)
	s := &hangingStore{Store: bolt, entered: make(chan struct{}, 1)}
	hold, lapse := context.WithCancel(context.Background())
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), heldBy{hold})
	ctx := context.Background()
	e := ev("a", "1", event.Added)
	r.Acked("bus", []*event.Event{e})
	s.hang.Store(true)
	flushed := make(chan error, 1)
	go func() { flushed <- r.Flush(ctx) }()
	<-s.entered
	lapse()
	select {
	case err := <-flushed:
		if err == nil {
			t.Fatal("a write cut by its hold reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write in flight outlived its hold")
	}
	s.hang.Store(false)
	hold, lapse = context.WithCancel(context.Background())
	defer lapse()
	must(t, r.Flush(ctx))
	if view, _ := LoadView(ctx, bolt, "bus", "r"); view["ns/a"] == nil || view["ns/a"].Acked == nil {
		t.Fatalf("the acknowledgement cut short was not written by the next flush: %+v", view)
	}
}

// An incarnation sent again under a new stamp after a load (its entry time
// kept) is a new intent, and what the store holds of it afterwards keeps
// both: the entry time (a request's for) and the stamp (its ids).
func TestRestampedIncarnationKeepsItsEntryTime(t *testing.T) {
	bolt := openBolt(t)
	r := NewRecorder(bolt, time.Hour, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	added := ev("a", "1", event.Added)
	must(t, r.Intend(ctx, "bus", []*event.Event{added}))
	r.Acked("bus", []*event.Event{added})
	must(t, r.Flush(ctx))
	view, _ := LoadView(ctx, bolt, "bus", "r")
	if a := view["ns/a"].Acked; a == nil || a.Entered != added.Entered || a.Stamp != 0 || a.IDStamp() != added.Entered {
		t.Fatalf("acknowledged: %+v, want entered %d and no stamp of its own", a, added.Entered)
	}

	r = NewRecorder(bolt, time.Hour, slog.New(slog.DiscardHandler), nil) // a restart
	r.Known("bus", "r", view)
	stamp := added.Entered + 1000
	again := event.Build(added.RuleInfo(), event.Transition{Change: event.Updated, Object: ev("a", "2", event.Updated).Object(), Entered: added.Entered, Stamp: stamp})
	must(t, r.Intend(ctx, "bus", []*event.Event{again}))
	view, _ = LoadView(ctx, bolt, "bus", "r")
	if p := view["ns/a"].Pending; len(p) != 1 || p[0].Entered != added.Entered || p[0].Stamp != stamp {
		t.Fatalf("intent of the new stamp: %+v", p)
	}
	r.Acked("bus", []*event.Event{again})
	must(t, r.Flush(ctx))
	view, _ = LoadView(ctx, bolt, "bus", "r")
	if sl := view["ns/a"]; sl.Acked == nil || sl.Acked.Entered != added.Entered || sl.Acked.IDStamp() != stamp || len(sl.Pending) != 0 {
		t.Errorf("after its acknowledgement: %+v", sl)
	}
}

// heldBy is a Fencing whose holding lasts as long as its context.
type heldBy struct{ ctx context.Context }

func (heldBy) Fence() error { return nil }

func (h heldBy) Hold(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(h.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// gatedStore holds each Apply until release is closed.
type gatedStore struct {
	Store
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) Apply(ctx context.Context, changes []Change) error {
	g.entered <- struct{}{}
	<-g.release
	return g.Store.Apply(ctx, changes)
}

// An intent queued when the recorder is abandoned (the lease lost) is
// dropped unwritten: its Intend fails, so its batch is not sent, though
// the write it waited behind succeeded; and no Intend succeeds after.
func TestIntentDroppedByAbandonFails(t *testing.T) {
	bolt := openBolt(t)
	s := &gatedStore{Store: bolt, entered: make(chan struct{}, 2), release: make(chan struct{})}
	r := NewRecorder(s, time.Hour, slog.New(slog.DiscardHandler), nil)
	go r.Run()
	ctx := context.Background()
	first, second := make(chan error, 1), make(chan error, 1)
	a := ev("a", "1", event.Added)
	go func() { first <- r.Intend(ctx, "bus", []*event.Event{a}) }()
	<-s.entered // a's write is on its way
	go func() { second <- r.Intend(ctx, "bus", []*event.Event{ev("b", "1", event.Added)}) }()
	for deadline := time.Now().Add(5 * time.Second); r.Lag() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b's intent was never queued")
		}
	}
	r.Abandon()
	close(s.release)
	must(t, <-first)
	if err := <-second; err == nil {
		t.Error("an intent the abandon dropped unwritten let its batch go")
	}
	if view, _ := LoadView(ctx, bolt, "bus", "r"); view["ns/b"] != nil {
		t.Errorf("b written after the abandon: %+v", view["ns/b"])
	}
	if err := r.Intend(ctx, "bus", []*event.Event{a}); err == nil {
		t.Error("Intend succeeded on an abandoned recorder")
	}
}

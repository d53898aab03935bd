package delivery

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// keyed is an event of object name whose window key is key (kept in a
// label, which the test's key expression reads).
func keyed(name, rv string, change event.Change, key string) *event.Event {
	e := ev(name, rv, change)
	e.Object().SetLabels(map[string]string{"incident": key})
	return e
}

func byIncident(e *event.Event) (string, error) {
	k := e.Object().GetLabels()["incident"]
	if k == "" {
		return "", errors.New("no incident label")
	}
	return k, nil
}

// keyedDelivery runs a delivery with a window per incident label, and
// records what it acknowledged, in order.
func keyedDelivery(t *testing.T, window time.Duration, maxKeys int) (*Delivery, *sent, func() []string, interface{ Step(time.Duration) }) {
	cfg := sinkConfig()
	cfg.UpdateWindow = config.UpdateWindow{Every: config.Duration(window), Key: "object.metadata.labels.incident", MaxKeys: maxKeys}
	sink := &sent{}
	var mu sync.Mutex
	var acked []string
	clk := fakeClock()
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, WindowKey: byIncident, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			line := e.Object().GetName() + " " + string(e.Change) + " " + e.Object().GetResourceVersion()
			if e.Quiet {
				line += " quiet"
			}
			acked = append(acked, line)
		}
	}}})
	stop := run(t, d)
	t.Cleanup(stop)
	return d, sink, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(acked) }, clk
}

// With a key, different objects coalesce into one message per key per
// window, whatever their change: the first goes at once, what follows in
// the window (added ones too) waits and goes as one message, the latest
// state of an object still present; the objects coalesced away are
// acknowledged without being sent. Another key is not held.
func TestUpdateWindowPerKey(t *testing.T) {
	const window = 10 * time.Minute
	d, sink, acked, clk := keyedDelivery(t, window, 0)

	d.Offer(keyed("a", "1", event.Added, "X"))
	waitFor(t, sink.has("a added 1"))
	waitFor(t, func() bool { return d.Stats().Throttled == 1 })
	d.Offer(keyed("b", "1", event.Added, "X")) // a new object of the key: held too
	d.Offer(keyed("a", "2", event.Updated, "X"))
	d.Offer(keyed("c", "1", event.Added, "X"))
	d.Offer(keyed("b", "2", event.Updated, "X"))
	d.Offer(keyed("y", "1", event.Added, "Y")) // another key: at once
	waitFor(t, sink.has("y added 1"))
	if got := sink.lines(); len(got) != 2 {
		t.Fatalf("inside X's window: sent %q", got)
	}
	clk.Step(window)
	waitFor(t, sink.has("b added 2"))                    // b's added and update fold; b is the latest object
	waitFor(t, func() bool { return len(acked()) == 5 }) // b's two events folded into one
	if got := sink.lines(); len(got) != 3 {
		t.Fatalf("X's window ended: sent %q, want one message for it", got)
	}
	for _, want := range []string{"a updated 2 quiet", "c added 1 quiet", "b added 2"} {
		if !slices.Contains(acked(), want) {
			t.Errorf("acknowledged %q: %q missing", acked(), want)
		}
	}

	// The latest object still present wins over a later deletion.
	waitFor(t, func() bool { return d.Stats().Throttled == 1 }) // X again; Y's window ended with nothing
	d.Offer(keyed("a", "3", event.Updated, "X"))
	d.Offer(keyed("c", "2", event.Deleted, "X"))
	clk.Step(window)
	waitFor(t, sink.has("a updated 3"))
	waitFor(t, func() bool { return slices.Contains(acked(), "c deleted 2 quiet") })

	// When every object of the window is gone, the latest deletion.
	waitFor(t, func() bool { return d.Stats().Throttled == 1 })
	d.Offer(keyed("a", "4", event.Deleted, "X"))
	d.Offer(keyed("b", "3", event.Deleted, "X"))
	clk.Step(window)
	waitFor(t, sink.has("b deleted 3"))
	if got := sink.lines(); len(got) != 5 || slices.Contains(got, "a deleted 4") {
		t.Errorf("sent %q, want one message per window: a's deletion coalesced into b's", got)
	}
	waitFor(t, func() bool { return slices.Contains(acked(), "a deleted 4 quiet") })
	if s := d.Stats(); s.Window.Coalesced != 4 {
		t.Errorf("coalesced into a key's message: %d, want 4 (a 2, c 1, c's deletion, a's deletion)", s.Window.Coalesced)
	}

	// A drain sends what waits without waiting the window out.
	d.Offer(keyed("d", "1", event.Added, "X"))
	d.Close()
	select {
	case <-d.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited out the window")
	}
	if !sink.has("d added 1")() {
		t.Errorf("drained: %q", sink.lines())
	}
}

// Past maxKeys, a key gets no window: its messages go as they come (none
// dropped or held), counted; a key that fails gives the object a window
// of its own.
func TestUpdateWindowPerKeyBounds(t *testing.T) {
	const window = time.Minute
	d, sink, _, _ := keyedDelivery(t, window, 1)
	d.Offer(keyed("a", "1", event.Added, "X"))
	waitFor(t, func() bool { return d.Stats().Throttled == 1 })
	d.Offer(keyed("y", "1", event.Added, "Y"))
	waitFor(t, sink.has("y added 1"))
	d.Offer(keyed("y", "2", event.Updated, "Y"))
	waitFor(t, sink.has("y updated 2")) // no room for Y's window
	if s := d.Stats(); s.Window.Overflow < 1 || s.Throttled != 1 {
		t.Errorf("overflow %d, throttled %d; want Y counted and only X waiting", s.Window.Overflow, s.Throttled)
	}

	d.Offer(ev("n", "1", event.Added)) // no label: the key fails
	waitFor(t, sink.has("n added 1"))
	d.Offer(ev("n", "2", event.Updated))
	d.Offer(ev("n", "3", event.Deleted)) // its own window: a deletion ends it
	waitFor(t, sink.has("n deleted 3"))
	if slices.Contains(sink.lines(), "n updated 2") {
		t.Errorf("n's update inside its window was sent: %q", sink.lines())
	}
	if s := d.Stats(); s.Window.KeyErrors != 1 {
		t.Errorf("key errors %d, want 1 (an object's key is evaluated once)", s.Window.KeyErrors)
	}
}

// Several events of a key taken at once (a burst before the delivery
// took any) are one message too: the latest.
func TestUpdateWindowPerKeyBurst(t *testing.T) {
	cfg := sinkConfig()
	cfg.UpdateWindow = config.UpdateWindow{Every: config.Duration(time.Minute), Key: "k"}
	sink := &sent{}
	d := New(Options{Config: cfg, Sink: sink, Clock: fakeClock(), WindowKey: byIncident})
	for _, name := range []string{"a", "b", "c"} {
		d.Offer(keyed(name, "1", event.Added, "X"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx)
	waitFor(t, func() bool { return d.Stats().Throttled == 1 })
	if got := sink.lines(); !slices.Equal(got, []string{"c added 1"}) {
		t.Errorf("sent %q, want the latest object's message only", got)
	}
	cancel()
	<-d.Done()
}

// failing refuses the first sends (a plain failure: the object is parked
// and retried), then records as sent does.
type failing struct {
	sent
	mu    sync.Mutex
	left  int
	tried int
}

func (f *failing) Send(ctx context.Context, evs []*event.Event) error {
	f.mu.Lock()
	f.tried++
	if f.left > 0 {
		f.left--
		f.mu.Unlock()
		return errors.New("500 Internal Server Error")
	}
	f.mu.Unlock()
	return f.sent.Send(ctx, evs)
}

// A key's message that failed is retried as one message with what
// arrived for the key meanwhile: the latest object's.
func TestUpdateWindowPerKeyRetriesOneMessage(t *testing.T) {
	cfg := sinkConfig()
	cfg.UpdateWindow = config.UpdateWindow{Every: config.Duration(time.Minute), Key: "k"}
	sink := &failing{left: 1}
	clk := fakeClock()
	var mu sync.Mutex
	var acked []string
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, WindowKey: byIncident, Hooks: Hooks{OnAck: func(evs []*event.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			acked = append(acked, e.Object().GetName()+" "+string(e.Change)+map[bool]string{true: " quiet"}[e.Quiet])
		}
	}}})
	stop := run(t, d)
	defer stop()
	d.Offer(keyed("a", "1", event.Added, "X"))
	waitFor(t, func() bool { return d.Stats().Parked == 1 })
	d.Offer(keyed("b", "1", event.Added, "X"))
	d.Offer(keyed("c", "1", event.Added, "X"))
	waitFor(t, func() bool {
		clk.Step(10 * time.Millisecond) // the retry's backoff
		return d.Stats().Throttled == 1
	})
	if got := sink.lines(); !slices.Equal(got, []string{"c added 1"}) {
		t.Errorf("sent %q, want one message, the latest object's", got)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(acked)
	if want := []string{"a added quiet", "b added quiet", "c added"}; !slices.Equal(acked, want) {
		t.Errorf("acknowledged %q, want %q", acked, want)
	}
}

// gatedSink holds the sends of one uid until open is closed, and records
// as sent does.
type gatedSink struct {
	sent
	uid  string
	open chan struct{}
}

func (g *gatedSink) Send(ctx context.Context, evs []*event.Event) error {
	for _, e := range evs {
		if e.UID() == g.uid {
			<-g.open
		}
	}
	return g.sent.Send(ctx, evs)
}

// An object deleted and created again under its name with another key,
// while the deleted one's events are still out, joins the deleted one's
// key: a sink never has events of one name (event.Key) in two batches at
// once, whose acknowledgements could come in any order (the checkpoint
// records an object by its name, so the older one's would overwrite the
// newer one's, and a crash then lose its deletion), and whose intents
// would each miss the other's.
func TestUpdateWindowPerKeyNameNeverTwiceInFlight(t *testing.T) {
	const window = 10 * time.Minute
	cfg := sinkConfig()
	cfg.Workers = 4
	cfg.UpdateWindow = config.UpdateWindow{Every: config.Duration(window), Key: "object.metadata.labels.incident"}
	sink := &gatedSink{uid: "u-x", open: make(chan struct{})}
	clk := fakeClock()
	var mu sync.Mutex
	out := map[string]string{} // by event.Key: the uid between its intent and its acknowledgement
	var twice, acked []string
	d := New(Options{Config: cfg, Sink: sink, Clock: clk, WindowKey: byIncident, Hooks: Hooks{
		BeforeSend: func(_ context.Context, evs []*event.Event) error {
			mu.Lock()
			defer mu.Unlock()
			mine := map[string]string{}
			for _, e := range evs {
				if uid, ok := out[e.Key()]; ok && uid != e.UID() {
					twice = append(twice, e.Key()+": "+uid+" and "+e.UID())
				}
				mine[e.Key()] = e.UID()
			}
			maps.Copy(out, mine)
			return nil
		},
		OnAck: func(evs []*event.Event) {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				delete(out, e.Key())
				acked = append(acked, e.UID()+" "+string(e.Change))
			}
		},
	}})
	stop := run(t, d)
	defer stop()

	d.Offer(keyed("x", "1", event.Added, "X")) // out, held by the destination
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(out) == 1 })
	d.Offer(keyed("x", "2", event.Deleted, "X"))
	again := keyed("x", "3", event.Added, "Y")
	again.Object().SetUID("u-x2")
	again = event.Build(again.RuleInfo(), event.Transition{Change: event.Added, Object: again.Object(), Time: time.Now()})
	d.Offer(again)
	d.Offer(keyed("z", "1", event.Added, "Z")) // offered after it, sent as soon as it can be
	waitFor(t, sink.has("z added 1"))
	close(sink.open)
	waitFor(t, func() bool { // X (with x's new incarnation, or not) waits out its window
		clk.Step(window)
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	if len(twice) > 0 {
		t.Errorf("one name in two batches at once: %q", twice)
	}
	if want := []string{"u-z added", "u-x added", "u-x deleted", "u-x2 added"}; !slices.Equal(acked, want) {
		t.Errorf("acknowledged %q, want %q (one name's incarnations in their order)", acked, want)
	}
	if got := sink.lines(); !slices.Equal(got, []string{"z added 1", "x added 1", "x added 3"}) {
		t.Errorf("sent %q", got)
	}
}

package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// fakeStream stands in for a JetStream stream on k8s.>: it holds every
// publish until the test answers it, so what the sink has in flight can be
// seen and acknowledged one by one.
type fakeStream struct {
	mu      sync.Mutex
	pending []*natsgo.Msg // received, not answered
	seen    []string      // ce-id of every publish, in order
	most    int           // the most pending at once
	seq     int
	arrived chan struct{}
}

func newFakeStream(t *testing.T, url string) *fakeStream {
	t.Helper()
	nc, err := natsgo.Connect(url)
	must(t, err)
	t.Cleanup(nc.Close)
	f := &fakeStream{arrived: make(chan struct{}, 1)}
	_, err = nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
		f.mu.Lock()
		f.pending = append(f.pending, m)
		f.seen = append(f.seen, m.Header.Get("ce-id"))
		f.most = max(f.most, len(f.pending))
		f.mu.Unlock()
		select {
		case f.arrived <- struct{}{}:
		default:
		}
	})
	must(t, err)
	must(t, nc.Flush())
	return f
}

// waitPending waits until n publishes are pending, then a little longer to
// see that no more come, and returns their ids.
func (f *fakeStream) waitPending(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		f.mu.Lock()
		have := len(f.pending)
		f.mu.Unlock()
		if have >= n {
			break
		}
		select {
		case <-f.arrived:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%d publishes pending, want %d", have, n)
		}
	}
	time.Sleep(50 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, m := range f.pending {
		ids = append(ids, m.Header.Get("ce-id"))
	}
	if len(ids) != n {
		t.Fatalf("pending %v, want %d", ids, n)
	}
	return ids
}

// answer answers the pending publish of id with a PubAck, or with a
// stream's 503 when fail is set.
func (f *fakeStream) answer(t *testing.T, id string, fail bool) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, m := range f.pending {
		if m.Header.Get("ce-id") != id {
			continue
		}
		f.pending = append(f.pending[:i], f.pending[i+1:]...)
		f.seq++
		body := fmt.Sprintf(`{"stream":"FAKE","seq":%d}`, f.seq)
		if fail {
			body = `{"error":{"code":503,"err_code":10074,"description":"no suitable peers for placement"}}`
		}
		must(t, m.Respond([]byte(body)))
		return
	}
	t.Fatalf("%s is not pending", id)
}

func (f *fakeStream) published() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

// connectJS connects a JetStream sink without a stream of its own, with a
// window of maxPending.
func connectJS(t *testing.T, url string, maxPending int) *Sink {
	t.Helper()
	c := sinkConfig(url, true)
	c.Stream = nil
	c.MaxPending = maxPending
	s, err := Connect(context.Background(), "bus", c, nil)
	must(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// sendAsync runs Send in a goroutine; the channel gets its result.
func sendAsync(s *Sink, evs []*event.Event) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Send(context.Background(), evs) }()
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Send did not return")
		return nil
	}
}

// The window bounds the publishes awaiting a PubAck across concurrent
// Sends: with maxPending 4, two batches of 10 objects have 4 events at the
// stream, never more, and each acknowledgement lets one more out.
func TestJetStreamWindowBoundsPending(t *testing.T) {
	srv := startServer(t, 0)
	f := newFakeStream(t, srv.ClientURL())
	s := connectJS(t, srv.ClientURL(), 4)
	var one, two []*event.Event
	for i := range 10 {
		one = append(one, ev("prod", "a"+strconv.Itoa(i), i, 10))
		two = append(two, ev("prod", "b"+strconv.Itoa(i), i, 10))
	}
	done1, done2 := sendAsync(s, one), sendAsync(s, two)
	for acked := 0; acked < 20; acked++ {
		ids := f.waitPending(t, min(4, 20-acked))
		f.answer(t, ids[0], false)
	}
	must(t, result(t, done1))
	must(t, result(t, done2))
	if f.most != 4 {
		t.Errorf("at most %d publishes were pending at once, want 4", f.most)
	}
	if n := len(f.published()); n != 20 {
		t.Errorf("%d publishes for 20 events", n)
	}
}

// An object never has two events in flight: its next event is published
// only once the previous one is acknowledged, and never after the
// previous one failed (the failure is reported for both, retryably).
// Other objects go on meanwhile.
func TestJetStreamOneEventPerObjectInFlight(t *testing.T) {
	srv := startServer(t, 0)
	f := newFakeStream(t, srv.ClientURL())
	s := connectJS(t, srv.ClientURL(), 256)
	a1, b1, a2, c1, a3, b2 := ev("prod", "a", 1, 10), ev("prod", "b", 2, 10), ev("prod", "a", 3, 10), ev("prod", "c", 4, 10), ev("prod", "a", 5, 10), ev("prod", "b", 6, 10)
	done := sendAsync(s, []*event.Event{a1, b1, a2, c1, a3, b2})
	if got := f.waitPending(t, 3); fmt.Sprint(got) != fmt.Sprint([]string{a1.ID, b1.ID, c1.ID}) {
		t.Fatalf("first publishes %v, want the first event of each object: a1 b1 c1", got)
	}
	f.answer(t, a1.ID, false)
	f.waitPending(t, 3) // b1 c1 a2
	f.answer(t, a2.ID, true)
	f.answer(t, b1.ID, false)
	f.waitPending(t, 2) // c1 b2
	f.answer(t, c1.ID, false)
	f.answer(t, b2.ID, false)
	errs := eventErrors(t, result(t, done), 6)
	for i, want := range []bool{false, false, true, false, true, false} {
		if failed := errs[i] != nil; failed != want || sinks.IsPermanent(errs[i]) {
			t.Errorf("event %d: %v, want failed=%v (retryable)", i, errs[i], want)
		}
	}
	for _, id := range f.published() {
		if id == a3.ID {
			t.Error("a3 was published after a2 failed")
		}
	}
}

// A PubAck that never comes times out: the event fails retryably, and the
// batch stops publishing instead of waiting out a timeout per window.
func TestJetStreamPubAckTimeoutStopsBatch(t *testing.T) {
	old := ackTimeout
	ackTimeout = 300 * time.Millisecond
	t.Cleanup(func() { ackTimeout = old })
	srv := startServer(t, 0)
	f := newFakeStream(t, srv.ClientURL())
	s := connectJS(t, srv.ClientURL(), 2)
	var batch []*event.Event
	for i := range 20 {
		batch = append(batch, ev("prod", "o"+strconv.Itoa(i), i, 10))
	}
	start := time.Now()
	done := sendAsync(s, batch)
	f.waitPending(t, 2)
	f.answer(t, batch[1].ID, false) // batch[0] never gets an answer
	errs := eventErrors(t, result(t, done), len(batch))
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Send took %v with a PubAck timeout of 300ms", took)
	}
	if !errors.Is(errs[0], jetstream.ErrAsyncPublishTimeout) {
		t.Errorf("event 0: %v, want a PubAck timeout", errs[0])
	}
	if errs[1] != nil {
		t.Errorf("event 1 was acknowledged: %v", errs[1])
	}
	for i, err := range errs {
		if i > 1 && (err == nil || sinks.IsPermanent(err)) {
			t.Errorf("event %d: %v, want failed retryably, unpublished", i, err)
		}
	}
	if got := f.published(); len(got) != 2 {
		t.Errorf("published %d events, want 2 (the window) before the timeout stopped the batch", len(got))
	}
}

// interleaved returns rounds events for each of objects objects, the
// objects' events interleaved.
func interleaved(src *sinkstest.Source, objects, rounds int) []*event.Event {
	var out []*event.Event
	for range rounds {
		for o := range objects {
			out = append(out, src.Next(o))
		}
	}
	return out
}

// checkSuffixes checks the per-object failure rule of sinks.EventErrors:
// once an object's event failed, its later events of the batch failed too;
// and no failure is permanent. It returns the failed events.
func checkSuffixes(t *testing.T, batch []*event.Event, err error) []*event.Event {
	t.Helper()
	if err == nil {
		t.Fatal("no event failed: the outage came after the batch")
	}
	errs := make([]error, len(batch))
	var ee *sinks.EventErrors
	switch {
	case errors.As(err, &ee) && len(ee.Errs) == len(batch):
		copy(errs, ee.Errs)
	default: // all failed alike
		for i := range errs {
			errs[i] = err
		}
	}
	failedObj := map[string]bool{}
	var failed []*event.Event
	for i, e := range batch {
		switch {
		case errs[i] != nil && sinks.IsPermanent(errs[i]):
			t.Errorf("event %d: %v, want retryable", i, errs[i])
		case errs[i] == nil && failedObj[e.Key()]:
			t.Errorf("event %d of %s acknowledged after an earlier event of the object failed", i, e.Key())
		case errs[i] != nil:
			failedObj[e.Key()] = true
			failed = append(failed, e)
		}
	}
	return failed
}

// resend sends the failed events again until they are all acknowledged.
func resend(t *testing.T, s *Sink, failed []*event.Event) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(failed) > 0 {
		err := s.Send(context.Background(), failed)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resending %d events: %v", len(failed), err)
		}
		var ee *sinks.EventErrors
		if errors.As(err, &ee) {
			var rest []*event.Event
			for i, e := range failed {
				if ee.Errs[i] != nil {
					rest = append(rest, e)
				}
			}
			failed = rest
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopAfter calls stop (once, in its own goroutine) when n messages have
// been published on k8s.>, as a core subscriber sees them.
func stopAfter(t *testing.T, url string, n int, stop func()) *sync.WaitGroup {
	t.Helper()
	nc, err := natsgo.Connect(url)
	must(t, err)
	t.Cleanup(nc.Close)
	var wg sync.WaitGroup
	var once sync.Once
	seen := 0
	_, err = nc.Subscribe("k8s.>", func(*natsgo.Msg) {
		if seen++; seen == n {
			once.Do(func() { wg.Go(stop) })
		}
	})
	must(t, err)
	must(t, nc.Flush())
	return &wg
}

// The server stops in the middle of an asynchronous batch: what was
// acknowledged is in the stream after the restart, what failed failed
// retryably (an object's later events with it), and once sent again every
// event is in the stream, each object's in order.
func TestJetStreamServerStopMidBatch(t *testing.T) {
	t.Parallel() // a NATS server of its own
	srv := testenv.StartNATS(t)
	s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), true), nil)
	must(t, err)
	defer s.Close(context.Background())
	src := sinkstest.NewSource(200)
	batch := interleaved(src, 100, 40)
	stopped := stopAfter(t, srv.ClientURL(), 500, srv.Stop)
	err = s.Send(context.Background(), batch)
	stopped.Wait()
	failed := checkSuffixes(t, batch, err)
	srv.Start(t)
	resend(t, s, failed)
	got := newJSRemote(t, srv, "k8s.>").Received(t)
	failedID := map[string]bool{}
	for _, e := range failed {
		failedID[e.ID] = true
	}
	stored := map[string]bool{}
	for _, r := range got {
		stored[r.ID] = true
	}
	for _, e := range batch {
		if !stored[e.ID] {
			t.Errorf("event %s (failed first: %v) is not in the stream", e.ID, failedID[e.ID])
		}
	}
	sinkstest.Check(t, src, got)
	t.Logf("%d of %d events failed at the stop", len(failed), len(batch))
}

// The stream is deleted in the middle of an asynchronous batch: the events
// it no longer takes fail retryably (no responders), an object's later
// events with them; once the stream is back, sending them again stores
// each object's rest in order.
func TestJetStreamStreamDeletedMidBatch(t *testing.T) {
	// Not parallel: it sets the package's ackTimeout, which every Connect reads.
	old := ackTimeout
	ackTimeout = time.Second // what the stream took as it went away is never answered
	t.Cleanup(func() { ackTimeout = old })
	srv := testenv.StartNATS(t)
	c := sinkConfig(srv.ClientURL(), true)
	s, err := Connect(context.Background(), "bus", c, nil)
	must(t, err)
	defer s.Close(context.Background())
	js, err := jetstream.New(s.Conn())
	must(t, err)
	src := sinkstest.NewSource(200)
	batch := interleaved(src, 100, 40)
	deleted := stopAfter(t, srv.ClientURL(), 500, func() {
		if err := js.DeleteStream(context.Background(), "K8S"); err != nil {
			t.Error(err)
		}
	})
	err = s.Send(context.Background(), batch)
	deleted.Wait()
	failed := checkSuffixes(t, batch, err)
	must(t, s.ensureStream(context.Background(), s.cur.Load().js, c))
	resend(t, s, failed)
	got := newJSRemote(t, srv, "k8s.>").Received(t)
	if len(got) != len(failed) {
		t.Errorf("the new stream holds %d events, want the %d that failed", len(got), len(failed))
	}
	sinkstest.Check(t, src, got)
}

// Many objects, several concurrent Sends (an object's events always in the
// same one, as the delivery loop's workers do): each object's events are
// in the stream in order, once each.
func TestJetStreamConcurrentSendsKeepOrder(t *testing.T) {
	srv := testenv.StartNATS(t)
	c := sinkConfig(srv.ClientURL(), true)
	c.MaxPending = 64
	s, err := Connect(context.Background(), "bus", c, nil)
	must(t, err)
	defer s.Close(context.Background())
	src := sinkstest.NewSource(100)
	var wg sync.WaitGroup
	for w := range 4 {
		var evs []*event.Event
		for range 10 {
			for o := range 50 {
				evs = append(evs, src.Next(w*50+o))
			}
		}
		wg.Go(func() {
			for len(evs) > 0 {
				n := min(len(evs), 256)
				if err := s.Send(context.Background(), evs[:n]); err != nil {
					t.Error(err)
					return
				}
				evs = evs[n:]
			}
		})
	}
	wg.Wait()
	got := newJSRemote(t, srv, "k8s.>").Received(t)
	if dups := sinkstest.Check(t, src, got); dups > 0 || len(got) != 2000 {
		t.Errorf("stream holds %d events (%d duplicates), want 2000", len(got), dups)
	}
}

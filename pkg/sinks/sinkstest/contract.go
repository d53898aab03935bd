// Package sinkstest is the contract every sink must pass, run through a
// delivery loop of its own (Delivery: what the bridge's engine promises a
// sink, without the bridge) against the sink's real far end (an embedded
// NATS server, an HTTP server, a file): success, transient outages,
// permanent refusals, a slow or dead sink under load with bounded memory,
// a restart of the remote, order per object and no loss. It needs nothing
// of the bridge's runtime, so a sink written in another module runs the
// same suite (docs/sdk.md).
package sinkstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Received is one event as the remote holds it.
type Received struct {
	ID      string // the event id: <uid>.<tag>.<resourceVersion>.<type>
	Subject string // namespace/name
}

// Remote is the far end of a sink under test.
type Remote interface {
	// Received lists what the remote holds, in arrival order.
	Received(t testing.TB) []Received
	// Down makes deliveries fail as an outage does; Up ends the outage.
	Down(t testing.TB)
	Up(t testing.TB)
	// Restart stops and starts the remote (what it stored is kept).
	Restart(t testing.TB)
	// Refuse makes the remote refuse every event permanently from now on.
	Refuse(t testing.TB)
}

// Harness builds a sink and its remote for one test.
type Harness struct {
	// New returns a fresh sink (built from cfg as the bridge would) and its remote.
	New func(t testing.TB, cfg config.Sink) (sinks.Sink, Remote)
	// Config is the sink's config block (name, kind); queue and retry are set by the suite.
	Config config.Sink
	// Outages says the remote can go down and come back (false: a local file).
	Outages bool
	// Refusals says the remote can refuse events permanently.
	Refusals bool
	// PerEvent says Send reports a batch's outcome per event
	// (sinks.EventErrors), so an event that cannot be encoded is refused
	// alone. Every sink should; a sink not there yet leaves it false.
	PerEvent bool
}

// Run runs the contract.
func Run(t *testing.T, h Harness) {
	t.Run("delivers in order", func(t *testing.T) { testDelivers(t, h) })
	if h.Outages {
		t.Run("outage loses nothing", func(t *testing.T) { testOutage(t, h) })
		t.Run("remote restart loses nothing", func(t *testing.T) { testRestart(t, h) })
		t.Run("dead sink under load stays bounded", func(t *testing.T) { testBounded(t, h) })
	}
	if h.Refusals {
		t.Run("permanent refusal goes to the dead-letter", func(t *testing.T) { testRefusal(t, h) })
	}
	if h.PerEvent {
		t.Run("a bad event does not fail its neighbours", func(t *testing.T) { testBadEventAlone(t, h) })
	}
}

// Source makes events for objects obj-0 … obj-(n-1), each with a payload of pad bytes.
type Source struct {
	rule *event.Rule
	rv   int
	pad  string
	last map[string]string // subject -> last event id offered
	mu   sync.Mutex
}

// NewSource returns an event source.
func NewSource(pad int) *Source {
	return &Source{
		rule: &event.Rule{Name: "contract", Cluster: "test", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, IncludeObject: true},
		pad:  strings.Repeat("x", pad),
		last: map[string]string{},
	}
}

// Next returns the next event (a new resourceVersion) for object i.
func (s *Source) Next(i int) *event.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "spec": map[string]any{"pad": s.pad}}}
	u.SetNamespace("prod")
	u.SetName("obj-" + strconv.Itoa(i))
	u.SetUID(types.UID("uid-" + strconv.Itoa(i)))
	u.SetResourceVersion(strconv.Itoa(s.rv))
	change := event.Updated
	if _, seen := s.last["prod/obj-"+strconv.Itoa(i)]; !seen {
		change = event.Added
	}
	e := event.New(s.rule, change, u, nil, time.Now())
	s.last[e.Subject] = e.ID
	return e
}

// Unencodable returns an event for object i whose data cannot be encoded
// (a NaN), as a sink's bad event; it does not count as offered.
func (s *Source) Unencodable(i int) *event.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "spec": map[string]any{"replicas": math.NaN()}}}
	u.SetNamespace("prod")
	u.SetName("obj-" + strconv.Itoa(i))
	u.SetUID(types.UID("uid-" + strconv.Itoa(i)))
	u.SetResourceVersion(strconv.Itoa(s.rv))
	return event.New(s.rule, event.Updated, u, nil, time.Now())
}

// Last returns the last id offered per subject.
func (s *Source) Last() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.last))
	for k, v := range s.last {
		out[k] = v
	}
	return out
}

func rvOf(id string) int {
	parts := strings.Split(id, ".")
	if len(parts) < 3 {
		return -1
	}
	n, _ := strconv.Atoi(parts[len(parts)-2])
	return n
}

// Check verifies no loss (every object's final state arrived: its last
// resourceVersion, as added or updated: an unseen object coalesced with its
// updates stays added) and
// order per object (resourceVersions never go back; repeats are allowed:
// delivery is at least once). It returns the number of duplicates.
func Check(t testing.TB, src *Source, got []Received) (duplicates int) {
	t.Helper()
	lastRV := map[string]int{}
	seen := map[string]bool{}
	for _, r := range got {
		if seen[r.ID] {
			// A re-sent batch whose acknowledgement was lost repeats
			// events the destination already took, after later ones
			// maybe: order is promised for first deliveries.
			duplicates++
			continue
		}
		seen[r.ID] = true
		rv := rvOf(r.ID)
		if prev, ok := lastRV[r.Subject]; ok && rv < prev {
			t.Errorf("%s: resourceVersion %d arrived after %d", r.Subject, rv, prev)
		}
		lastRV[r.Subject] = max(rv, lastRV[r.Subject])
	}
	for subject, id := range src.Last() {
		if lastRV[subject] != rvOf(id) {
			t.Errorf("%s: final state (resourceVersion %d) never arrived; last seen %d", subject, rvOf(id), lastRV[subject])
		}
	}
	return duplicates
}

// WaitFor polls until every object's last event arrived or timeout passes.
func WaitFor(t testing.TB, src *Source, remote Remote, timeout time.Duration) []Received {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := remote.Received(t)
		have := map[string]int{} // subject -> highest resourceVersion
		for _, r := range got {
			have[r.Subject] = max(have[r.Subject], rvOf(r.ID))
		}
		missing := 0
		for subject, id := range src.Last() {
			if have[subject] < rvOf(id) {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %d objects still lack their final event (%d events received)", timeout, missing, len(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func suiteConfig(h Harness, capacity int) config.Sink {
	c := h.Config
	c.Queue = config.Queue{Capacity: capacity}
	c.Retry = config.Retry{InitialInterval: config.Duration(5 * time.Millisecond), MaxInterval: config.Duration(100 * time.Millisecond)}
	return c // concurrency as configured: adaptive unless the harness fixes workers
}

func testDelivers(t *testing.T, h Harness) {
	cfg := suiteConfig(h, 10000)
	sink, remote := h.New(t, cfg)
	d := Start(t, cfg, sink, nil)
	src := NewSource(100)
	for i := range 500 {
		d.Offer(src.Next(i % 25))
	}
	got := WaitFor(t, src, remote, 30*time.Second)
	if dups := Check(t, src, got); dups != 0 {
		t.Errorf("%d duplicates without any failure", dups)
	}
	if len(got) != 500 {
		t.Errorf("received %d events, want all 500 (below capacity nothing coalesces)", len(got))
	}
}

func testOutage(t *testing.T, h Harness) {
	cfg := suiteConfig(h, 10000)
	sink, remote := h.New(t, cfg)
	d := Start(t, cfg, sink, nil)
	src := NewSource(100)
	for i := range 100 {
		d.Offer(src.Next(i % 10))
	}
	remote.Down(t)
	for i := range 300 {
		d.Offer(src.Next(i % 10))
	}
	time.Sleep(300 * time.Millisecond) // retries fail meanwhile
	remote.Up(t)
	got := WaitFor(t, src, remote, 60*time.Second)
	dups := Check(t, src, got)
	if s := d.Stats(); s.Retried == 0 {
		t.Errorf("no retries during the outage: %+v", s)
	}
	t.Logf("outage: %d received, %d duplicates", len(got), dups)
}

func testRestart(t *testing.T, h Harness) {
	cfg := suiteConfig(h, 10000)
	sink, remote := h.New(t, cfg)
	d := Start(t, cfg, sink, nil)
	src := NewSource(100)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a steady stream while the remote restarts
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d.Offer(src.Next(i % 50))
			time.Sleep(200 * time.Microsecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	remote.Restart(t)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	got := WaitFor(t, src, remote, 60*time.Second)
	dups := Check(t, src, got)
	t.Logf("restart: %d received, %d duplicates", len(got), dups)
}

// testBounded: while the remote is down, 50,000 updates to 1,000 objects
// arrive; the queue coalesces, so the heap grows with objects, not events;
// when the remote returns, every object's final state arrives.
func testBounded(t *testing.T, h Harness) {
	const objects, updates, capacity, pad = 1000, 50_000, 500, 2048
	cfg := suiteConfig(h, capacity)
	sink, remote := h.New(t, cfg)
	d := Start(t, cfg, sink, nil)
	src := NewSource(pad)
	remote.Down(t)
	time.Sleep(50 * time.Millisecond)
	before := heap()
	for i := range updates {
		d.Offer(src.Next(i % objects))
	}
	after := heap()
	// Each pending event holds about one object (pad bytes plus a few hundred
	// of metadata); unbounded, 50,000 of them would take over 100 MiB.
	perEvent := uint64(pad + 1024)
	limit, _ := cfg.InFlight()
	// Each batch in flight is held outside the queue, and stays out once
	// parked when the destination fails; beside them, one probe batch.
	inFlight := (limit + 1) * sinks.MaxBatch
	bound := uint64(capacity+objects+inFlight) * perEvent * 3
	if after > before && after-before > bound {
		t.Errorf("heap grew by %d MiB for %d pending events; bound from objects is %d MiB", (after-before)>>20, d.Pending(), bound>>20)
	}
	if p := d.Pending(); p > capacity+objects+inFlight {
		t.Errorf("%d events pending, more than capacity + objects + a batch per slot in flight and a probe", p)
	}
	remote.Up(t)
	got := WaitFor(t, src, remote, 120*time.Second)
	Check(t, src, got)
	s := d.Stats()
	t.Logf("bounded: heap +%d KiB, %d coalesced, %d delivered", int64(after-before)>>10, s.Coalesced, s.Delivered)
	if s.Coalesced == 0 {
		t.Error("nothing coalesced")
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// testBadEventAlone: Send gets a batch whose middle event cannot be
// encoded; that event alone is refused, permanently, and its neighbours
// reach the remote and are reported acknowledged.
func testBadEventAlone(t *testing.T, h Harness) {
	cfg := suiteConfig(h, 100)
	sink, remote := h.New(t, cfg)
	t.Cleanup(func() { _ = sink.Close(context.Background()) })
	src := NewSource(10)
	batch := []*event.Event{src.Next(0), src.Unencodable(1), src.Next(2)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := sink.Send(ctx, batch)
	var ee *sinks.EventErrors
	if !errors.As(err, &ee) || len(ee.Errs) != len(batch) {
		t.Fatalf("Send returned %v, want *sinks.EventErrors for %d events", err, len(batch))
	}
	if ee.Errs[0] != nil || ee.Errs[2] != nil {
		t.Errorf("neighbours of the bad event failed: %v", ee.Errs)
	}
	if !sinks.IsPermanent(ee.Errs[1]) {
		t.Errorf("the unencodable event's error %v is not permanent", ee.Errs[1])
	}
	WaitFor(t, src, remote, 10*time.Second)
	for _, r := range remote.Received(t) {
		if r.ID == batch[1].ID {
			t.Error("the unencodable event reached the remote")
		}
	}
}

// RecordingDeadLetter keeps what it is given.
type RecordingDeadLetter struct {
	mu     sync.Mutex
	Events []*event.Event
	Errors []error
}

// Put records the events.
func (r *RecordingDeadLetter) Put(_ context.Context, _ string, events []*event.Event, cause error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Events = append(r.Events, events...)
	r.Errors = append(r.Errors, cause)
	return nil
}

func (r *RecordingDeadLetter) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Events)
}

func testRefusal(t *testing.T, h Harness) {
	cfg := suiteConfig(h, 1000)
	sink, remote := h.New(t, cfg)
	dl := &RecordingDeadLetter{}
	d := Start(t, cfg, sink, dl)
	remote.Refuse(t)
	src := NewSource(10)
	for i := range 5 {
		d.Offer(src.Next(i))
	}
	deadline := time.Now().Add(10 * time.Second)
	for dl.count() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("dead-letter got %d of 5 refused events", dl.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := d.Stats()
	if s.DeadLettered != 5 || s.Failed != 5 {
		t.Errorf("stats %+v, want 5 dead-lettered", s)
	}
	if !sinks.IsPermanent(dl.Errors[0]) {
		t.Errorf("dead-letter error %v is not marked permanent", dl.Errors[0])
	}
	if len(remote.Received(t)) != 0 {
		t.Error("refused events were delivered")
	}
}

// ParseIDs extracts (id, subject) from structured CloudEvents JSON bodies.
func ParseIDs(bodies [][]byte) ([]Received, error) {
	out := make([]Received, 0, len(bodies))
	for _, b := range bodies {
		id, subject, err := idSubject(b)
		if err != nil {
			return nil, err
		}
		out = append(out, Received{ID: id, Subject: subject})
	}
	return out, nil
}

func idSubject(body []byte) (string, string, error) {
	var e struct {
		ID      string `json:"id"`
		Subject string `json:"subject"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return "", "", fmt.Errorf("not a structured CloudEvent: %w", err)
	}
	return e.ID, e.Subject, nil
}

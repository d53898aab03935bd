package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
)

// collector counts the events a receiver got (unique by id) and how long
// each took from the bridge observing the change (the event's time, set
// in the informer handler) to arriving here. It also checks per-object
// order and replays the events into the state a consumer would hold.
type collector struct {
	mu      sync.Mutex
	ids     map[string]struct{}
	lat     []time.Duration
	byType  map[string][]time.Duration // added, updated, deleted (the id's suffix)
	dups    int
	total   int       // every receipt, duplicates included
	last    time.Time // last receipt
	lastNew time.Time // last receipt of an id not seen before
	// order is, per uid, the latest (resourceVersion, type) of its first
	// deliveries; outOfOrder counts first deliveries older than it.
	order      map[string]revision
	outOfOrder int
	// held is what a consumer applying the events by uid holds: uid ->
	// resourceVersion (added/updated put it, deleted removes it).
	held    map[string]string
	arrived chan struct{} // signalled (non-blocking) on every delivery
	// tap, when set before the first receipt, sees every receipt (the
	// handover runs watch for a shard's first event after a kill).
	tap func(id string, now time.Time)
}

// revision orders one object's events: by resourceVersion, and at the same
// resourceVersion added before updated before deleted.
type revision struct {
	rv   uint64
	kind int
}

var typeRank = map[string]int{"added": 0, "updated": 1, "deleted": 2}

func newCollector() *collector {
	return &collector{ids: map[string]struct{}{}, byType: map[string][]time.Duration{}, order: map[string]revision{},
		held: map[string]string{}, arrived: make(chan struct{}, 1)}
}

// record counts one receipt of event id. Duplicates (an id seen before)
// are only counted: a consumer drops them, and they may come after a
// later event of their object (a re-sent batch).
func (c *collector) record(id string, at time.Time, now time.Time) {
	c.mu.Lock()
	c.total++
	c.last = now
	if _, seen := c.ids[id]; seen {
		c.dups++
	} else {
		c.ids[id] = struct{}{}
		c.lastNew = now
		c.lat = append(c.lat, now.Sub(at))
		t := id[strings.LastIndexByte(id, '.')+1:]
		c.byType[t] = append(c.byType[t], now.Sub(at))
		c.apply(id)
	}
	c.mu.Unlock()
	if c.tap != nil {
		c.tap(id, now)
	}
	select {
	case c.arrived <- struct{}{}:
	default:
	}
}

// apply checks a first delivery's order against its object's last one and
// applies it to the held state. Ids are <uid>.<tag>.<resourceVersion>.<type>.
func (c *collector) apply(id string) {
	f := strings.Split(id, ".")
	if len(f) != 4 {
		return
	}
	uid, rv, typ := f[0], f[2], f[3]
	kind, known := typeRank[typ]
	n, err := strconv.ParseUint(rv, 10, 64)
	if rv == "" && typ == "deleted" {
		// The deletion of an incarnation sent but not acknowledged before a
		// crash, found gone on the restart: its resourceVersion is not
		// known, and nothing of its uid comes after it.
		n, err = math.MaxUint64, nil
	}
	if !known || err != nil {
		return
	}
	r := revision{n, kind}
	if prev, ok := c.order[uid]; ok && (r.rv < prev.rv || r.rv == prev.rv && r.kind < prev.kind) {
		c.outOfOrder++
	} else {
		c.order[uid] = r
	}
	if typ == "deleted" {
		delete(c.held, uid)
	} else {
		c.held[uid] = rv
	}
}

func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// holding is how many objects the consumer holds (applied by uid).
func (c *collector) holding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

func (c *collector) receipts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// waitFor waits until n unique events arrived, nothing arrived for stall,
// or the deadline (zero: none) passed; it reports whether all arrived.
func (c *collector) waitFor(n int, stall time.Duration, deadline time.Time) bool {
	for c.unique() < n {
		wait := stall
		if !deadline.IsZero() {
			if left := time.Until(deadline); left <= 0 {
				return false
			} else if left < wait {
				wait = left
			}
		}
		select {
		case <-c.arrived:
		case <-time.After(wait):
			if c.unique() < n && (deadline.IsZero() || time.Now().Before(deadline)) {
				return false // stalled
			}
		}
	}
	return true
}

// ceTimes is what a receiver reads of a structured event.
type ceTimes struct {
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
}

// natsReceiver subscribes to every kubebridge subject on the server. For
// JetStream the stream and this subscription see the same publish.
func natsReceiver(url string, c *collector) (func(), error) {
	nc, err := natsgo.Connect(url)
	if err != nil {
		return nil, err
	}
	sub, err := nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
		now := time.Now()
		at, _ := time.Parse(time.RFC3339Nano, m.Header.Get("ce-time"))
		c.record(m.Header.Get("ce-id"), at, now)
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1) // a slow bench must not drop messages
	}
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return nc.Close, nil
}

// hook is a webhook receiver: it accepts CloudEvents in binary mode
// (ce-* headers), structured mode and batch mode, takes delay per request
// (what a slow destination costs), or answers status without taking
// anything, and keeps count of the requests in flight.
type hook struct {
	*httptest.Server
	c        *collector
	delay    atomic.Int64 // nanoseconds per request
	status   atomic.Int32 // non-zero: refuse every request with this status
	inFlight atomic.Int64
	maxAll   atomic.Int64 // most requests in flight at once, ever
	maxSince atomic.Int64 // the same since the last sample
	requests atomic.Int64
}

// webhookReceiver answers 204 at once.
func webhookReceiver(c *collector) *hook {
	h := &hook{c: c}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	return h
}

func (h *hook) serve(w http.ResponseWriter, r *http.Request) {
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	h.requests.Add(1)
	raiseTo(&h.maxAll, n)
	raiseTo(&h.maxSince, n)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if code := h.status.Load(); code != 0 {
		http.Error(w, "unavailable (bench outage)", int(code))
		return
	}
	var evs []ceTimes
	switch {
	case r.Header.Get("ce-id") != "": // binary mode
		at, _ := time.Parse(time.RFC3339Nano, r.Header.Get("ce-time"))
		evs = append(evs, ceTimes{ID: r.Header.Get("ce-id"), Time: at})
	case bytes.HasPrefix(body, []byte("[")):
		err = json.Unmarshal(body, &evs)
	default:
		var e ceTimes
		err = json.Unmarshal(body, &e)
		evs = append(evs, e)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if d := time.Duration(h.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return // the bridge gave up on this request: not taken
		}
	}
	// Recorded before the answer: the bridge sends an object's next event
	// only after this one was acknowledged, so receipts keep its order.
	now := time.Now()
	for _, e := range evs {
		h.c.record(e.ID, e.Time, now)
	}
	w.WriteHeader(http.StatusNoContent)
}

// raiseTo sets m to n if n is larger.
func raiseTo(m *atomic.Int64, n int64) {
	for {
		cur := m.Load()
		if n <= cur || m.CompareAndSwap(cur, n) {
			return
		}
	}
}

// fileReceiver follows a file sink's output, polling every millisecond
// (so its latencies include up to 1 ms of polling), until stop is closed.
func fileReceiver(path string, c *collector, stop <-chan struct{}) error {
	var f *os.File
	for f == nil {
		var err error
		if f, err = os.Open(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if f == nil {
			select {
			case <-stop:
				return nil
			case <-time.After(time.Millisecond):
			}
		}
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var partial []byte
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			partial = append(partial, line...)
		}
		if err == nil {
			var e ceTimes
			if json.Unmarshal(partial, &e) == nil {
				c.record(e.ID, e.Time, time.Now())
			}
			partial = partial[:0]
			continue
		}
		if err != io.EOF {
			return err
		}
		select {
		case <-stop:
			return nil
		case <-time.After(time.Millisecond):
		}
	}
}

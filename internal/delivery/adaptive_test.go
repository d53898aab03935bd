package delivery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// clocked is a limiter on a fake clock, driven round by round: a round
// starts as many sends as the limit allows (or fewer), lets rtt pass, and
// ends them all with one outcome.
type clocked struct {
	*limiter
	t time.Time
}

func newClocked(ceiling int, adaptive bool) *clocked {
	c := &clocked{limiter: newLimiter(ceiling, adaptive), t: time.Unix(1000, 0)}
	c.now = func() time.Time { return c.t }
	return c
}

func (c *clocked) round(t *testing.T, sends int, rtt time.Duration, o sendOutcome) {
	t.Helper()
	if limit, _ := c.concurrency(); sends <= 0 || sends > limit {
		sends = limit
	}
	starts := make([]time.Time, sends)
	for i := range starts {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a permit must be free: never wait
		var err error
		if starts[i], err = c.acquire(ctx); err != nil {
			t.Fatalf("send %d of %d: no permit (%v)", i+1, sends, err)
		}
	}
	c.t = c.t.Add(rtt)
	for _, s := range starts {
		c.release(s, o)
	}
}

func (c *clocked) limit() int { l, _ := c.concurrency(); return l }

// Flat round trips double the limit per round trip until its first
// decrease (slow start), then grow it by one, up to the ceiling and no
// further; a rise shrinks it; push-back shrinks it every round trip to 1
// and no lower; a limit that was not reached does not grow.
func TestLimiterAIMD(t *testing.T) {
	c := newClocked(32, true)
	if c.limit() != 1 {
		t.Fatalf("initial limit %d, want 1", c.limit())
	}
	c.round(t, 0, 20*time.Millisecond, sendOK) // the first round only sets the reference
	for i, want := range []int{2, 4, 8, 16, 32, 32, 32} {
		c.round(t, 0, 20*time.Millisecond, sendOK)
		if c.limit() != want {
			t.Fatalf("round %d: limit %d, want %d (slow start doubles it per flat round trip, up to the ceiling)", i+1, c.limit(), want)
		}
	}

	// Round trips twice as long: more concurrency only queued requests.
	c.round(t, 0, 40*time.Millisecond, sendOK)
	if l := c.limit(); l != 28 {
		t.Errorf("after RTT doubled: limit %d, want 28 (32 * 0.9)", l)
	}
	// Rising further and further: it keeps shrinking.
	rtt := 40 * time.Millisecond
	for range 10 {
		rtt = rtt * 2
		c.round(t, 0, rtt, sendOK)
	}
	if l := c.limit(); l > 20 {
		t.Errorf("limit %d after RTTs kept rising, want it well below 28", l)
	}

	// Push-back (429, 503, timeouts): down every round trip, to 1 at least.
	for range 40 {
		before := c.limit()
		c.round(t, 0, rtt, sendBackPressure)
		c.round(t, 0, rtt, sendOK) // the window ends with the next response
		if l := c.limit(); l >= before && before > 1 {
			t.Fatalf("push-back left the limit at %d", l)
		}
	}
	if c.limit() != 1 {
		t.Fatalf("limit %d after 40 pushed-back round trips, want 1", c.limit())
	}
	for range 5 {
		c.round(t, 0, rtt, sendBackPressure)
	}
	if c.limit() != 1 {
		t.Fatalf("limit %d: below 1 is no delivery at all", c.limit())
	}

	// Recovering after decreases, round trips shorter again: one more per
	// round trip, no doubling.
	c.round(t, 0, rtt/2, sendOK) // the window of the last push-back ends
	start := c.limit()
	for i := range 12 {
		before := c.limit()
		c.round(t, 0, rtt/2, sendOK)
		if l := c.limit(); l > before+1 {
			t.Fatalf("recovery round %d: limit %d -> %d, want at most +1 (slow start is over)", i, before, l)
		}
	}
	if l := c.limit(); l < start+3 {
		t.Fatalf("limit %d -> %d after 12 faster round trips, want growth", start, l)
	}
	// Sending less than the limit allows: no evidence that more would be
	// taken, so no growth past what was used.
	for range 14 {
		c.round(t, 0, rtt, sendOK)
	}
	reached := c.limit()
	for range 20 {
		c.round(t, reached-1, rtt, sendOK)
	}
	if l := c.limit(); l > reached {
		t.Errorf("limit grew from %d to %d while never reached", reached, l)
	}

	// Refusals (permanent) say nothing about load.
	before := c.limit()
	for range 5 {
		c.round(t, 0, rtt, sendIgnored)
	}
	if l := c.limit(); l < before {
		t.Errorf("permanent refusals shrank the limit from %d to %d", before, l)
	}
}

// Jittery but flat round trips still grow the limit (the deviation
// absorbs the noise); workers fixes the limit whatever happens.
func TestLimiterNoiseAndFixed(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := newClocked(64, true)
	for range 400 {
		c.round(t, 0, time.Duration(18+rng.IntN(5))*time.Millisecond, sendOK)
	}
	if l := c.limit(); l < 40 {
		t.Errorf("limit %d after 400 round trips of 18-22 ms, want it near the ceiling 64", l)
	}

	f := newClocked(7, false)
	for i := range 100 {
		o := []sendOutcome{sendOK, sendBackPressure, sendIgnored}[i%3]
		f.round(t, 0, time.Duration(1+i)*time.Millisecond, o)
		if l := f.limit(); l != 7 {
			t.Fatalf("fixed limit moved to %d", l)
		}
	}
}

// A send waits for a permit while the limit is used up, and gets one when
// a send ends; a batch slot likewise.
func TestLimiterWaits(t *testing.T) {
	l := newLimiter(2, false)
	ctx := context.Background()
	s1, _ := l.acquire(ctx)
	s2, _ := l.acquire(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := l.acquire(ctx)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a third send started at limit 2 (%v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	l.release(s1, sendOK)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if limit, inFlight := l.concurrency(); limit != 2 || inFlight != 2 {
		t.Errorf("concurrency %d/%d, want 2 in flight of 2", inFlight, limit)
	}
	l.release(s2, sendOK)

	if alone, err := l.reserve(ctx); err != nil || alone {
		t.Fatal(alone, err)
	}
	if _, err := l.reserve(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := l.reserve(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a third batch slot at limit 2: %v", err)
	}
}

func TestOutcomeOf(t *testing.T) {
	ctx := context.Background()
	cut, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want sendOutcome
	}{
		{ctx, nil, sendOK},
		{ctx, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, sendBackPressure},
		{ctx, sinks.Unavailable(errors.New("503")), sendBackPressure},
		{ctx, sinks.Throttle(errors.New("429"), time.Second), sendBackPressure},
		{ctx, fmt.Errorf("POST: %w", context.DeadlineExceeded), sendBackPressure},
		// One object's payload, or a config to fix: no sign of load.
		{ctx, errors.New("500 internal error"), sendIgnored},
		{ctx, sinks.Destination(sinks.ReasonUnauthorized, errors.New("401")), sendIgnored},
		{ctx, sinks.Permanent(errors.New("400")), sendIgnored},
		{ctx, &sinks.EventErrors{Errs: []error{nil, sinks.Permanent(errors.New("too large"))}}, sendOK},
		{ctx, &sinks.EventErrors{Errs: []error{sinks.Permanent(errors.New("too large")), errors.New("500")}}, sendIgnored},
		{ctx, &sinks.EventErrors{Errs: []error{sinks.Permanent(errors.New("too large")), sinks.Unavailable(errors.New("503"))}}, sendBackPressure},
		{cut, context.Canceled, sendIgnored},
	} {
		if got := outcomeOf(c.ctx, c.err); got != c.want {
			t.Errorf("outcomeOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// server is a fake destination: each Send takes latency (or fails), one
// request per event (a Batcher of 1, like a webhook without batch). It
// fails the test if an object is ever in two sends at once, and records
// how many sends overlapped.
type server struct {
	t       *testing.T
	batch   int
	mu      sync.Mutex
	busy    map[string]bool
	cur     int
	latency func(cur int) (time.Duration, error)
	peak    int
	got     []*event.Event
	limits  func() int // the delivery's limit, sampled at each send
	peakLim int
}

func newServer(t *testing.T, latency time.Duration) *server {
	return &server{t: t, batch: 1, busy: map[string]bool{}, latency: func(int) (time.Duration, error) { return latency, nil }}
}

func (s *server) Batching() (int, time.Duration) { return s.batch, 0 }

func (s *server) Send(ctx context.Context, evs []*event.Event) error {
	s.mu.Lock()
	for _, e := range evs {
		if s.busy[e.Key()] {
			s.t.Errorf("object %s is in two sends at once", e.Key())
		}
	}
	for _, e := range evs {
		s.busy[e.Key()] = true
	}
	s.cur++
	cur := s.cur
	s.peak = max(s.peak, cur)
	if s.limits != nil {
		s.peakLim = max(s.peakLim, s.limits())
	}
	latency := s.latency
	s.mu.Unlock()
	d, err := latency(cur)
	select {
	case <-time.After(d):
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range evs {
		delete(s.busy, e.Key())
	}
	s.cur--
	if err == nil {
		s.got = append(s.got, evs...)
	}
	return err
}

func (s *server) Close(context.Context) error { return nil }

func (s *server) set(latency func(cur int) (time.Duration, error)) {
	s.mu.Lock()
	s.latency = latency
	s.mu.Unlock()
}

// peaks returns the most sends seen at once and the highest limit seen
// at a send since the last call, and resets both.
func (s *server) peaks() (sends, limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sends, limit = s.peak, s.peakLim
	s.peak, s.peakLim = 0, 0
	return sends, limit
}

func (s *server) received() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func adaptiveConfig(capacity int) config.Sink {
	return config.Sink{Name: "s", Queue: config.Queue{Capacity: capacity},
		Retry: config.Retry{InitialInterval: config.Duration(5 * time.Millisecond), MaxInterval: config.Duration(50 * time.Millisecond)}}
}

// offerSteadily offers rate events a second over keys objects until stop,
// with increasing resourceVersions per object; it returns how many.
func offerSteadily(d *Delivery, rate, objects int, stop <-chan struct{}) int {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-stop:
			return n
		case <-tick.C:
		}
		for range rate / 100 {
			d.Offer(ev(fmt.Sprint("o", n%objects), strconv.Itoa(n+1), event.Updated))
			n++
		}
	}
}

// Into a destination that takes 20 ms per request, offered 1,000 events a
// second, the default (adaptive) delivery grows past 10 requests in flight
// and keeps up; when the destination slows to 200 ms the limit falls; when
// it then refuses (429) above 4 requests at once the limit settles near 4;
// and sends never exceed the limit.
func TestAdaptiveConcurrencyFollowsTheDestination(t *testing.T) {
	srv := newServer(t, 20*time.Millisecond)
	d := New(Options{Config: adaptiveConfig(100_000), Sink: srv})
	srv.limits = func() int { l, _ := d.Concurrency(); return l }
	stop := run(t, d)
	defer stop()
	stopOffers := make(chan struct{})
	offered := make(chan int, 1)
	go func() { offered <- offerSteadily(d, 1000, 2000, stopOffers) }()
	defer func() { close(stopOffers); <-offered }()

	// 20 ms: grows until it keeps up (1,000/s * 20 ms = 20 in flight).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if sends, _ := srv.peaks(); sends > 10 && d.Pending() < 100 {
			break
		}
		if time.Now().After(deadline) {
			l, in := d.Concurrency()
			t.Fatalf("after 10 s at 20 ms: limit %d, %d in flight, %d pending: not keeping up with 1,000 events/s", l, in, d.Pending())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if p := d.Pending(); p > 200 {
		t.Errorf("%d events pending after a second at the offered rate: not keeping up", p)
	}
	peakLimit, _ := d.Concurrency()
	t.Logf("20 ms: limit %d, %d pending", peakLimit, d.Pending())

	// 200 ms for everyone: round trips rose tenfold, the limit falls.
	srv.set(func(int) (time.Duration, error) { return 200 * time.Millisecond, nil })
	lowest := peakLimit
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		l, _ := d.Concurrency()
		lowest = min(lowest, l)
	}
	if lowest >= peakLimit {
		t.Errorf("the limit stayed at %d when round trips went from 20 to 200 ms", peakLimit)
	}

	// 200 ms, and 429 above 4 at once: it backs off to about 4.
	srv.set(func(cur int) (time.Duration, error) {
		if cur > 4 {
			return time.Millisecond, sinks.Throttle(errors.New("429 too many requests"), 0)
		}
		return 200 * time.Millisecond, nil
	})
	time.Sleep(4 * time.Second)
	srv.peaks()
	var limits []int
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		l, _ := d.Concurrency()
		limits = append(limits, l)
	}
	sends, seenLimit := srv.peaks()
	mean := 0.0
	for _, l := range limits {
		mean += float64(l) / float64(len(limits))
	}
	t.Logf("200 ms, 429 above 4: mean limit %.1f, most sends at once %d, highest limit at a send %d", mean, sends, seenLimit)
	if mean > 10 {
		t.Errorf("mean limit %.1f against a destination that refuses more than 4 at once", mean)
	}
	if sends > seenLimit {
		t.Errorf("%d sends at once, above every limit in force (at most %d)", sends, seenLimit)
	}
}

// workers fixes the number in flight: exactly N at once under load, never
// more, never adapted.
func TestWorkersFixTheConcurrency(t *testing.T) {
	srv := newServer(t, 5*time.Millisecond)
	cfg := adaptiveConfig(10_000)
	cfg.Workers = 6
	d := New(Options{Config: cfg, Sink: srv})
	srv.limits = func() int { l, _ := d.Concurrency(); return l }
	for i := range 600 {
		d.Offer(ev(fmt.Sprint("o", i%100), strconv.Itoa(i+1), event.Updated))
	}
	d.Close()
	d.Run(context.Background())
	if sends, limit := srv.peaks(); sends != 6 || limit != 6 {
		t.Errorf("workers 6: %d sends at once, limit %d; want exactly 6", sends, limit)
	}
	if srv.received() != 600 {
		t.Errorf("received %d of 600", srv.received())
	}
}

// Per-object order under concurrency: many objects, random batch sizes,
// latencies and retryable failures (whole sends and single events), a
// queue small enough to coalesce. For every object, the destination takes
// strictly increasing versions and ends with the last one offered; no
// object is ever in two sends at once (the server checks).
func TestOrderPerObjectUnderConcurrency(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 14))
			var rngMu sync.Mutex
			random := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }
			srv := newServer(t, 0)
			srv.batch = 1 + random(8)
			srv.set(func(int) (time.Duration, error) {
				d := time.Duration(random(3000)) * time.Microsecond
				if random(10) == 0 {
					return d, errors.New("503 unavailable")
				}
				return d, nil
			})
			flaky := &perEventFlaky{server: srv, random: random}
			var ackMu sync.Mutex
			ackedAt := map[string]int{}
			// The checkpoint hooks: an intent before a batch's first send
			// (failing now and then), acknowledgements in order per object.
			hooks := Hooks{
				BeforeSend: func(_ context.Context, evs []*event.Event) error {
					if random(20) == 0 {
						return errors.New("checkpoint store unavailable")
					}
					for _, e := range evs {
						flaky.intended.Store(e.ID, true)
					}
					return nil
				},
				OnAck: func(evs []*event.Event) {
					ackMu.Lock()
					defer ackMu.Unlock()
					for _, e := range evs {
						rv, _ := strconv.Atoi(e.Object().GetResourceVersion())
						if rv <= ackedAt[e.Key()] {
							t.Errorf("OnAck: %s version %d after %d", e.Key(), rv, ackedAt[e.Key()])
						}
						ackedAt[e.Key()] = rv
					}
				},
			}
			d := New(Options{Config: adaptiveConfig(50 + random(200)), Sink: flaky, Hooks: hooks})
			stop := run(t, d)
			last := map[string]int{}
			for i := range 5000 {
				name := fmt.Sprint("o", random(300))
				d.Offer(ev(name, strconv.Itoa(i+1), event.Updated))
				last["r/ns/"+name] = i + 1
				if random(500) == 0 {
					time.Sleep(time.Duration(random(5)) * time.Millisecond)
				}
			}
			d.Close()
			select {
			case <-d.Done():
			case <-time.After(60 * time.Second):
				t.Fatal("not drained in 60 s")
			}
			stop()
			seen := map[string]int{}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			for _, e := range srv.got {
				rv, _ := strconv.Atoi(e.Object().GetResourceVersion())
				if rv <= seen[e.Key()] {
					t.Fatalf("%s: version %d after %d", e.Key(), rv, seen[e.Key()])
				}
				seen[e.Key()] = rv
			}
			for k, rv := range last {
				if seen[k] != rv {
					t.Errorf("%s ended at version %d, want %d", k, seen[k], rv)
				}
			}
			l, _ := d.Concurrency()
			t.Logf("batch %d, %d events taken, %d coalesced, %d retried, limit %d", srv.batch, len(srv.got), d.Stats().Queue.Coalesced, d.Stats().Retried, l)
		})
	}
}

// perEventFlaky fails single events of a send now and then (EventErrors),
// as a sink that publishes one by one does: after a retryable failure it
// takes none of the batch's later events of that object.
type perEventFlaky struct {
	*server
	random   func(int) int
	intended sync.Map // event ids BeforeSend recorded
}

func (p *perEventFlaky) Send(ctx context.Context, evs []*event.Event) error {
	for _, e := range evs {
		if _, ok := p.intended.Load(e.ID); !ok {
			p.t.Errorf("%s sent before its batch's intent", e.ID)
		}
	}
	if len(evs) < 2 || p.random(10) != 0 {
		return p.server.Send(ctx, evs)
	}
	cut := 1 + p.random(len(evs)-1)
	errs := make([]error, len(evs))
	if err := p.server.Send(ctx, evs[:cut]); err != nil {
		return err
	}
	for i := cut; i < len(evs); i++ {
		errs[i] = errors.New("not sent after an earlier failure")
	}
	return &sinks.EventErrors{Errs: errs}
}

// While the sink is down, objects created and deleted (fresh added, then
// deleted) cancel out in the queue: pending stays within capacity however
// many go by, plus the objects the probes took (one every other probe:
// they were sent, so the sink may hold them and their deletions stay). An
// added of an object the sink may hold (not fresh) keeps its deletion; it
// is delivered once the sink is back.
func TestFreshPairsCancelDuringAnOutage(t *testing.T) {
	const capacity = 100
	var down atomic.Bool
	down.Store(true)
	srv := newServer(t, 0)
	srv.set(func(int) (time.Duration, error) {
		if down.Load() {
			return 0, sinks.Unavailable(errors.New("connection refused"))
		}
		return 0, nil
	})
	var acked atomic.Int64
	d := New(Options{Config: adaptiveConfig(capacity), Sink: srv, Hooks: Hooks{OnAck: func(evs []*event.Event) { acked.Add(int64(len(evs))) }}})
	stop := run(t, d)
	defer stop()
	for i := range 20_000 {
		name := fmt.Sprint("churn-", i)
		d.Offer(freshAdded(name, "1"))
		d.Offer(ev(name, "2", event.Deleted))
		// Capacity, plus the batch in flight (one event), plus the deletion
		// of the pair that straddled the end of the ordered part, plus the
		// probes' objects (two events each).
		if st := d.Stats(); st.Pending > capacity+2+2*st.Parked+2 {
			t.Fatalf("after %d created-and-deleted objects: %d pending, %d objects parked, capacity %d", i+1, st.Pending, st.Parked, capacity)
		}
	}
	d.Offer(ev("kept", "1", event.Added)) // not fresh: the sink may hold an older incarnation
	d.Offer(ev("kept", "2", event.Deleted))
	st := d.Stats()
	if st.Queue.Cancelled == 0 || st.Pending > capacity+3+2*st.Parked+2 || st.Parked > 200 {
		t.Fatalf("stats %+v", st)
	}
	down.Store(false)
	waitFor(t, func() bool { return d.Pending() == 0 })
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var kept []string
	for _, e := range srv.got {
		if e.Name() == "kept" {
			kept = append(kept, string(e.Change))
		}
	}
	if fmt.Sprint(kept) != "[deleted]" {
		t.Errorf("kept: delivered %v, want its deletion (the added coalesced into it)", kept)
	}
	st = d.Stats()
	if n := uint64(len(srv.got)) + st.Queue.Cancelled + st.Queue.Coalesced; n != 40_002 {
		t.Errorf("delivered %d + cancelled %d + coalesced %d != offered 40,002", len(srv.got), st.Queue.Cancelled, st.Queue.Coalesced)
	}
	if acked.Load() != int64(len(srv.got)) {
		t.Errorf("OnAck saw %d events, delivered %d", acked.Load(), len(srv.got))
	}
}

package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/internal/delivery/deliverytest"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// receiver is a real HTTP server on a fixed loopback port that can be
// stopped and started again (connection refused meanwhile), refuse events
// (400), or fail at random (500).
type receiver struct {
	mu      sync.Mutex
	got     []sinkstest.Received
	bodies  [][]byte
	headers []http.Header
	refuse  bool
	flaky   float64 // probability of a 500
	retryAt string  // Retry-After sent with 503s while set
	fail503 int     // respond 503 this many times

	addr string
	srv  *http.Server
	wg   sync.WaitGroup
}

func newReceiver(t testing.TB) *receiver {
	r := &receiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	r.Up(t)
	t.Cleanup(func() { r.Down(t) })
	return r
}

func (r *receiver) URL() string { return "http://" + r.addr + "/events" }

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.refuse:
		http.Error(w, "schema mismatch", http.StatusBadRequest)
		return
	case r.fail503 > 0:
		r.fail503--
		if r.retryAt != "" {
			w.Header().Set("Retry-After", r.retryAt)
		}
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	case r.flaky > 0 && rand.Float64() < r.flaky:
		http.Error(w, "flaky", http.StatusInternalServerError)
		return
	}
	r.bodies = append(r.bodies, body)
	r.headers = append(r.headers, req.Header.Clone())
	switch ct := req.Header.Get("Content-Type"); ct {
	case "application/cloudevents-batch+json":
		var batch []json.RawMessage
		if err := json.Unmarshal(body, &batch); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		raws := make([][]byte, len(batch))
		for i, b := range batch {
			raws[i] = b
		}
		got, err := sinkstest.ParseIDs(raws)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		r.got = append(r.got, got...)
	case "application/cloudevents+json":
		got, err := sinkstest.ParseIDs([][]byte{body})
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		r.got = append(r.got, got...)
	default: // binary mode
		r.got = append(r.got, sinkstest.Received{ID: req.Header.Get("ce-id"), Subject: req.Header.Get("ce-subject")})
	}
	w.WriteHeader(http.StatusAccepted)
}

func (r *receiver) Received(testing.TB) []sinkstest.Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sinkstest.Received(nil), r.got...)
}

func (r *receiver) Down(t testing.TB) {
	if r.srv == nil {
		return
	}
	_ = r.srv.Close()
	r.wg.Wait()
	r.srv = nil
}

func (r *receiver) Up(t testing.TB) {
	var l net.Listener
	var err error
	for range 50 { // the port may linger a moment after Close
		if l, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = r.srv.Serve(l)
	}()
}

func (r *receiver) Restart(t testing.TB) { r.Down(t); r.Up(t) }

func (r *receiver) Refuse(testing.TB) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse = true
}

func harness(mode string, batch *Batch) sinkstest.Harness {
	return sinkstest.Harness{
		Config:   config.Sink{Name: "hook"},
		Outages:  true,
		Refusals: true,
		PerEvent: true,
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			r := newReceiver(t)
			s, err := New(&Config{URL: r.URL(), Mode: mode, Timeout: config.Duration(5 * time.Second), Batch: batch}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, r
		},
	}
}

func TestContractBinary(t *testing.T)     { sinkstest.Run(t, harness("binary", nil)) }
func TestContractStructured(t *testing.T) { sinkstest.Run(t, harness("structured", nil)) }
func TestContractBatch(t *testing.T) {
	sinkstest.Run(t, harness("binary", &Batch{MaxEvents: 100, MaxWait: config.Duration(20 * time.Millisecond)}))
}

// The receiver fails half the requests at random, then is down for 30 s,
// then comes back: every object's final state arrives, in order per
// object, nothing is lost; duplicates are only of events in flight. The
// engine runs on a fake clock, 20 times the test's pace: its retries,
// probes and the outage are in its time (the receiver is a real one).
func TestFlakyThenDownThenBack(t *testing.T) {
	outage := 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("KUBEBRIDGE_TEST_OUTAGE")); err == nil {
		outage = d
	}
	h := harness("binary", &Batch{MaxEvents: 50, MaxWait: config.Duration(10 * time.Millisecond)})
	cfg := h.Config
	cfg.Queue.Capacity = 10000 // adaptive concurrency: the default
	cfg.Retry = config.Retry{InitialInterval: config.Duration(10 * time.Millisecond), MaxInterval: config.Duration(2 * time.Second)}
	sink, remote := h.New(t, cfg)
	r := remote.(*receiver)
	clk := clocktesting.NewFakeClock(time.Now())
	d := delivery.New(delivery.Options{Config: cfg, Sink: sink, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	wg.Go(func() { // the engine's time
		for ctx.Err() == nil {
			time.Sleep(time.Millisecond)
			clk.Step(20 * time.Millisecond)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = sink.Close(context.Background())
	})
	wait := func(d time.Duration) { // in the engine's time
		for start := clk.Now(); clk.Since(start) < d; {
			time.Sleep(time.Millisecond)
		}
	}
	src := sinkstest.NewSource(200)
	r.mu.Lock()
	r.flaky = 0.5
	r.mu.Unlock()
	for i := range 2000 {
		d.Offer(src.Next(i % 200))
		if i%100 == 0 {
			wait(5 * time.Millisecond)
		}
	}
	wait(500 * time.Millisecond)
	r.Down(t)
	for i := range 2000 {
		d.Offer(src.Next(i % 200))
	}
	wait(outage)
	r.mu.Lock()
	r.flaky = 0
	r.mu.Unlock()
	r.Up(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stats at failure: %+v", d.Stats())
		}
	})
	got := sinkstest.WaitFor(t, src, r, 60*time.Second)
	dups := sinkstest.Check(t, src, got)
	s := d.Stats()
	t.Logf("received %d, duplicates %d, retried %d batches, coalesced %d", len(got), dups, s.Retried, s.Queue.Coalesced)
	// A duplicate is an event resent after a failed request that the receiver
	// had in fact stored; with batches of at most 50 that bounds them by retries × 50.
	if uint64(dups) > s.Retried*50 {
		t.Errorf("%d duplicates, more than the %d events that were ever in flight when a request failed", dups, s.Retried*50)
	}
}

// Into a receiver that takes 20 ms per request, with the default config
// (one event per request, adaptive concurrency), 500 events of 100 objects
// arrive in order per object, many requests at once, far sooner than the
// 10 s that one request at a time takes.
func TestAdaptiveConcurrencyInto20msReceiver(t *testing.T) {
	var mu sync.Mutex
	var got []sinkstest.Received
	cur, peak := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		cur++
		peak = max(peak, cur)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		cur--
		got = append(got, sinkstest.Received{ID: r.Header.Get("ce-id"), Subject: r.Header.Get("ce-subject")})
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()

	var cfg config.Sink
	cfg.SetDefaults()
	cfg.Name, cfg.Type = "hook", "webhook"
	spec := Factory.NewConfig().(*Config)
	spec.URL = srv.URL
	cfg.Spec = spec
	sink, err := Factory.Create(context.Background(), sinks.SettingsFor(cfg, nil))
	if err != nil {
		t.Fatal(err)
	}
	d := deliverytest.Start(t, cfg, sink, nil) // what is tested is the engine's adaptive concurrency
	src := sinkstest.NewSource(100)
	start := time.Now()
	for i := range 500 {
		d.Offer(src.Next(i % 100))
	}
	remote := remoteFunc(func() []sinkstest.Received {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	})
	all := sinkstest.WaitFor(t, src, remote, 30*time.Second)
	took := time.Since(start)
	if dups := sinkstest.Check(t, src, all); dups != 0 || len(all) != 500 {
		t.Errorf("received %d events, %d duplicates; want the 500 once each", len(all), dups)
	}
	limit, _ := d.Concurrency()
	t.Logf("500 events in %s, up to %d requests at once, limit %d", took.Round(time.Millisecond), peak, limit)
	if took > 4*time.Second {
		t.Errorf("took %s: one request at a time takes 10 s, adaptive concurrency should take about 1", took)
	}
	if peak < 8 {
		t.Errorf("at most %d requests at once", peak)
	}
}

// remoteFunc is a Remote that only lists what it received.
type remoteFunc func() []sinkstest.Received

func (f remoteFunc) Received(testing.TB) []sinkstest.Received { return f() }
func (remoteFunc) Down(testing.TB)                            {}
func (remoteFunc) Up(testing.TB)                              {}
func (remoteFunc) Restart(testing.TB)                         {}
func (remoteFunc) Refuse(testing.TB)                          {}

// Retry-After on a 503 is honoured (up to the retry maxInterval).
func TestRetryAfter(t *testing.T) {
	h := harness("binary", nil)
	cfg := h.Config
	cfg.Queue.Capacity = 10
	cfg.Workers = 1
	cfg.Retry = config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(5 * time.Second)}
	sink, remote := h.New(t, cfg)
	r := remote.(*receiver)
	r.mu.Lock()
	r.fail503, r.retryAt = 1, "1"
	r.mu.Unlock()
	d := sinkstest.Start(t, cfg, sink, nil)
	src := sinkstest.NewSource(10)
	start := time.Now()
	d.Offer(src.Next(0))
	sinkstest.WaitFor(t, src, r, 10*time.Second)
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Errorf("delivered after %s, before Retry-After: 1", el)
	}
}

// Verification recipe (v1) from docs/sinks.md, written independently of
// the sink: parse t and v1, recompute HMAC-SHA256(secret, t + "." + body),
// compare in constant time, and reject stale timestamps.
func verifyV1(secret []byte, header string, body []byte, now time.Time) error {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("stale timestamp")
	}
	want := hmac.New(sha256.New, secret)
	want.Write([]byte(ts + "."))
	want.Write(body)
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, want.Sum(nil)) {
		return errors.New("signature mismatch")
	}
	return nil
}

// verifyV2 is the v2 recipe of docs/sinks.md, written independently of
// the sink: HMAC-SHA256 over "<t>\n", each ce-* header as "name:value\n"
// (lowercased names, sorted, values as received), "\n", then the body.
func verifyV2(secret []byte, h http.Header, body []byte, now time.Time) error {
	var ts, sig string
	for _, part := range strings.Split(h.Get("X-Kubebridge-Signature"), ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v2":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("stale timestamp")
	}
	var lines []string
	for name, values := range h {
		if name = strings.ToLower(name); strings.HasPrefix(name, "ce-") {
			if len(values) != 1 {
				return fmt.Errorf("header %s repeated", name)
			}
			lines = append(lines, name+":"+values[0]+"\n")
		}
	}
	sort.Strings(lines)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "\n" + strings.Join(lines, "") + "\n"))
	mac.Write(body)
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return errors.New("signature mismatch")
	}
	return nil
}

func TestSignatureVerifiesWithTheRecipe(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "hmac")
	if err := os.WriteFile(secretFile, []byte("s3cr3t-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t)
	s, err := New(&Config{URL: r.URL(), Mode: "binary", Timeout: config.Duration(5 * time.Second),
		SigningSecretFile: secretFile, BearerTokenFile: tokenFile, Headers: map[string]string{"X-Team": "platform"}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	src := sinkstest.NewSource(50)
	for i := range 3 {
		if err := s.Send(context.Background(), []*event.Event{src.Next(i)}); err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bodies) != 3 {
		t.Fatalf("%d requests", len(r.bodies))
	}
	for i, body := range r.bodies {
		h := r.headers[i]
		if err := verifyV1([]byte("s3cr3t-key"), h.Get(SignatureHeader), body, time.Now()); err != nil {
			t.Errorf("request %d: %v (header %q)", i, err, h.Get(SignatureHeader))
		}
		if err := verifyV1([]byte("wrong"), h.Get(SignatureHeader), body, time.Now()); err == nil {
			t.Error("a wrong secret verified")
		}
		if err := verifyV1([]byte("s3cr3t-key"), h.Get(SignatureHeader), append(body, ' '), time.Now()); err == nil {
			t.Error("a tampered body verified")
		}
		if err := verifyV2([]byte("s3cr3t-key"), h, body, time.Now()); err != nil {
			t.Errorf("request %d: v2: %v (header %q)", i, err, h.Get(SignatureHeader))
		}
		// v2 covers the attributes: a captured request replayed as a
		// deletion, or under another id, does not verify.
		for _, forge := range []struct{ name, value string }{{"ce-type", "io.kubebridge.configmaps.core.deleted"}, {"ce-id", "other"}, {"ce-subject", "ns/else"}} {
			forged := h.Clone()
			forged.Set(forge.name, forge.value)
			if err := verifyV2([]byte("s3cr3t-key"), forged, body, time.Now()); err == nil {
				t.Errorf("request %d with a forged %s verified", i, forge.name)
			}
		}
		if err := verifyV2([]byte("s3cr3t-key"), h, append(body, ' '), time.Now()); err == nil {
			t.Error("v2: a tampered body verified")
		}
		appended := h.Clone()
		appended.Add("ce-type", "io.kubebridge.configmaps.core.deleted")
		if err := verifyV2([]byte("s3cr3t-key"), appended, body, time.Now()); err == nil {
			t.Error("v2: a request with an appended ce-type verified")
		}
		if h.Get("Authorization") != "Bearer tok-123" || h.Get("X-Team") != "platform" || h.Get("ce-specversion") != "1.0" || h.Get("Content-Type") != "application/json" {
			t.Errorf("headers %v", h)
		}
		if strings.Contains(fmt.Sprint(h), "s3cr3t") {
			t.Error("the signing secret was sent")
		}
	}
}

// request is what a test server saw.
type request struct{ method, path string }

// recorder is an httptest server that records requests and answers them
// with answer (nil: 202).
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []request
}

func newRecorder(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int) bool) *recorder {
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rec.mu.Lock()
		rec.seen = append(rec.seen, request{r.Method, r.URL.Path})
		n := len(rec.seen)
		rec.mu.Unlock()
		if answer == nil || !answer(w, r, n) {
			w.WriteHeader(http.StatusAccepted)
		}
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) requests() []request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]request(nil), rec.seen...)
}

func newSink(t *testing.T, url, mode string, batch *Batch) *Sink {
	t.Helper()
	s, err := New(&Config{URL: url, Mode: mode, Timeout: config.Duration(5 * time.Second), Batch: batch}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// A redirect is not a delivery: it is never followed (a 301/302/303 would
// come back as a body-less GET whose 200 acknowledges nothing; a 307/308
// would hand the events to another URL), and it is retried, not refused,
// with the status and the redacted Location in the error.
func TestRedirectIsNotADelivery(t *testing.T) {
	for _, code := range []int{301, 302, 303, 307, 308} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ int) bool {
				if r.URL.Path != "/events" {
					return false // /moved takes anything
				}
				w.Header().Set("Location", "/moved?token=s3cret")
				w.WriteHeader(code)
				return true
			})
			u, _ := url.Parse(rec.URL)
			s := newSink(t, "http://user:pa55@"+u.Host+"/events?key=k3y", "binary", nil)
			err := s.Send(context.Background(), []*event.Event{sinkstest.NewSource(10).Next(0)})
			if err == nil {
				t.Fatalf("a %d was counted as a delivery", code)
			}
			if sinks.IsPermanent(err) {
				t.Errorf("a redirect is permanent: %v", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, strconv.Itoa(code)) || !strings.Contains(msg, u.Host+"/moved") {
				t.Errorf("error %q does not name the status and the Location", msg)
			}
			for _, secret := range []string{"pa55", "k3y", "s3cret"} {
				if strings.Contains(msg, secret) {
					t.Errorf("error %q leaks %q", msg, secret)
				}
			}
			if got := rec.requests(); len(got) != 1 || got[0] != (request{"POST", "/events"}) {
				t.Errorf("the server saw %v, want only the POST", got)
			}
		})
	}
}

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	limit := 30 * time.Second
	for _, c := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"", 0, false},
		{"soon", 0, false},
		{"-1", 0, false},
		{"0", 0, true},
		{" 7 ", 7 * time.Second, true},
		{"30", 30 * time.Second, true},
		{"3600", limit, true},
		{"99999999999999999", limit, true}, // would overflow a Duration
		{now.Add(10 * time.Second).Format(http.TimeFormat), 10 * time.Second, true},
		{now.Add(time.Hour).Format(http.TimeFormat), limit, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{now.Add(time.Hour).Format(time.RFC850), limit, true},
	} {
		got, ok := retryAfter(c.header, now, limit)
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfter(%q) = %s, %v; want %s, %v", c.header, got, ok, c.want, c.ok)
		}
	}
}

// One reply with Retry-After: 3600 must not park the sink for an hour: the
// pause is capped at the sink's retry maxInterval (5 minutes without one).
func TestRetryAfterCappedAtMaxInterval(t *testing.T) {
	for _, header := range []string{"3600", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)} {
		r := newReceiver(t)
		r.mu.Lock()
		r.fail503, r.retryAt = 1, header
		r.mu.Unlock()
		cfg := config.Sink{Name: "hook", Queue: config.Queue{Capacity: 10}, Workers: 1,
			Type: "webhook", Spec: &Config{URL: r.URL(), Mode: "binary", Timeout: config.Duration(5 * time.Second)},
			Retry: config.Retry{InitialInterval: config.Duration(10 * time.Millisecond), MaxInterval: config.Duration(300 * time.Millisecond)}}
		sink, err := Factory.Create(context.Background(), sinks.SettingsFor(cfg, nil))
		if err != nil {
			t.Fatal(err)
		}
		if got := sink.(*Sink).maxDelay; got != 300*time.Millisecond {
			t.Errorf("cap %s, want the maxInterval", got)
		}
		d := sinkstest.Start(t, cfg, sink, nil)
		src := sinkstest.NewSource(10)
		d.Offer(src.Next(0))
		sinkstest.WaitFor(t, src, r, 10*time.Second)
	}
	s := newSink(t, "http://127.0.0.1:1/", "binary", nil)
	if s.maxDelay != DefaultMaxRetryAfter || DefaultMaxRetryAfter > 5*time.Minute {
		t.Errorf("cap without maxInterval %s", s.maxDelay)
	}
}

// An event that cannot be encoded, or whose header values Go refuses to
// send, is refused alone (permanently); the others of its batch are sent.
func TestBadEventRefusedAlone(t *testing.T) {
	unencodable := func(src *sinkstest.Source) *event.Event { return src.Unencodable(1) }
	for _, c := range []struct {
		name  string
		mode  string
		batch *Batch
		bad   func(*sinkstest.Source) *event.Event
		reqs  int
	}{
		{"binary/encoding", "binary", nil, unencodable, 2},
		{"structured/encoding", "structured", nil, unencodable, 2},
		{"batch/encoding", "binary", &Batch{MaxEvents: 10, MaxWait: config.Duration(time.Millisecond)}, unencodable, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newReceiver(t)
			s := newSink(t, r.URL(), c.mode, c.batch)
			src := sinkstest.NewSource(10)
			batch := []*event.Event{src.Next(0), c.bad(src), src.Next(2)}
			err := s.Send(context.Background(), batch)
			var ee *sinks.EventErrors
			if !errors.As(err, &ee) || len(ee.Errs) != 3 {
				t.Fatalf("Send = %v, want per-event errors", err)
			}
			if ee.Errs[0] != nil || ee.Errs[2] != nil || !sinks.IsPermanent(ee.Errs[1]) {
				t.Errorf("outcomes %v, want [nil permanent nil]", ee.Errs)
			}
			got := r.Received(t)
			if len(got) != 2 || got[0].ID != batch[0].ID || got[1].ID != batch[2].ID {
				t.Errorf("received %v, want events 0 and 2", got)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.bodies) != c.reqs {
				t.Errorf("%d requests, want %d", len(r.bodies), c.reqs)
			}
		})
	}
}

// Without batch, events go one request each, and fare alone: what the
// destination took is acknowledged, what it failed is retried, and one
// failing does not hold back the others (they are of other objects: the
// delivery never hands a Send two events of one object).
func TestPerEventOutcomeWhenDestinationFails(t *testing.T) {
	rec := newRecorder(t, func(w http.ResponseWriter, _ *http.Request, n int) bool {
		if n == 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	s := newSink(t, rec.URL, "binary", nil)
	src := sinkstest.NewSource(10)
	err := s.Send(context.Background(), []*event.Event{src.Next(0), src.Next(1), src.Next(2)})
	var ee *sinks.EventErrors
	if !errors.As(err, &ee) || len(ee.Errs) != 3 {
		t.Fatalf("Send = %v, want per-event errors", err)
	}
	if ee.Errs[0] != nil || ee.Errs[1] == nil || ee.Errs[2] != nil || sinks.IsPermanent(ee.Errs[1]) {
		t.Errorf("outcomes %v, want [nil retryable nil]", ee.Errs)
	}
	if n := len(rec.requests()); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
}

// Only a 2xx acknowledges: every other answer, and no answer, is an error.
func TestOnly2xxAcknowledges(t *testing.T) {
	for _, code := range []int{200, 201, 202, 204, 299, 300, 304, 400, 404, 408, 429, 500, 503} {
		rec := newRecorder(t, func(w http.ResponseWriter, _ *http.Request, _ int) bool {
			w.WriteHeader(code)
			return true
		})
		s := newSink(t, rec.URL, "structured", nil)
		err := s.Send(context.Background(), []*event.Event{sinkstest.NewSource(10).Next(0)})
		if ok := code >= 200 && code < 300; ok != (err == nil) {
			t.Errorf("status %d: Send = %v", code, err)
		}
	}
	// The connection is closed before any answer.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 512))
			c.Close()
		}
	}()
	s := newSink(t, "http://"+l.Addr().String()+"/", "binary", nil)
	if err := s.Send(context.Background(), []*event.Event{sinkstest.NewSource(10).Next(0)}); err == nil || sinks.IsPermanent(err) {
		t.Errorf("a closed connection: Send = %v, want a retryable error", err)
	}
}

// An object name with control characters (RBAC objects are barely
// validated) is carried percent-encoded in ce-subject, as the CloudEvents
// HTTP binding says: it can neither be refused by the transport nor inject
// a header, and the receiver decodes the name back.
func TestHostileNameIsPercentEncoded(t *testing.T) {
	r := newReceiver(t)
	s := newSink(t, r.URL(), "binary", nil)
	src := sinkstest.NewSource(10)
	e := src.Next(1)
	u := e.Object().DeepCopy()
	name := "obj-1\r\nX-Injected: 1\x1b[31m \"%ü"
	u.SetName(name)
	hostile := event.New(e.RuleInfo(), event.Updated, u, nil, time.Now())
	if err := s.Send(context.Background(), []*event.Event{hostile, src.Next(2)}); err != nil {
		t.Fatalf("Send = %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.headers) != 2 {
		t.Fatalf("%d requests", len(r.headers))
	}
	h := r.headers[0]
	if h.Get("X-Injected") != "" {
		t.Error("a header was injected")
	}
	raw := h.Get("ce-subject")
	if strings.ContainsAny(raw, "\r\n\x1b \"") {
		t.Errorf("ce-subject %q is not encoded", raw)
	}
	got, err := url.PathUnescape(raw)
	if err != nil || got != u.GetNamespace()+"/"+name {
		t.Errorf("ce-subject %q decodes to %q (%v)", raw, got, err)
	}
}

// Each answer is classed by whether sending the same request again can
// help: the payload (Permanent: dead-letter), the destination or its
// config (Destination, by reason: retried, never dead-lettered), push-back
// (Unavailable or Throttle), or a plain retryable failure. A refusal is
// never a delivery.
func TestStatusClasses(t *testing.T) {
	const (
		permanent = "permanent"
		plain     = "retry"
		pushback  = "unavailable"
		throttle  = "throttle"
	)
	for code, want := range map[int]string{
		400: permanent, 413: permanent, 415: permanent, 422: permanent,
		401: sinks.ReasonUnauthorized, 403: sinks.ReasonForbidden, 404: sinks.ReasonNotFound, 410: sinks.ReasonGone,
		301: sinks.ReasonRedirect, 302: sinks.ReasonRedirect, 307: sinks.ReasonRedirect, 308: sinks.ReasonRedirect,
		429: pushback, 503: pushback,
		408: plain, 409: plain, 425: plain, 500: plain, 502: plain, 504: plain,
	} {
		rec := newRecorder(t, func(w http.ResponseWriter, _ *http.Request, _ int) bool {
			w.WriteHeader(code)
			return true
		})
		s := newSink(t, rec.URL, "binary", nil)
		err := s.Send(context.Background(), []*event.Event{sinkstest.NewSource(10).Next(0)})
		reason, dest := sinks.DestinationReason(err)
		var got string
		switch {
		case err == nil:
			got = "delivered"
		case sinks.IsPermanent(err):
			got = permanent
		case dest:
			got = reason
		case sinks.IsThrottle(err):
			got = throttle
		case sinks.IsUnavailable(err):
			got = pushback
		default:
			got = plain
		}
		if got != want {
			t.Errorf("status %d: %s (%v), want %s", code, got, err, want)
		}
	}
	// A Retry-After on 503 asks for a pause.
	rec := newRecorder(t, func(w http.ResponseWriter, _ *http.Request, _ int) bool {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(503)
		return true
	})
	if err := newSink(t, rec.URL, "binary", nil).Send(context.Background(), []*event.Event{sinkstest.NewSource(10).Next(0)}); !sinks.IsThrottle(err) {
		t.Errorf("503 with Retry-After: %v, want a throttle", err)
	}
	// Nobody listening: the destination is unavailable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if err := newSink(t, "http://"+addr+"/", "binary", nil).Send(context.Background(), []*event.Event{sinkstest.NewSource(10).Next(0)}); !sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		t.Errorf("connection refused: %v, want unavailable", err)
	}
}

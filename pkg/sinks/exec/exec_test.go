package exec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// pluginBin is testdata/plugin, built once for the package's tests.
var pluginBin string

func TestMain(m *testing.M) { testenv.MainWithProgram(m, "./testdata/plugin", &pluginBin) }

// testTiming restarts fast and gives up on a plugin's exit soon.
var testTiming = timing{
	minBackoff:   10 * time.Millisecond,
	maxBackoff:   200 * time.Millisecond,
	healthyAfter: time.Minute,
	exitGrace:    100 * time.Millisecond,
	readGrace:    time.Second,
	closeTimeout: 10 * time.Second,
}

// plugin is a running test plugin's directory: its files say what it
// received and answered, and its control file switches its behaviour.
type plugin struct{ dir string }

func (p plugin) path(name string) string { return filepath.Join(p.dir, name) }

// set writes the control file (atomically: the plugin reads it per event).
func (p plugin) set(t testing.TB, mode string) {
	t.Helper()
	tmp := p.path("control.tmp")
	if err := os.WriteFile(tmp, []byte(mode), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p.path("control")); err != nil {
		t.Fatal(err)
	}
}

// lines returns the complete lines of one of the plugin's files.
func (p plugin) lines(t testing.TB, name string) []string {
	t.Helper()
	data, err := os.ReadFile(p.path(name))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i]
	} else {
		return nil
	}
	return strings.Split(string(data), "\n")
}

// times maps the ids in a trace or answers file to when they appear.
func (p plugin) times(t testing.TB, name string) map[string][]int64 {
	out := map[string][]int64{}
	for _, l := range p.lines(t, name) {
		f := strings.Fields(l)
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		out[f[1]] = append(out[f[1]], ns)
	}
	return out
}

func (p plugin) pid(t testing.TB) int {
	starts := p.lines(t, "starts")
	if len(starts) == 0 {
		t.Fatal("the plugin never started")
	}
	pid, _ := strconv.Atoi(starts[len(starts)-1])
	return pid
}

// The sinkstest.Remote side.

func (p plugin) Received(t testing.TB) []sinkstest.Received {
	var bodies [][]byte
	for _, l := range p.lines(t, "received.jsonl") {
		bodies = append(bodies, []byte(l))
	}
	got, err := sinkstest.ParseIDs(bodies)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
func (p plugin) Down(t testing.TB)   { p.set(t, "down") }
func (p plugin) Up(t testing.TB)     { p.set(t, "up") }
func (p plugin) Refuse(t testing.TB) { p.set(t, "refuse") }

// Restart kills the plugin; the sink starts it again.
func (p plugin) Restart(t testing.TB) {
	proc, err := os.FindProcess(p.pid(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = proc.Kill()
}

// logBuffer collects the sink's log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// pluginConfig runs the test plugin in a fresh directory with env.
func pluginConfig(t testing.TB, env map[string]string) (Config, plugin) {
	p := plugin{dir: t.TempDir()}
	c := Config{Command: []string{pluginBin}, Env: map[string]string{"PLUGIN_DIR": p.dir}}
	c.SetDefaults()
	for k, v := range env {
		c.Env[k] = v
	}
	return c, p
}

// startSink starts the exec sink on the test plugin; it is closed when the
// test ends.
func startSink(t testing.TB, c Config) (*Sink, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	s, err := newSink("plugged", c, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("sink", "plugged"), testTiming)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s, logs
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// sendAsync runs Send in the background; its result arrives on the channel.
func sendAsync(ctx context.Context, s *Sink, events ...*event.Event) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Send(ctx, events) }()
	return done
}

func perEvent(t testing.TB, err error, n int) []error {
	t.Helper()
	var ee *sinks.EventErrors
	if !errors.As(err, &ee) || len(ee.Errs) != n {
		t.Fatalf("Send returned %v, want *sinks.EventErrors for %d events", err, n)
	}
	return ee.Errs
}

// The contract every sink passes, against the real plugin process: its
// outages are answers ok:false, its restart a kill (the sink restarts it),
// its refusals permanent answers.
func TestContract(t *testing.T) {
	sinkstest.Run(t, sinkstest.Harness{
		// One worker: the suite's bound on pending events counts one batch
		// in flight (TestWorkersShareThePlugin runs several).
		Config:   config.Sink{Name: "plugged", Workers: 1},
		Outages:  true,
		Refusals: true,
		PerEvent: true,
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			c, p := pluginConfig(t, nil)
			cfg.Type, cfg.Spec = "exec", &c
			s, err := Factory.Create(context.Background(), sinks.SettingsFor(cfg, nil))
			if err != nil {
				t.Fatal(err)
			}
			return s, p
		},
	})
}

func TestAnswersOutOfOrder(t *testing.T) {
	c, p := pluginConfig(t, nil)
	p.set(t, "hold")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	batch := []*event.Event{src.Next(0), src.Next(1), src.Next(2), src.Next(3), src.Next(4)}
	done := sendAsync(ctxFor(t), s, batch...)
	waitUntil(t, "the plugin to hold 5 events", func() bool { return len(p.lines(t, "received.jsonl")) == 5 })
	p.set(t, "up") // the plugin answers the held events newest first
	if err := <-done; err != nil {
		t.Fatalf("Send: %v", err)
	}
	answers, trace := p.lines(t, "answers"), p.lines(t, "trace")
	for i, a := range answers {
		if id := strings.Fields(a)[1]; id != batch[len(batch)-1-i].ID {
			t.Fatalf("answer %d is for %s, want the reverse of the batch; answers:\n%s\ntrace:\n%s", i, id, strings.Join(answers, "\n"), strings.Join(trace, "\n"))
		}
	}
}

func TestRetryableAnswer(t *testing.T) {
	c, p := pluginConfig(t, nil)
	p.set(t, "down")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	batch := []*event.Event{src.Next(0), src.Next(1)}
	err := s.Send(ctxFor(t), batch)
	if err == nil || sinks.IsPermanent(err) || !strings.Contains(err.Error(), "plugin: down for maintenance") {
		t.Fatalf("Send while down = %v, want the plugin's retryable error", err)
	}
	p.set(t, "up")
	if err := s.Send(ctxFor(t), batch); err != nil {
		t.Fatalf("resent after the outage: %v", err)
	}
	if got := p.Received(t); len(got) != 2 {
		t.Errorf("received %v", got)
	}
}

func TestPermanentAnswer(t *testing.T) {
	c, p := pluginConfig(t, nil)
	p.set(t, "refuse prod/obj-1")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	batch := []*event.Event{src.Next(0), src.Next(1), src.Next(2)}
	errs := perEvent(t, s.Send(ctxFor(t), batch), 3)
	if errs[0] != nil || errs[2] != nil || !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "plugin: refused") {
		t.Fatalf("outcomes %v, want only obj-1 refused permanently", errs)
	}
	// Through the delivery loop, the refusal lands in the dead-letter.
	dl := &sinkstest.RecordingDeadLetter{}
	cfg := config.Sink{Name: "plugged", Workers: 1, Queue: config.Queue{Capacity: 100},
		Retry: config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(10 * time.Millisecond)}}
	d := sinkstest.Start(t, cfg, s, dl)
	d.Offer(src.Next(1))
	waitUntil(t, "the dead-letter", func() bool { return d.Stats().DeadLettered == 1 })
	if len(dl.Events) != 1 || dl.Events[0].Subject != "prod/obj-1" || !sinks.IsPermanent(dl.Errors[0]) {
		t.Errorf("dead-letter got %v (%v)", dl.Events, dl.Errors)
	}
}

// retryAfter makes the delivery loop wait that long before the next
// attempt, although its own backoff is far shorter.
func TestRetryAfterThrottles(t *testing.T) {
	c, p := pluginConfig(t, map[string]string{"PLUGIN_RETRY_AFTER": "300ms"})
	p.set(t, "throttle")
	s, _ := startSink(t, c)
	cfg := config.Sink{Name: "plugged", Workers: 1, Queue: config.Queue{Capacity: 100},
		Retry: config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(10 * time.Second)}}
	d := sinkstest.Start(t, cfg, s, nil)
	src := sinkstest.NewSource(10)
	ev := src.Next(0)
	d.Offer(ev)
	waitUntil(t, "a second attempt", func() bool { return len(p.times(t, "trace")[ev.ID]) >= 2 })
	p.set(t, "up")
	sinkstest.WaitFor(t, src, p, 30*time.Second)
	at := p.times(t, "trace")[ev.ID]
	if gap := time.Duration(at[1] - at[0]); gap < 300*time.Millisecond {
		t.Errorf("retried %s after a retryAfter of 300ms", gap)
	}
}

// An object's events are never unanswered twice at once: the second of a
// batch is written only once the first is answered; an event retried while
// its first write is unanswered is not written again.
func TestOneEventPerObjectInFlight(t *testing.T) {
	c, p := pluginConfig(t, nil)
	p.set(t, "hold")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	a1, a2, b1 := src.Next(0), src.Next(0), src.Next(1)
	done := sendAsync(ctxFor(t), s, a1, a2, b1)
	waitUntil(t, "a1 and b1 written", func() bool { return len(p.lines(t, "trace")) == 2 })
	p.set(t, "up")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	trace, answers := p.times(t, "trace"), p.times(t, "answers")
	if len(trace[a2.ID]) != 1 || trace[a2.ID][0] < answers[a1.ID][0] {
		t.Errorf("a2 written at %v, before a1 was answered at %v", trace[a2.ID], answers[a1.ID])
	}

	// A retry of an unanswered event (its Send gave up) waits for the
	// answer instead of writing it again; so does the object's next event.
	p.set(t, "hold")
	a3, a4 := src.Next(0), src.Next(0)
	ctx, cancel := context.WithCancel(ctxFor(t))
	first := sendAsync(ctx, s, a3)
	waitUntil(t, "a3 written", func() bool { return len(p.times(t, "trace")[a3.ID]) == 1 })
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("the Send that gave up returned %v", err)
	}
	retry := sendAsync(ctxFor(t), s, a3, a4)
	waitUntil(t, "the retry to wait for a3's answer", func() bool { return waiters(s, a3.ID) == 1 })
	p.set(t, "up")
	if err := <-retry; err != nil {
		t.Fatal(err)
	}
	trace, answers = p.times(t, "trace"), p.times(t, "answers")
	if len(trace[a3.ID]) != 1 {
		t.Errorf("a3 written %d times", len(trace[a3.ID]))
	}
	if len(trace[a4.ID]) != 1 || trace[a4.ID][0] < answers[a3.ID][0] {
		t.Errorf("a4 written at %v, before a3 was answered at %v", trace[a4.ID], answers[a3.ID])
	}

	// The same across batches: the object's next event alone (its
	// predecessor was coalesced into it, say) waits for the unanswered one.
	p.set(t, "hold")
	a5, a6 := src.Next(0), src.Next(0)
	ctx, cancel = context.WithCancel(ctxFor(t))
	first = sendAsync(ctx, s, a5)
	waitUntil(t, "a5 written", func() bool { return len(p.times(t, "trace")[a5.ID]) == 1 })
	cancel()
	<-first
	next := sendAsync(ctxFor(t), s, a6)
	waitUntil(t, "a6 to wait for a5's answer", func() bool { return waiters(s, a5.ID) == 1 })
	p.set(t, "up")
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	trace, answers = p.times(t, "trace"), p.times(t, "answers")
	if len(trace[a6.ID]) != 1 || trace[a6.ID][0] < answers[a5.ID][0] {
		t.Errorf("a6 written at %v, before a5 was answered at %v", trace[a6.ID], answers[a5.ID])
	}
}

func waiters(s *Sink, id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.pending[id]; c != nil {
		return len(c.waiters)
	}
	return 0
}

// Once an object's event fails retryably, its later events of the batch
// are not written and are reported failed; a permanent refusal does not
// hold the object's later events back.
func TestFailureHoldsBackTheObject(t *testing.T) {
	c, p := pluginConfig(t, nil)
	p.set(t, "down prod/obj-0")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	a1, a2, b1 := src.Next(0), src.Next(0), src.Next(1)
	errs := perEvent(t, s.Send(ctxFor(t), []*event.Event{a1, a2, b1}), 3)
	if errs[0] == nil || sinks.IsPermanent(errs[0]) || !errors.Is(errs[1], errOrder) || errs[2] != nil {
		t.Fatalf("outcomes %v, want a1 failed, a2 held back, b1 ok", errs)
	}
	if n := len(p.times(t, "trace")[a2.ID]); n != 0 {
		t.Errorf("a2 was written %d times after a1 failed", n)
	}

	p.set(t, "refuse prod/obj-0")
	a3 := src.Next(0)
	errs = perEvent(t, s.Send(ctxFor(t), []*event.Event{a2, a3}), 2)
	if !sinks.IsPermanent(errs[0]) || !sinks.IsPermanent(errs[1]) {
		t.Fatalf("outcomes %v, want both refused", errs)
	}
}

// testDelivery runs the sink behind the contract kit's delivery loop.
func testDelivery(t *testing.T, s *Sink, workers int) *sinkstest.Delivery {
	cfg := config.Sink{Name: "plugged", Workers: workers, Queue: config.Queue{Capacity: 1000},
		Retry: config.Retry{InitialInterval: config.Duration(5 * time.Millisecond), MaxInterval: config.Duration(50 * time.Millisecond)}}
	return sinkstest.Start(t, cfg, s, nil)
}

// Several workers send at once through one plugin, with fewer inflight
// slots than a batch holds, while the plugin is killed midway: every
// object's events arrive, in order, and nothing is lost.
func TestWorkersShareThePlugin(t *testing.T) {
	c, p := pluginConfig(t, nil)
	c.Inflight = 16
	s, _ := startSink(t, c)
	d := testDelivery(t, s, 4)
	src := sinkstest.NewSource(10)
	for i := range 2000 {
		d.Offer(src.Next(i % 100))
		if i == 1000 {
			waitUntil(t, "deliveries under way", func() bool { return len(p.lines(t, "received.jsonl")) > 0 })
			p.Restart(t)
		}
	}
	got := sinkstest.WaitFor(t, src, p, 60*time.Second)
	dups := sinkstest.Check(t, src, got)
	if n := len(p.lines(t, "starts")); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
	t.Logf("%d received, %d duplicates", len(got), dups)
}

func TestCrashMidBatchIsRestarted(t *testing.T) {
	c, p := pluginConfig(t, map[string]string{"PLUGIN_CRASH_AT": "5"})
	s, logs := startSink(t, c)
	d := testDelivery(t, s, 1)
	src := sinkstest.NewSource(10)
	for i := range 40 {
		d.Offer(src.Next(i % 20))
	}
	got := sinkstest.WaitFor(t, src, p, 30*time.Second)
	sinkstest.Check(t, src, got)
	if n := len(p.lines(t, "starts")); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
	if !strings.Contains(logs.String(), "exit status 3") {
		t.Errorf("the crash is not logged:\n%s", logs)
	}
}

func TestGarbageLineRestarts(t *testing.T) {
	c, p := pluginConfig(t, map[string]string{"PLUGIN_GARBAGE_AT": "3"})
	s, logs := startSink(t, c)
	d := testDelivery(t, s, 2)
	src := sinkstest.NewSource(10)
	for i := range 20 {
		d.Offer(src.Next(i))
	}
	sinkstest.Check(t, src, sinkstest.WaitFor(t, src, p, 30*time.Second))
	if n := len(p.lines(t, "starts")); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
	if log := logs.String(); !strings.Contains(log, `protocol error: not a JSON answer (21 bytes, starting \"this is not an answer\")`) {
		t.Errorf("the protocol error is not logged:\n%s", log)
	}
}

func TestAnswerValidation(t *testing.T) {
	s := &Sink{pending: map[string]*call{}, byKey: map[string]*call{}, slots: make(chan struct{}, 1)}
	p := &proc{}
	for _, tc := range []struct{ line, want string }{
		{`{"ok":true}`, "an answer without an id"},
		{`{"id":"a"}`, `the answer for "a" has no ok`},
		{`{"id":"a","ok":"yes"}`, "not a JSON answer"},
		{`{"id":"a","ok":false,"retryAfter":"soon"}`, `retryAfter "soon", not a duration`},
		{`{"id":"a","ok":true}`, `an answer for "a", which is not an unanswered event`},
	} {
		if err := s.answer(p, []byte(tc.line)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("answer %s: %v, want %q", tc.line, err, tc.want)
		}
	}
}

// Close closes stdin and waits for the outstanding answers; a plugin that
// then does not exit is killed.
func TestCloseWaitsForAnswersThenKills(t *testing.T) {
	c, p := pluginConfig(t, map[string]string{"PLUGIN_IGNORE_EOF": "1"})
	p.set(t, "hold")
	s, logs := startSink(t, c)
	src := sinkstest.NewSource(10)
	ctx, cancel := context.WithCancel(ctxFor(t))
	sent := sendAsync(ctx, s, src.Next(0), src.Next(1), src.Next(2))
	waitUntil(t, "3 events held", func() bool { return len(p.lines(t, "received.jsonl")) == 3 })
	cancel() // as at shutdown: the delivery gave up, the events are still with the plugin
	<-sent
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		closed <- s.Close(ctx)
	}()
	waitUntil(t, "stdin closed", func() bool { _, err := os.Stat(p.path("eof")); return err == nil })
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v before the answers came", err)
	default:
	}
	p.set(t, "up")
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := len(p.lines(t, "answers")); n != 3 {
		t.Errorf("%d answers before the kill, want 3", n)
	}
	if !strings.Contains(logs.String(), "did not exit after its stdin closed; killed") {
		t.Errorf("the kill is not logged:\n%s", logs)
	}
	assertGone(t, p.pid(t))
}

// A plugin that never answers is killed at Close's deadline.
func TestCloseKillsAtDeadline(t *testing.T) {
	c, p := pluginConfig(t, nil)
	p.set(t, "hold")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	ctx, cancel := context.WithCancel(ctxFor(t))
	sent := sendAsync(ctx, s, src.Next(0))
	waitUntil(t, "the event held", func() bool { return len(p.lines(t, "received.jsonl")) == 1 })
	cancel()
	<-sent
	cctx, ccancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer ccancel()
	err := s.Close(cctx)
	if err == nil || !strings.Contains(err.Error(), "killed at shutdown with 1 events unanswered") {
		t.Errorf("Close = %v", err)
	}
	assertGone(t, p.pid(t))
	// Nothing handed to a plugin that does not run: the destination's
	// failure, not the event's.
	if err := s.Send(ctxFor(t), []*event.Event{src.Next(1)}); !errors.Is(err, errClosed) || !sinks.IsUnavailable(err) {
		t.Errorf("Send after Close = %v, want unavailable (closed)", err)
	}
}

func assertGone(t *testing.T, pid int) {
	t.Helper()
	if err := osProcessAlive(pid); err == nil {
		t.Errorf("plugin %d still running after Close", pid)
	}
}

func TestInflightBound(t *testing.T) {
	c, p := pluginConfig(t, nil)
	c.Inflight = 3
	p.set(t, "hold")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	var batch []*event.Event
	for i := range 10 {
		batch = append(batch, src.Next(i))
	}
	done := sendAsync(ctxFor(t), s, batch...)
	waitUntil(t, "3 events held", func() bool { return len(p.lines(t, "trace")) == 3 })
	time.Sleep(100 * time.Millisecond) // room for a wrong fourth write to show
	if n := len(p.lines(t, "trace")); n != 3 {
		t.Fatalf("%d events written with inflight 3 and none answered", n)
	}
	p.set(t, "up")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// At no moment did the plugin have more than 3 unanswered.
	trace, answers := p.times(t, "trace"), p.times(t, "answers")
	for _, e := range batch {
		open := 0
		at := trace[e.ID][0]
		for _, o := range batch {
			if trace[o.ID][0] <= at && answers[o.ID][0] > at {
				open++
			}
		}
		if open > 3 {
			t.Errorf("%d events unanswered when %s was written", open, e.Subject)
		}
	}
}

// The plugin's environment is PATH, HOME, LANG and env: the bridge's other
// variables (secrets) stay out.
func TestEnvironmentIsMinimal(t *testing.T) {
	t.Setenv("KUBEBRIDGE_TEST_SECRET", "hunter2")
	c, p := pluginConfig(t, map[string]string{"AUDIT_DB": "/data/audit.db"})
	startSink(t, c)
	waitUntil(t, "the plugin's env", func() bool { _, err := os.Stat(p.path("env")); return err == nil })
	waitUntil(t, "the plugin's env", func() bool { return len(p.lines(t, "starts")) == 1 })
	data, err := os.ReadFile(p.path("env"))
	if err != nil {
		t.Fatal(err)
	}
	env := string(data)
	if strings.Contains(env, "KUBEBRIDGE_TEST_SECRET") || strings.Contains(env, "hunter2") {
		t.Errorf("the bridge's variable reached the plugin:\n%s", env)
	}
	for _, want := range []string{"AUDIT_DB=/data/audit.db", "PATH=" + os.Getenv("PATH"), "PLUGIN_DIR=" + p.dir} {
		if !strings.Contains(env, want) {
			t.Errorf("plugin env lacks %s:\n%s", want, env)
		}
	}
	for _, kv := range strings.Split(env, "\n") {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH", "HOME", "LANG", "AUDIT_DB", "PLUGIN_DIR":
		default:
			t.Errorf("unexpected variable %s in the plugin's env", k)
		}
	}
}

func TestStderrIsLogged(t *testing.T) {
	long := strings.Repeat("x", 10000)
	c, _ := pluginConfig(t, map[string]string{"PLUGIN_STDERR": "hello from the plugin\n" + long})
	_, logs := startSink(t, c)
	waitUntil(t, "the stderr lines logged", func() bool { return strings.Count(logs.String(), "plugin stderr") == 2 })
	log := logs.String()
	if !strings.Contains(log, `msg="plugin stderr" sink=plugged`) || !strings.Contains(log, `line="hello from the plugin"`) {
		t.Errorf("stderr line not logged with the sink's name:\n%s", log)
	}
	if !strings.Contains(log, "line="+strings.Repeat("x", maxStderrLine)+" truncated=true") {
		t.Errorf("the long line is not cut at %d bytes:\n%.300s", maxStderrLine, log)
	}
}

// With the plugin dead and restarting, Send returns a retryable error
// at once, never hangs.
func TestDeadPluginFailsFast(t *testing.T) {
	c := Config{Command: []string{"false"}, Inflight: 10, Timeout: config.Duration(time.Minute)}
	s, logs := startSink(t, c)
	src := sinkstest.NewSource(10)
	for range 5 {
		start := time.Now()
		err := s.Send(ctxFor(t), []*event.Event{src.Next(0)})
		if err == nil || sinks.IsPermanent(err) || !strings.Contains(err.Error(), "the plugin exited (exit status 1)") {
			t.Fatalf("Send to a dead plugin = %v, want a retryable error saying it exited", err)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("Send took %s", time.Since(start))
		}
	}
	waitUntil(t, "the restarts logged", func() bool { return strings.Contains(logs.String(), "plugin stopped; restarting it") })
	t.Log(logs)
}

func TestCreateFailsWhenTheCommandCannotStart(t *testing.T) {
	c := Config{Command: []string{"/nonexistent/plugin"}, Inflight: 1, Timeout: config.Duration(time.Minute)}
	_, err := Factory.Create(context.Background(), sinks.SettingsFor(config.Sink{Name: "audit", Type: "exec", Spec: &c}, nil))
	if err == nil || !strings.Contains(err.Error(), `exec sink "audit": starting /nonexistent/plugin`) {
		t.Errorf("Create = %v", err)
	}
	_, err = Factory.Create(context.Background(), sinks.SettingsFor(config.Sink{Name: "audit"}, nil))
	if err == nil || !strings.Contains(err.Error(), "no exec config") {
		t.Errorf("Create without a spec = %v", err)
	}
}

func TestConfig(t *testing.T) {
	c := Factory.NewConfig().(*Config)
	if c.Inflight != 256 || c.Timeout.D() != 30*time.Second {
		t.Errorf("default inflight %d, timeout %s", c.Inflight, c.Timeout)
	}
	sec := config.Duration(time.Second)
	for _, tc := range []struct {
		name string
		c    Config
		want []string
	}{
		{"ok", Config{Command: []string{"python3", "/plugins/audit.py"}, Env: map[string]string{"AUDIT_DB": "x"}, Inflight: 1, Timeout: sec}, nil},
		{"no command", Config{Inflight: 256, Timeout: sec}, []string{"command: required: the plugin's program and its arguments, e.g. [python3, /plugins/audit.py]"}},
		{"empty program", Config{Command: []string{""}, Inflight: 256, Timeout: sec}, []string{"command[0]: must name the program, got an empty string"}},
		{"bad env and inflight", Config{Command: []string{"p", "a\x00b"}, Env: map[string]string{"A=B": "x", "TOKEN": "se\x00cret"}, Inflight: 0, Timeout: sec}, []string{
			"command[1]: contains a NUL byte",
			`env["A=B"]: "A=B" is not a variable name (non-empty, without '=' or NUL)`,
			"env.TOKEN: the value contains a NUL byte",
			"inflight: must be between 1 and 100000, got 0",
		}},
		{"inflight too high", Config{Command: []string{"p"}, Inflight: 100001, Timeout: sec}, []string{"inflight: must be between 1 and 100000, got 100001"}},
		{"no timeout", Config{Command: []string{"p"}, Inflight: 1}, []string{"timeout: must be positive, got 0s"}},
		{"negative timeout", Config{Command: []string{"p"}, Inflight: 1, Timeout: config.Duration(-time.Second)}, []string{"timeout: must be positive, got -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			if err := tc.c.Validate(); err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					got = append(got, e.Error())
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("Validate:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// osProcessAlive returns nil when process pid exists.
func osProcessAlive(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Signal(syscall.Signal(0))
}

// A line over the limit: stdout's reader gives up at once (the plugin is
// then stopped), stderr's drops the rest and goes on with the next line.
func TestReadLine(t *testing.T) {
	input := strings.Repeat("x", 100) + "\nnext\n"
	r := bufio.NewReaderSize(strings.NewReader(input), 16)
	line, cut, err := readLine(r, 10, false)
	if string(line) != strings.Repeat("x", 10) || !cut || err != nil {
		t.Errorf("no drain: %q %v %v", line, cut, err)
	}
	r = bufio.NewReaderSize(strings.NewReader(input), 16)
	line, cut, err = readLine(r, 10, true)
	if string(line) != strings.Repeat("x", 10) || !cut || err != nil {
		t.Errorf("drain: %q %v %v", line, cut, err)
	}
	line, cut, err = readLine(r, 10, true)
	if string(line) != "next\n" || cut || err != nil {
		t.Errorf("the line after: %q %v %v", line, cut, err)
	}
	if line, _, err = readLine(r, 10, true); len(line) != 0 || err != io.EOF {
		t.Errorf("at the end: %q %v", line, err)
	}
}

package exec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// A plugin that closes its stdout and keeps running can answer nothing
// more: it is stopped and restarted at once (not left to stall its events
// until the answer timeout, or, without one, until shutdown), and its
// unanswered events are resent to the new process.
func TestClosedStdoutRestarts(t *testing.T) {
	c, p := pluginConfig(t, map[string]string{"PLUGIN_CLOSE_STDOUT_AT": "2"})
	c.Timeout = config.Duration(time.Hour) // not what rescues it
	s, logs := startSink(t, c)
	d := testDelivery(t, s, 1)
	src := sinkstest.NewSource(10)
	for i := range 5 {
		d.Offer(src.Next(i))
	}
	sinkstest.Check(t, src, sinkstest.WaitFor(t, src, p, 10*time.Second))
	if n := len(p.lines(t, "starts")); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
	if !strings.Contains(logs.String(), "closed its stdout") {
		t.Errorf("the reason is not logged:\n%s", logs)
	}
}

// A plugin that dies leaving a child outside its process group that holds
// its stdin (and reads nothing): the write blocked on the full pipe must
// not wedge the sink. The plugin's unanswered event fails, the plugin is
// restarted and takes the event, and Close keeps its deadline.
func TestEscapedChildHoldingStdin(t *testing.T) {
	c, p := pluginConfig(t, map[string]string{"PLUGIN_ESCAPE": "1"})
	s, _ := startSink(t, c)
	t.Cleanup(func() { // runs before the sink's Close
		for _, l := range p.lines(t, "escaped") {
			if pid, _ := strconv.Atoi(l); pid > 0 {
				if proc, err := os.FindProcess(pid); err == nil {
					_ = proc.Kill()
				}
			}
		}
	})
	waitUntil(t, "the escaped child", func() bool { return len(p.lines(t, "escaped")) == 1 })
	src := sinkstest.NewSource(300 << 10) // one event overflows the pipe
	ev := src.Next(0)
	sent := sendAsync(ctxFor(t), s, ev)
	time.Sleep(200 * time.Millisecond) // the write blocks on the full pipe
	p.Restart(t)
	select {
	case err := <-sent:
		if err == nil || sinks.IsPermanent(err) || !strings.Contains(err.Error(), "unanswered") {
			t.Fatalf("Send = %v, want a retryable error for the unanswered event", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Send still waits 10s after the plugin died: the sink is wedged")
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(p.lines(t, "starts")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the plugin was not restarted within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var err error
	for range 100 { // until the new plugin runs
		if err = s.Send(ctxFor(t), []*event.Event{ev}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Send to the restarted plugin: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close took %s", took)
	}
	if err := s.Send(ctxFor(t), []*event.Event{ev}); !errors.Is(err, errClosed) {
		t.Errorf("Send after Close = %v", err)
	}
}

// A plugin that reads events and never answers is taken for hung after
// the timeout: it is killed, its events fail retryably, and the delivery
// loop resends them to the restarted plugin, which delivers them. A plugin
// that answers in time is left alone.
func TestTimeoutRestartsAHungPlugin(t *testing.T) {
	const timeout = 300 * time.Millisecond
	c, p := pluginConfig(t, map[string]string{"PLUGIN_MUTE": "1"})
	c.Timeout = config.Duration(timeout)
	s, logs := startSink(t, c)
	d := testDelivery(t, s, 2)
	src := sinkstest.NewSource(10)
	for i := range 6 {
		d.Offer(src.Next(i % 4))
	}
	got := sinkstest.WaitFor(t, src, p, 20*time.Second)
	sinkstest.Check(t, src, got)
	starts := p.lines(t, "starts")
	if len(starts) != 2 {
		t.Fatalf("%d starts, want 2", len(starts))
	}
	trace := p.times(t, "trace")
	resent := 0
	for id, at := range trace {
		if len(at) > 1 {
			resent++
			// The plugin stamps what it reads, a little after the sink wrote
			// it (and started the timeout): a tenth of slack for that.
			if gap := time.Duration(at[1] - at[0]); gap < timeout*9/10 {
				t.Errorf("%s resent %s after its first write, before the timeout", id, gap)
			}
		}
	}
	if resent == 0 {
		t.Errorf("nothing written to the hung plugin was resent; trace %v", trace)
	}
	log := logs.String()
	for _, want := range []string{
		"plugin did not answer in time; killing it",
		"pid=" + starts[0],
		"timeout=300ms",
		"reason=\"no answer within the timeout (300ms)\"",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %s:\n%s", want, log)
		}
	}
	if strings.Contains(log, "obj-") || strings.Contains(log, "uid-") {
		t.Errorf("event data in the log:\n%s", log)
	}
	if !strings.Contains(log, "unanswered=") {
		t.Errorf("the count of unanswered events is not logged:\n%s", log)
	}

	// The restarted plugin answers at once: however long it runs and
	// however many events it takes, the timeout does not fire.
	for i := range 40 {
		d.Offer(src.Next(i % 10))
		time.Sleep(timeout / 10)
	}
	sinkstest.Check(t, src, sinkstest.WaitFor(t, src, p, 20*time.Second))
	if n := len(p.lines(t, "starts")); n != 2 {
		t.Errorf("%d starts after the plugin answered in time, want 2", n)
	}
}

// The timeout is per event: a plugin that answers the others but leaves
// one unanswered is killed for it; the events it answered count, the
// unanswered one fails retryably with the reason.
func TestTimeoutIsPerEvent(t *testing.T) {
	c, p := pluginConfig(t, nil)
	c.Timeout = config.Duration(300 * time.Millisecond)
	p.set(t, "hold prod/obj-1")
	s, _ := startSink(t, c)
	src := sinkstest.NewSource(10)
	batch := []*event.Event{src.Next(0), src.Next(1), src.Next(2)}
	start := time.Now()
	errs := perEvent(t, s.Send(ctxFor(t), batch), 3)
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("answered events failed: %v", errs)
	}
	if errs[1] == nil || sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "no answer within the timeout (300ms)") {
		t.Errorf("the unanswered event: %v, want a retryable timeout", errs[1])
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 10*time.Second {
		t.Errorf("Send returned after %s", took)
	}
	p.set(t, "up")
	var err error
	for range 100 { // until the restarted plugin runs
		if err = s.Send(ctxFor(t), batch[1:2]); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("resent to the restarted plugin: %v", err)
	}
	if n := len(p.lines(t, "starts")); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
}

// A backlog is not a hang: a plugin that takes its events one after the
// other, each well within the timeout, is not killed although the last of
// them waits for its answer several timeouts after it was written (the
// timeout counts for the oldest unanswered event, from when it became the
// oldest).
func TestBacklogIsNotAHang(t *testing.T) {
	const timeout = 300 * time.Millisecond
	c, p := pluginConfig(t, map[string]string{"PLUGIN_DELAY": "100ms"})
	c.Timeout = config.Duration(timeout)
	s, logs := startSink(t, c)
	src := sinkstest.NewSource(10)
	var batch []*event.Event
	for i := range 10 {
		batch = append(batch, src.Next(i))
	}
	start := time.Now()
	if err := s.Send(ctxFor(t), batch); err != nil {
		t.Fatalf("Send: %v\n%s", err, logs)
	}
	if took := time.Since(start); took < 3*timeout {
		t.Errorf("Send took %s: the plugin's backlog never outlasted the timeout, the test proves nothing", took)
	}
	if n := len(p.lines(t, "starts")); n != 1 {
		t.Errorf("%d starts, want 1:\n%s", n, logs)
	}
}

// What a plugin writes reaches errors and logs cut short, whatever the
// answer line holds (up to its 64 KiB).
func TestAnswerErrorsAreBounded(t *testing.T) {
	s := &Sink{pending: map[string]*call{}, byKey: map[string]*call{}, slots: make(chan struct{}, 1)}
	long := strings.Repeat("i", 60<<10)
	for _, line := range []string{
		`{"id":"` + long + `"}`,
		`{"id":"` + long + `","ok":false,"retryAfter":"` + long + `"}`,
		`{"id":"` + long + `","ok":true}`,
		`{"id":"` + long + `"` + long,
	} {
		err := s.answer(&proc{}, []byte(line))
		if err == nil || len(err.Error()) > 1024 {
			t.Errorf("answer of %d bytes: error of %d bytes", len(line), len(fmt.Sprint(err)))
		}
	}
}

package plugin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// structured is a real event as the bridge writes it, for object name.
func structured(t testing.TB, name string, labels map[string]string) *event.Event {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"k": "v"}}}
	u.SetNamespace("prod")
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion("7")
	u.SetLabels(labels)
	r := &event.Rule{Name: "cms", Cluster: "dev", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}
	return event.New(r, event.Added, u, nil, time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)).WithReplay(event.ReplayCheckpoint)
}

func lineOf(t testing.TB, e *event.Event) string {
	b, err := e.Structured()
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// answers parses Serve's output.
func answers(t testing.TB, out string) []answer {
	t.Helper()
	var as []answer
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var raw map[string]any
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			t.Fatalf("answer %q is not JSON: %v", sc.Text(), err)
		}
		if _, ok := raw["ok"].(bool); !ok {
			t.Fatalf("answer %q has no ok", sc.Text())
		}
		var a answer
		_ = json.Unmarshal(sc.Bytes(), &a)
		as = append(as, a)
	}
	return as
}

func TestEventDecoding(t *testing.T) {
	ev := structured(t, "settings", map[string]string{"team": "pay"})
	var got Event
	err := Serve(context.Background(), strings.NewReader(lineOf(t, ev)), io.Discard, func(_ context.Context, e Event) error {
		got = e
		return nil
	}, Concurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ev.Structured()
	switch {
	case got.ID != ev.ID, got.Source != "kubebridge/dev", got.Type != "io.kubebridge.configmaps.core.added", got.Subject != "prod/settings":
		t.Errorf("attributes: %+v", got)
	case !got.Time.Equal(ev.Time), got.Rule != "cms", got.Cluster != "dev", got.Replay != "checkpoint", got.Reason != "":
		t.Errorf("time and extensions: %+v", got)
	case got.Change() != "added", got.Labels()["team"] != "pay":
		t.Errorf("Change %q, Labels %v", got.Change(), got.Labels())
	case !bytes.Equal(got.Raw, want):
		t.Errorf("Raw = %s, want the line as received", got.Raw)
	case !strings.HasPrefix(string(got.Data), `{"object":{"apiVersion":"v1","data":{"k":"v"}`):
		t.Errorf("Data = %s", got.Data)
	}
}

func TestAnswers(t *testing.T) {
	var in strings.Builder
	for _, name := range []string{"ok", "refuse", "later", "fail", "panic"} {
		in.WriteString(lineOf(t, structured(t, name, nil)))
	}
	in.WriteString("not an event\n")
	in.WriteString(`{"id":"broken","time":"yesterday"}` + "\n")
	var out bytes.Buffer
	err := Serve(context.Background(), strings.NewReader(in.String()), &out, func(_ context.Context, e Event) error {
		switch e.Subject {
		case "prod/refuse":
			return sinks.Permanent(errors.New("schema mismatch"))
		case "prod/later":
			return sinks.Throttle(errors.New("rate limited"), 1500*time.Millisecond)
		case "prod/fail":
			return errors.New("database down")
		case "prod/panic":
			panic("boom")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]answer{}
	for _, a := range answers(t, out.String()) {
		got[a.ID] = a
	}
	want := map[string]answer{
		structured(t, "ok", nil).ID:     {OK: true},
		structured(t, "refuse", nil).ID: {Error: "schema mismatch", Permanent: true},
		structured(t, "later", nil).ID:  {Error: "rate limited", RetryAfter: "1.5s"},
		structured(t, "fail", nil).ID:   {Error: "database down"},
		structured(t, "panic", nil).ID:  {Error: "handler panicked: boom"},
	}
	for id, w := range want {
		w.ID = id
		if got[id] != w {
			t.Errorf("answer for %s = %+v, want %+v", id, got[id], w)
		}
	}
	if a := got["broken"]; !a.Permanent || !strings.Contains(a.Error, "plugin cannot decode the event") {
		t.Errorf("answer for an undecodable event = %+v", a)
	}
	if len(got) != len(want)+1 {
		t.Errorf("%d answers, want %d (the line without an id is skipped)", len(got), len(want)+1)
	}
}

// Handlers run concurrently up to the limit, and answers leave in the
// order handlers finish.
func TestConcurrencyAndOrder(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	release := map[string]chan struct{}{}
	for _, n := range names {
		release[n] = make(chan struct{})
	}
	started := make(chan string, len(names))
	var running, most atomic.Int32
	inR, inW := io.Pipe()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- Serve(context.Background(), inR, &out, func(_ context.Context, e Event) error {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			started <- e.Subject
			<-release[strings.TrimPrefix(e.Subject, "prod/")]
			running.Add(-1)
			return nil
		}, Concurrency(3))
	}()
	for _, n := range names {
		if _, err := io.WriteString(inW, lineOf(t, structured(t, n, nil))); err != nil {
			t.Fatal(err)
		}
	}
	inW.Close()
	for range 3 {
		<-started
	}
	close(release["c"]) // the fourth starts only once one of the three finished
	if s := <-started; s != "prod/d" {
		t.Fatalf("%s started fourth", s)
	}
	close(release["b"])
	close(release["a"])
	close(release["d"])
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if most.Load() != 3 {
		t.Errorf("%d handlers ran at once, want 3", most.Load())
	}
	var order []string
	for _, a := range answers(t, out.String()) {
		order = append(order, strings.Split(a.ID, ".")[0])
	}
	if order[0] != "uid-c" {
		t.Errorf("answers in order %v, want c's first (it finished first)", order)
	}
}

// When ctx ends, handlers see it, Serve waits for them and returns.
func TestServeStopsWithContext(t *testing.T) {
	inR, inW := io.Pipe()
	defer inW.Close() // ends the abandoned read
	var out lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	inHandler := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, inR, &out, func(ctx context.Context, e Event) error {
			close(inHandler)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	ev := structured(t, "slow", nil)
	if _, err := io.WriteString(inW, lineOf(t, ev)); err != nil {
		t.Fatal(err)
	}
	<-inHandler
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Serve = %v", err)
	}
	if as := answers(t, out.String()); len(as) != 1 || as[0].ID != ev.ID || as[0].OK || as[0].Permanent {
		t.Errorf("answers %+v, want a retryable failure for the interrupted event", as)
	}
}

func TestWriteErrorIsReturned(t *testing.T) {
	err := Serve(context.Background(), strings.NewReader(lineOf(t, structured(t, "x", nil))), failingWriter{}, func(context.Context, Event) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "writing answers: stdout gone") {
		t.Errorf("Serve = %v", err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, fmt.Errorf("stdout gone") }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

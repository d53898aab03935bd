package webhook

import (
	"bufio"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// bigEvent is an event whose data is about size bytes.
func bigEvent(name string, size int) *event.Event {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"pad": strings.Repeat("x", size)}}}
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion("1")
	r := &event.Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}
	return event.New(r, event.Added, u, nil, time.Now())
}

// A send cut short (the shard's hold lapsed: its context ends) resets its
// connection: what the bridge's kernel had not sent yet is dropped, and a
// receiver that stalled (a partition, a paused proxy) and reads once it
// recovers ends on a reset, not on an orderly close. Bytes that had already
// reached the receiver's socket are still read by it (Linux delivers them
// before the reset): that is what the fencing token's epoch check is for
// (docs/sinks.md).
func TestCutSendClosesTheConnectionHard(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	s, err := New(&Config{URL: "http://" + l.Addr().String() + "/events", Mode: "binary", Timeout: config.Duration(30 * time.Second)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx, cut := context.WithCancel(context.Background())
	sent := make(chan error, 1)
	go func() { sent <- s.Send(ctx, []*event.Event{bigEvent("late", 64<<10)}) }()
	var conn net.Conn
	select {
	case conn = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection")
	}
	defer conn.Close()
	time.Sleep(200 * time.Millisecond) // the request is written into the stalled link
	cut()
	if err := <-sent; err == nil {
		t.Fatal("a cut send was acknowledged")
	}
	time.Sleep(100 * time.Millisecond)
	// The link recovers: the receiver reads what reached it.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(conn)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after the cut the receiver read %d bytes, then %v: want the connection reset", len(got), err)
	}
}

// Over HTTP/2 a cut send resets only its stream, and the connection, with
// what it still buffers of the request, would stay: a send cut under a
// shard's fence closes the connection it went out on.
func TestCutSendClosesItsHTTP2Connection(t *testing.T) {
	arrived := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // stalled: reads nothing until the stream or the connection ends
	}))
	closed := make(chan struct{})
	var once sync.Once
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			once.Do(func() { close(closed) })
		}
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	must(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	s, err := New(&Config{URL: srv.URL, Mode: "binary", Timeout: config.Duration(30 * time.Second), TLS: &config.TLS{CAFile: ca}}, nil)
	must(t, err)
	defer s.Close(context.Background())
	ctx, cut := context.WithCancel(sinks.WithFence(context.Background(), sinks.Fence{Shard: 1, Shards: 2, Epoch: 4}))
	sent := make(chan error, 1)
	go func() { sent <- s.Send(ctx, []*event.Event{bigEvent("late", 256<<10)}) }()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("no request")
	}
	cut()
	if err := <-sent; err == nil {
		t.Fatal("a cut send was acknowledged")
	}
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Error("the HTTP/2 connection of a cut send stays open")
	}
}

// A receiver that answers every request with ~10 MiB of headers, or an
// endless body, at the adaptive limit's 40 requests in flight, costs the
// sink a bounded amount of memory per request (64 KiB of headers at most;
// it was 10 MiB each: 0.6-1.2 GiB RSS), and each answer is an error naming
// the method, not a delivery.
func TestHostileAnswersAreBounded(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func(w *bufio.Writer)
	}{
		{"headers", func(w *bufio.Writer) {
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\n")
			for range 10 << 20 / len(padLine) {
				_, _ = w.WriteString(padLine)
			}
			_, _ = w.WriteString("Content-Length: 0\r\n\r\n")
		}},
		{"body", func(w *bufio.Writer) {
			_, _ = w.WriteString("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 104857600\r\n\r\n")
			for range 100 << 20 / len(padLine) {
				if _, err := w.WriteString(padLine); err != nil {
					return
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := hostileServer(t, c.answer)
			s, err := New(&Config{URL: "http://" + addr + "/events", Mode: "binary", Timeout: config.Duration(10 * time.Second),
				Request: &Request{Method: http.MethodPut}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			const inFlight = 40
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var wg sync.WaitGroup
			errs := make([]error, inFlight)
			for i := range inFlight {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = s.Send(context.Background(), []*event.Event{bigEvent(fmt.Sprint("o-", i), 10)})
				}()
			}
			wg.Wait()
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / inFlight; per > 1<<20 {
				t.Errorf("%d KiB allocated per request, want at most 1 MiB", per>>10)
			}
			for _, err := range errs {
				if err == nil || !strings.HasPrefix(err.Error(), "PUT ") || sinks.IsPermanent(err) {
					t.Fatalf("answer: %.200v, want a retryable error naming PUT", err)
				}
			}
		})
	}
}

// padLine is an 8 KiB header line (a hostile answer repeats it).
var padLine = "X-Pad: " + strings.Repeat("p", 8<<10) + "\r\n"

// hostileServer answers every request on its connections with answer.
func hostileServer(t *testing.T, answer func(w *bufio.Writer)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				w := bufio.NewWriterSize(c, 64<<10)
				answer(w)
				_ = w.Flush()
			}()
		}
	}()
	return l.Addr().String()
}

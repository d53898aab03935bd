package nats

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// An object whose name makes the subject longer than the server's control
// line (RBAC names have no length limit) is refused alone: before, the
// server ended the connection and nats.go closed it for good, so every
// later event failed while /readyz said OK.
func TestLongSubjectRefusedAlone(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run("jetstream="+strconv.FormatBool(js), func(t *testing.T) {
			srv := startServer(t, 0)
			w := watchWire(t, srv.ClientURL())
			s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), js), nil)
			must(t, err)
			defer s.Close(context.Background())
			long := strings.Repeat("r", 4200)
			batch := []*event.Event{ev("prod", "a", 1, 10), ev("prod", long, 2, 10), ev("prod", "c", 3, 10)}
			errs := eventErrors(t, s.Send(context.Background(), batch), len(batch))
			if errs[0] != nil || errs[2] != nil {
				t.Errorf("neighbours of the long-named object failed: %v", errs)
			}
			if !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "subject") {
				t.Errorf("long subject: %v, want a permanent error naming the subject", errs[1])
			}
			// The connection is fine: later events go.
			next := ev("prod", "d", 4, 10)
			must(t, s.Send(context.Background(), []*event.Event{next}))
			want := []string{batch[0].ID, batch[2].ID, next.ID}
			if got := w.saw(3); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("published %v, want %v", got, want)
			}
			must(t, s.Healthy())
		})
	}
}

// A connection nats.go closes for good (here: the server ends it for a
// control line too long, published past the sink) is reported by Healthy
// and replaced on the next Send.
func TestClosedConnectionIsReplaced(t *testing.T) {
	srv := startServer(t, 0)
	w := watchWire(t, srv.ClientURL())
	s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), false), nil)
	must(t, err)
	defer s.Close(context.Background())
	old := s.Conn()
	_ = old.Publish("k8s."+strings.Repeat("x", 5000), nil)
	_ = old.Flush()
	for deadline := time.Now().Add(5 * time.Second); !old.IsClosed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server did not end the connection")
		}
	}
	if err := s.Healthy(); err == nil {
		t.Error("Healthy = nil with the connection closed for good")
	}
	e := ev("prod", "a", 1, 10)
	must(t, s.Send(context.Background(), []*event.Event{e}))
	if got := w.saw(1); len(got) != 1 || got[0] != e.ID {
		t.Errorf("published %v after the rebuild, want %v", got, e.ID)
	}
	if s.Conn() == old || s.rebuilds.Load() != 1 {
		t.Errorf("connection not replaced (rebuilds=%d)", s.rebuilds.Load())
	}
	must(t, s.Healthy())
	// Close is final: no rebuild after it.
	must(t, s.Close(context.Background()))
	if err := s.Send(context.Background(), []*event.Event{ev("prod", "b", 2, 10)}); !sinks.IsUnavailable(err) {
		t.Errorf("Send after Close = %v, want unavailable", err)
	}
}

// A rotated token: the server is reloaded with a new token and drops the
// connection; the sink reconnects with the token file read again, so
// events flow without a reload of the bridge.
func TestTokenFileRotation(t *testing.T) {
	old := sinks.CheckEvery
	sinks.CheckEvery = 0
	t.Cleanup(func() { sinks.CheckEvery = old })
	opts := &server.Options{Host: "127.0.0.1", Port: -1, Authorization: "first", NoLog: true, NoSigs: true}
	srv, err := server.NewServer(opts)
	must(t, err)
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	tokenFile := filepath.Join(t.TempDir(), "token")
	must(t, os.WriteFile(tokenFile, []byte("first\n"), 0o600))
	c := sinkConfig(srv.ClientURL(), false)
	c.TokenFile = tokenFile
	s, err := Connect(context.Background(), "bus", c, nil)
	must(t, err)
	defer s.Close(context.Background())
	must(t, s.Send(context.Background(), []*event.Event{ev("prod", "a", 1, 10)}))

	must(t, os.WriteFile(tokenFile, []byte("second\n"), 0o600))
	reload := *opts
	reload.Authorization = "second"
	must(t, srv.ReloadOptions(&reload))
	var lastErr error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if lastErr = s.Send(context.Background(), []*event.Event{ev("prod", "b", 2, 10)}); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("no delivery with the rotated token: %v", lastErr)
	}
	if s.Conn().IsClosed() {
		t.Error("the connection was closed")
	}
}

// Errors classified by whether retrying can help.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err   error
		check func(error) bool
	}{
		{err: errMaxPayload(), check: sinks.IsPermanent},
		{err: errAuth(), check: func(err error) bool {
			r, ok := sinks.DestinationReason(err)
			return ok && r == sinks.ReasonUnauthorized
		}},
		{err: errPerm(), check: func(err error) bool { r, ok := sinks.DestinationReason(err); return ok && r == sinks.ReasonForbidden }},
		{err: errTimeout(), check: sinks.IsUnavailable},
		{err: errNoStream(), check: sinks.IsUnavailable},
	} {
		if got := classify(tc.err); !tc.check(got) {
			t.Errorf("classify(%v) = %#v", tc.err, got)
		}
	}
}

func errMaxPayload() error { return fmt.Errorf("publish: %w", natsgo.ErrMaxPayload) }
func errAuth() error       { return fmt.Errorf("connect: %w", natsgo.ErrAuthorization) }
func errPerm() error       { return fmt.Errorf("publish: %w", natsgo.ErrPermissionViolation) }
func errTimeout() error    { return jetstream.ErrAsyncPublishTimeout }
func errNoStream() error   { return jetstream.ErrNoStreamResponse }

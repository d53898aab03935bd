package testenv

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATS is an embedded nats-server with JetStream on a random loopback port
// and a store in the test's temp dir. Restart keeps the port and the store,
// so JetStream streams survive and clients reconnect.
type NATS struct {
	*server.Server
	opts *server.Options
}

// StartNATS starts an embedded nats-server for one test, shut down when it ends.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	n, err := NewNATS(t.TempDir())
	if err != nil {
		t.Fatalf("starting nats-server: %v", err)
	}
	t.Cleanup(n.Stop)
	return n
}

// NewNATS starts an embedded nats-server with JetStream stored in
// storeDir. The caller must call Stop.
func NewNATS(storeDir string) (*NATS, error) {
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      FreePort(), // below the ephemeral range, so Restart can bind it again
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
	}
	n := &NATS{opts: opts}
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *NATS) start() error {
	s, err := server.NewServer(n.opts)
	if err != nil {
		return err
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return errNotReady
	}
	n.Server = s
	return nil
}

// Stop shuts the server down and waits for it; safe to call twice.
func (n *NATS) Stop() {
	if n.Server != nil {
		n.Shutdown()
		n.WaitForShutdown()
	}
}

// Start starts a stopped server again on the same port and store.
func (n *NATS) Start(t testing.TB) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatalf("starting nats-server: %v", err)
	}
}

// Restart stops the server and starts it again on the same port and store.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Stop()
	if err := n.start(); err != nil {
		t.Fatalf("restarting nats-server: %v", err)
	}
}

var errNotReady = errors.New("nats-server not ready for connections within 10s")

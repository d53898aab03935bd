package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// What the nats sink type keeps in the Host (sinks.Settings.Host): the
// embedded nats-servers its sinks configure, and connections of its own
// for its capabilities (dead-letters, the checkpoint's KV bucket), shared
// by every capability whose sink connects alike. Both outlive a reload of
// the sink: the sink is a client of the server, and the connection is not
// the sink's.

// Keys in the host, of the nats type.
const (
	embeddedKey = "nats.embedded\x00"
	connKey     = "nats.conn\x00"
)

// sharedEmbedded returns the host's nats-server that the embedded sink
// name configures as c, started at its first use and kept, across reloads
// of the sink, until the host closes: the sink, the KV checkpoint and
// dead-letters are its clients. A reload that changes the server's own
// settings starts another one (the previous keeps serving the clients that
// still use it).
func sharedEmbedded(ctx context.Context, h sinks.Host, name string, c *Config, logger *slog.Logger) (*Embedded, error) {
	v, err := h.Shared(ctx, embeddedKey+EmbeddedKey(name, c), func(context.Context) (any, func(context.Context) error, error) {
		srv, err := StartEmbedded(name, c)
		if err != nil {
			return nil, nil, err
		}
		if logger != nil {
			logger.Info("embedded nats-server started", "url", srv.URL)
		}
		return srv, func(context.Context) error { srv.Close(); return nil }, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Embedded), nil
}

// sharedConn returns the host's NATS connection to the server of the sink
// s configures: one per connection settings (not what the sink publishes),
// for the capabilities of every sink that connects alike. To an embedded
// server, it connects to the host's (sharedEmbedded): a reload of the sink
// closes neither.
func sharedConn(ctx context.Context, s sinks.Settings) (*natsgo.Conn, error) {
	name := s.Name
	c, ok := s.Config.(*Config)
	if !ok {
		return nil, fmt.Errorf("sink %q is not a nats sink", name)
	}
	if s.Host == nil {
		return nil, errors.New("a connection of the host's needs a host (sinks.Settings.Host)")
	}
	logger := s.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if c.Embedded {
		srv, err := sharedEmbedded(ctx, s.Host, name, c, logger.With("sink", name))
		if err != nil {
			return nil, err
		}
		c = c.WithServer(srv.URL)
	}
	// Keyed by what the connection is made of, not what the sink publishes
	// (the subject is only checked by Connect; streams stay the sink's).
	conn := c.Connection()
	key, _ := json.Marshal(conn)
	v, err := s.Host.Shared(ctx, connKey+string(key), func(ctx context.Context) (any, func(context.Context) error, error) {
		cc := conn
		cc.Subject = c.Subject
		sink, err := Connect(ctx, name+"-bridge", &cc, logger.With("connection", name))
		if err != nil {
			return nil, nil, err
		}
		return sink, sink.Close, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Sink).Conn(), nil
}

// deadLetter is the nats type's dead-letter capability: refused events are
// published to subject over the host's connection to the sink's server.
func deadLetter(ctx context.Context, s sinks.Settings, subject string) (sinks.DeadLetter, error) {
	nc, err := sharedConn(ctx, s)
	if err != nil {
		return nil, err
	}
	return &DeadLetter{NC: nc, Subject: subject}, nil
}

// openKV is the nats type's key-value capability: a JetStream KV bucket on
// the sink's server, over the host's connection to it.
func openKV(ctx context.Context, s sinks.Settings, bucket string) (sinks.KV, error) {
	nc, err := sharedConn(ctx, s)
	if err != nil {
		return nil, err
	}
	return OpenKV(ctx, nc, bucket)
}

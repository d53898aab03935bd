package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// host is what the bridge owns for its sinks rather than any one sink:
// connections shared by the KV checkpoint and dead-letters, embedded
// servers. They outlive a reload of the sink they name and close after
// every sink (close), once.
type host struct {
	logger *slog.Logger

	mu            sync.Mutex
	conns         map[string]*natssink.Sink     // NATS connections, by connection settings
	embedded      map[string]*natssink.Embedded // embedded nats-servers, by their settings
	embeddedOrder []*natssink.Embedded
	closers       []func(context.Context) error
}

func newHost(logger *slog.Logger) *host {
	return &host{logger: logger, conns: map[string]*natssink.Sink{}, embedded: map[string]*natssink.Embedded{}}
}

// checkpointStore opens the KV checkpoint store cfg names, through a
// connection of the host's own, so that a reload of the sink it names
// does not close it. ok is false when cfg names no such store.
func (h *host) checkpointStore(ctx context.Context, cfg *config.Config) (store checkpoint.Store, ok bool, err error) {
	kv := cfg.Checkpoint.NATSKV
	if kv == nil {
		return nil, false, nil
	}
	nc, err := h.natsConn(ctx, cfg, kv.Sink)
	if err != nil {
		return nil, true, fmt.Errorf("checkpoint.natsKV: %w", err)
	}
	store, err = checkpoint.OpenKV(ctx, nc, kv.Bucket)
	return store, true, err
}

// deadLetter builds the dead-letter dl names, and what closes it when its
// sink closes (nil when the host owns what it holds).
func (h *host) deadLetter(ctx context.Context, cfg *config.Config, dl *config.DeadLetter) (sinks.DeadLetter, func(context.Context) error, error) {
	switch {
	case dl == nil:
		return nil, nil, nil
	case dl.File != "":
		f, err := sinks.OpenFileDeadLetter(dl.File, int64(dl.MaxSizeMB)<<20, dl.MaxBackups)
		if err != nil {
			return nil, nil, err
		}
		return f, func(context.Context) error { return f.Close() }, nil
	default:
		nc, err := h.natsConn(ctx, cfg, dl.NATS.Sink)
		if err != nil {
			return nil, nil, err
		}
		return &natssink.DeadLetter{NC: nc, Subject: dl.NATS.Subject}, nil, nil
	}
}

// natsConn returns a NATS connection to the server of the nats sink named
// sinkName, owned by the host (shared by the KV checkpoint and the
// dead-letters that connect alike). An embedded server is the host's too
// (see embeddedServer): the connection is to it, not borrowed from the
// sink, so a reload of the sink closes neither.
func (h *host) natsConn(ctx context.Context, cfg *config.Config, sinkName string) (*natsgo.Conn, error) {
	var sc *config.Sink
	for i := range cfg.Sinks {
		if cfg.Sinks[i].Name == sinkName {
			sc = &cfg.Sinks[i]
		}
	}
	nc, ok := (*natssink.Config)(nil), false
	if sc != nil {
		nc, ok = sc.Spec.(*natssink.Config)
	}
	if !ok {
		return nil, fmt.Errorf("sink %q is not a nats sink", sinkName)
	}
	if nc.Embedded {
		srv, err := h.embeddedServer(sinkName, nc)
		if err != nil {
			return nil, err
		}
		nc = nc.WithServer(srv.URL)
	}
	// Keyed by what the connection is made of, not what the sink publishes
	// (the subject is only checked by Connect; streams stay the sink's).
	c := nc.Connection()
	key, _ := json.Marshal(c)
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.conns[string(key)]; s != nil {
		return s.Conn(), nil
	}
	c.Subject = nc.Subject
	s, err := natssink.Connect(ctx, sinkName+"-bridge", &c, h.logger.With("connection", sinkName))
	if err != nil {
		return nil, err
	}
	h.conns[string(key)] = s
	h.closers = append(h.closers, s.Close)
	return s.Conn(), nil
}

// embeddedServer returns the nats-server an embedded sink configures,
// started at its first use and kept, across reloads of the sink, until
// close: the sink, the KV checkpoint and dead-letters are its clients. A
// reload that changes the server's own settings starts another one (the
// previous keeps serving the clients that still use it).
func (h *host) embeddedServer(name string, c *natssink.Config) (*natssink.Embedded, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	key := natssink.EmbeddedKey(name, c)
	if srv := h.embedded[key]; srv != nil {
		return srv, nil
	}
	srv, err := natssink.StartEmbedded(name, c)
	if err != nil {
		return nil, err
	}
	h.logger.Info("embedded nats-server started", "sink", name, "url", srv.URL)
	h.embedded[key] = srv
	h.embeddedOrder = append(h.embeddedOrder, srv)
	return srv, nil
}

// sinkConfigs returns cfgs as the sinks are built from them: an embedded
// nats sink becomes a client of the host's server.
func (h *host) sinkConfigs(cfgs []config.Sink) ([]config.Sink, error) {
	out := make([]config.Sink, len(cfgs))
	for i, sc := range cfgs {
		out[i] = sc
		if nc, ok := sc.Spec.(*natssink.Config); ok && nc.Embedded {
			srv, err := h.embeddedServer(sc.Name, nc)
			if err != nil {
				return nil, fmt.Errorf("sink %q: %w", sc.Name, err)
			}
			out[i].Spec = nc.WithServer(srv.URL)
		}
	}
	return out, nil
}

// close closes the host's connections, then its embedded servers (after
// their clients). The sinks must be closed already.
func (h *host) close(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for _, c := range h.closers {
		errs = append(errs, c(ctx))
	}
	h.closers = nil
	h.conns = map[string]*natssink.Sink{}
	for _, srv := range h.embeddedOrder {
		srv.Close()
	}
	h.embedded, h.embeddedOrder = map[string]*natssink.Embedded{}, nil
	return errors.Join(errs...)
}

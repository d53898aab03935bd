package bridge

import (
	"context"
	"encoding/json"
	"fmt"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// The resources the bridge owns rather than one sink: the checkpoint store
// and the NATS connections of the KV checkpoint and of NATS dead-letters.
// They outlive a reload of the sink they name.

// openCheckpoint opens the checkpoint store the config names. A NATS KV
// store gets a connection of the bridge's own, so that a reload of the
// sink it names does not close it.
func (b *Bridge) openCheckpoint(ctx context.Context, set *sinkSet) error {
	cp := b.opts.Config.Checkpoint
	if kv := cp.NATSKV; kv != nil && b.opts.CheckpointFile == "" {
		nc, err := b.natsConn(ctx, kv.Sink)
		if err != nil {
			return fmt.Errorf("checkpoint.natsKV: %w", err)
		}
		store, err := checkpoint.OpenKV(ctx, nc, kv.Bucket)
		if err != nil {
			return err
		}
		b.store = store
		return nil
	}
	path := cp.File
	if b.opts.CheckpointFile != "" {
		path = b.opts.CheckpointFile
	}
	store, err := checkpoint.OpenBolt(path, b.opts.ResetCheckpoint)
	if err != nil {
		return err
	}
	b.store = store
	b.closers = append(b.closers, func(context.Context) error { return store.Close() })
	return nil
}

// natsConn returns a NATS connection to the server of the nats sink named
// sinkName, owned by the bridge (shared by the KV checkpoint and the
// dead-letters that connect alike, closed at shutdown). An embedded server
// is the bridge's too (see embeddedServer): the connection is to it, not
// borrowed from the sink, so a reload of the sink closes neither.
func (b *Bridge) natsConn(ctx context.Context, sinkName string) (*natsgo.Conn, error) {
	var sc *config.Sink
	for i := range b.opts.Config.Sinks {
		if b.opts.Config.Sinks[i].Name == sinkName {
			sc = &b.opts.Config.Sinks[i]
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
		srv, err := b.embeddedServer(sinkName, nc)
		if err != nil {
			return nil, err
		}
		nc = nc.WithServer(srv.URL)
	}
	// Keyed by what the connection is made of, not what the sink publishes
	// (the subject is only checked by Connect; streams stay the sink's).
	c := nc.Connection()
	key, _ := json.Marshal(c)
	if s := b.conns[string(key)]; s != nil {
		return s.Conn(), nil
	}
	c.Subject = nc.Subject
	s, err := natssink.Connect(ctx, sinkName+"-bridge", &c, b.logger.With("connection", sinkName))
	if err != nil {
		return nil, err
	}
	b.conns[string(key)] = s
	b.closers = append(b.closers, s.Close)
	return s.Conn(), nil
}

// embeddedServer returns the nats-server an embedded sink configures,
// started at its first use and kept, across reloads of the sink, until
// shutdown (closeAll): the sink, the KV checkpoint and dead-letters are
// its clients. A reload that changes the server's own settings starts
// another one (the previous keeps serving the clients that still use it).
func (b *Bridge) embeddedServer(name string, c *natssink.Config) (*natssink.Embedded, error) {
	b.embeddedMu.Lock()
	defer b.embeddedMu.Unlock()
	key := natssink.EmbeddedKey(name, c)
	if srv := b.embedded[key]; srv != nil {
		return srv, nil
	}
	srv, err := natssink.StartEmbedded(name, c)
	if err != nil {
		return nil, err
	}
	b.logger.Info("embedded nats-server started", "sink", name, "url", srv.URL)
	b.embedded[key] = srv
	b.embeddedOrder = append(b.embeddedOrder, srv)
	return srv, nil
}

// sinkConfigs returns cfgs as the sinks are built from them: an embedded
// nats sink becomes a client of the bridge's server.
func (b *Bridge) sinkConfigs(cfgs []config.Sink) ([]config.Sink, error) {
	out := make([]config.Sink, len(cfgs))
	for i, sc := range cfgs {
		out[i] = sc
		if nc, ok := sc.Spec.(*natssink.Config); ok && nc.Embedded {
			srv, err := b.embeddedServer(sc.Name, nc)
			if err != nil {
				return nil, fmt.Errorf("sink %q: %w", sc.Name, err)
			}
			out[i].Spec = nc.WithServer(srv.URL)
		}
	}
	return out, nil
}

// closeEmbedded shuts the embedded servers down, after their clients.
func (b *Bridge) closeEmbedded() {
	b.embeddedMu.Lock()
	defer b.embeddedMu.Unlock()
	for _, srv := range b.embeddedOrder {
		srv.Close()
	}
	b.embedded, b.embeddedOrder = map[string]*natssink.Embedded{}, nil
}

// deadLetter builds the dead-letter of sink s, if it has one.
func (b *Bridge) deadLetter(ctx context.Context, s *sinkRun) (sinks.DeadLetter, error) {
	switch dl := s.cfg.DeadLetter; {
	case dl == nil:
		return nil, nil
	case dl.File != "":
		f, err := sinks.OpenFileDeadLetter(dl.File, int64(dl.MaxSizeMB)<<20, dl.MaxBackups)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func(context.Context) error { return f.Close() })
		return f, nil
	default:
		nc, err := b.natsConn(ctx, dl.NATS.Sink)
		if err != nil {
			return nil, err
		}
		return &natssink.DeadLetter{NC: nc, Subject: dl.NATS.Subject}, nil
	}
}

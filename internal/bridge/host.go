package bridge

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// host is what the bridge owns for its sinks rather than any one sink: the
// pool of what the sink types share (sinks.Host: connections, embedded
// servers), which the sinks get through sinks.Settings.Host, and the
// dead-letters and checkpoint store that the config asks of a sink's type
// (its factory's DeadLetter and KV). What the pool holds outlives a reload
// of the sink it serves and closes after every sink (close), once. No sink
// type is named here: the registry says which types provide what.
type host struct {
	logger *slog.Logger
	pool   *sinks.Pool
	// sinks is the bridge's registry handing pool to the factories.
	sinks *sinks.Registry
}

// newHost returns the host of a bridge that builds its sinks with reg;
// the bridge builds them with the host's registry (host.sinks).
func newHost(logger *slog.Logger, reg *sinks.Registry) *host {
	pool := sinks.NewPool()
	return &host{logger: logger, pool: pool, sinks: reg.WithHost(pool)}
}

// sinkConfig returns the config of the sink named name, whose factory provides
// what its type provides.
func sinkConfig(cfg *config.Config, name string) (config.Sink, error) {
	for _, sc := range cfg.Sinks {
		if sc.Name == name {
			return sc, nil
		}
	}
	return config.Sink{}, fmt.Errorf("unknown sink %q", name)
}

// checkpointStore opens the checkpoint store in the key-value bucket of the
// sink cfg names for it, which its type provides (sinks.Factory.KV) over
// what it shares through the host, so that a reload of the sink does not
// close it. ok is false when cfg names no such store.
func (h *host) checkpointStore(ctx context.Context, cfg *config.Config) (store checkpoint.Store, ok bool, err error) {
	ref, ok := cfg.Checkpoint.SinkRef()
	if !ok {
		return nil, false, nil
	}
	sc, err := sinkConfig(cfg, ref.Sink)
	if err != nil {
		return nil, true, fmt.Errorf("%s: %w", ref.Path, err)
	}
	bucket, err := h.sinks.KV(ctx, sc, h.logger, ref.Target)
	if err != nil {
		return nil, true, fmt.Errorf("%s: %w", ref.Path, err)
	}
	return checkpoint.NewKV(bucket), true, nil
}

// deadLetter builds the dead-letter dl names, and what closes it when its
// sink closes (nil when the host owns what it holds): a file, or the
// destination of a sink whose type provides dead-letters
// (sinks.Factory.DeadLetter).
func (h *host) deadLetter(ctx context.Context, cfg *config.Config, dl *config.DeadLetter) (sinks.DeadLetter, func(context.Context) error, error) {
	if dl == nil {
		return nil, nil, nil
	}
	ref, ok := dl.SinkRef()
	if !ok {
		f, err := sinks.OpenFileDeadLetter(dl.File, int64(dl.MaxSizeMB)<<20, dl.MaxBackups)
		if err != nil {
			return nil, nil, err
		}
		return f, func(context.Context) error { return f.Close() }, nil
	}
	sc, err := sinkConfig(cfg, ref.Sink)
	if err != nil {
		return nil, nil, err
	}
	d, err := h.sinks.DeadLetter(ctx, sc, h.logger, ref.Target)
	if err != nil {
		return nil, nil, err
	}
	if c, ok := d.(interface{ Close(context.Context) error }); ok {
		return d, c.Close, nil
	}
	return d, nil, nil
}

// close closes what the sinks share, the last opened first (connections
// before the embedded servers they are clients of). The sinks must be
// closed already.
func (h *host) close(ctx context.Context) error {
	return h.pool.Close(ctx)
}

package bridge

import (
	"context"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
)

// openCheckpoint opens the checkpoint store the config names (the
// deliverer's OpenStore), which the deliverer closes: a key-value bucket
// of a sink's destination, through the host (what the bucket holds, a
// connection, outlives a reload of the sink it names and the host
// closes), or a bbolt file.
func (b *Bridge) openCheckpoint(ctx context.Context) (checkpoint.Store, func() error, error) {
	if b.opts.CheckpointFile == "" {
		store, ok, err := b.host.checkpointStore(ctx, b.opts.Config)
		if ok {
			if err != nil {
				return nil, nil, err
			}
			if err := checkShardLayout(ctx, store, b.opts.Config); err != nil {
				_ = store.Close()
				return nil, nil, err
			}
			return store, store.Close, nil
		}
	}
	path := b.opts.Config.Checkpoint.File
	if b.opts.CheckpointFile != "" {
		path = b.opts.CheckpointFile
	}
	store, err := checkpoint.OpenBolt(path, b.opts.ResetCheckpoint)
	if err != nil {
		return nil, nil, err
	}
	return store, store.Close, nil
}

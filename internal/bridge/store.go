package bridge

import (
	"context"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
)

// openCheckpoint opens the checkpoint store the config names (the
// deliverer's OpenStore): the host's KV store, whose connection outlives
// a reload of the sink it names and which the host closes, or a bbolt
// file, which the deliverer closes.
func (b *Bridge) openCheckpoint(ctx context.Context) (checkpoint.Store, func() error, error) {
	if b.opts.CheckpointFile == "" {
		store, ok, err := b.host.checkpointStore(ctx, b.opts.Config)
		if ok {
			return store, nil, err
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

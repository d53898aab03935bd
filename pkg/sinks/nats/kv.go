package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// KV is a JetStream key-value bucket (sinks.KV): the nats sink's KV
// capability, which the host keeps its checkpoint in.
type KV struct {
	kv jetstream.KeyValue
}

var _ sinks.KV = (*KV)(nil)

// OpenKV opens (creating) the bucket over nc, keeping one value per key.
func OpenKV(ctx context.Context, nc *natsgo.Conn, bucket string) (*KV, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Description: "kubebridge delivered views"})
	if err != nil {
		return nil, fmt.Errorf("checkpoint bucket %s: %w", bucket, err)
	}
	return &KV{kv: kv}, nil
}

// Get returns the value of key.
func (k *KV) Get(ctx context.Context, key string) ([]byte, bool, error) {
	e, err := k.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return e.Value(), true, nil
}

// Put sets the value of key.
func (k *KV) Put(ctx context.Context, key string, value []byte) error {
	_, err := k.kv.Put(ctx, key, value)
	return err
}

// Delete removes key.
func (k *KV) Delete(ctx context.Context, key string) error {
	if err := k.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}

// List returns the keys under prefix (whole tokens: it ends with a dot)
// and their values, as the bucket holds them now.
func (k *KV) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	filter := prefix[:strings.LastIndexByte(prefix, '.')+1] + ">" // whole tokens; the rest is filtered below
	w, err := k.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string][]byte{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("checkpoint watch closed")
			}
			if e == nil {
				return out, nil // all current values seen
			}
			if strings.HasPrefix(e.Key(), prefix) {
				out[e.Key()] = e.Value()
			}
		}
	}
}

// Close does nothing: the connection is the host's.
func (k *KV) Close() error { return nil }

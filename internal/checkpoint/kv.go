package checkpoint

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// KV is a Store in a NATS JetStream key-value bucket, so that a bridge in
// another pod (a new leader) resumes where the last one stopped. Keys are
// <sink>.<rule>.<base64url(object key)>.
type KV struct {
	kv jetstream.KeyValue
}

// OpenKV opens (creating) the bucket over nc.
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

func kvKey(sink, rule, key string) string {
	return sink + "." + rule + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// Load reads the view of sink's rule.
func (k *KV) Load(ctx context.Context, sink, rule string) (map[string]Entry, error) {
	prefix := sink + "." + rule + "."
	w, err := k.kv.Watch(ctx, prefix+"*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string]Entry{}
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
			raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(e.Key(), prefix))
			if err != nil {
				return nil, fmt.Errorf("%w: key %s: %v", ErrCorrupt, e.Key(), err)
			}
			var entry Entry
			if err := json.Unmarshal(e.Value(), &entry); err != nil {
				return nil, fmt.Errorf("%w: key %s: %v", ErrCorrupt, e.Key(), err)
			}
			out[string(raw)] = entry
		}
	}
}

// Apply writes the changes in order (each key on its own; the bucket keeps
// the latest per key).
func (k *KV) Apply(ctx context.Context, changes []Change) error {
	for _, c := range changes {
		key := kvKey(c.Sink, c.Rule, c.Key)
		if c.Entry == nil {
			if c.IfUID != "" {
				e, err := k.kv.Get(ctx, key)
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				var held Entry
				if json.Unmarshal(e.Value(), &held) == nil && held.UID != c.IfUID {
					continue
				}
			}
			if err := k.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return err
			}
			continue
		}
		v, err := json.Marshal(c.Entry)
		if err != nil {
			return err
		}
		if _, err := k.kv.Put(ctx, key, v); err != nil {
			return err
		}
	}
	return nil
}

// Close does nothing: the connection belongs to the bridge.
func (k *KV) Close() error { return nil }

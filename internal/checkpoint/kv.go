package checkpoint

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// KV is a Store in a key-value bucket of a sink's destination (sinks.KV,
// which a sink type provides: the nats sink's is a JetStream KV bucket), so
// that a bridge in another pod (a new leader) resumes where the last one
// stopped. Keys are <sink>.<rule>.<base64url(object key)>, values JSON
// entries: the format is the checkpoint's, whatever holds the bucket.
type KV struct {
	kv sinks.KV
}

// NewKV returns the store in bucket.
func NewKV(bucket sinks.KV) *KV { return &KV{kv: bucket} }

func kvKey(sink, rule, key string) string {
	return sink + "." + rule + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// Load reads the view of sink's rule.
func (k *KV) Load(ctx context.Context, sink, rule string) (map[string]Entry, error) {
	prefix := sink + "." + rule + "."
	all, err := k.kv.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := map[string]Entry{}
	for key, value := range all {
		rest := strings.TrimPrefix(key, prefix)
		if strings.Contains(rest, ".") {
			continue // not one token: no key of this rule
		}
		raw, err := base64.RawURLEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("%w: key %s: %v", ErrCorrupt, key, err)
		}
		var entry Entry
		if err := json.Unmarshal(value, &entry); err != nil {
			return nil, fmt.Errorf("%w: key %s: %v", ErrCorrupt, key, err)
		}
		out[string(raw)] = entry
	}
	return out, nil
}

// Apply writes the changes in order (each key on its own; the bucket keeps
// the latest per key).
func (k *KV) Apply(ctx context.Context, changes []Change) error {
	for _, c := range changes {
		key := kvKey(c.Sink, c.Rule, c.Key)
		if c.Entry == nil {
			if c.IfUID != "" {
				v, ok, err := k.kv.Get(ctx, key)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				var held Entry
				if json.Unmarshal(v, &held) == nil && held.UID != c.IfUID {
					continue
				}
			}
			if err := k.kv.Delete(ctx, key); err != nil {
				return err
			}
			continue
		}
		v, err := json.Marshal(c.Entry)
		if err != nil {
			return err
		}
		if err := k.kv.Put(ctx, key, v); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the bucket (the connection under it is the host's).
func (k *KV) Close() error { return k.kv.Close() }

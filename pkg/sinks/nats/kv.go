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
// capability, which the host keeps its checkpoint in. Its writes carry
// the key's expected last revision (Nats-Expected-Last-Subject-Sequence),
// which the stream checks as it stores them.
type KV struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	pre string // the subject of a key is pre + key
}

var _ sinks.KV = (*KV)(nil)

// OpenKV opens (creating) the bucket over nc, keeping one value per key;
// it waits for nc to connect (a server not up yet at start).
func OpenKV(ctx context.Context, nc *natsgo.Conn, bucket string) (*KV, error) {
	if err := waitConnected(ctx, nc, nil); err != nil {
		return nil, fmt.Errorf("checkpoint bucket %s: %w", bucket, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Description: "kubebridge delivered views"})
	if err != nil {
		return nil, fmt.Errorf("checkpoint bucket %s: %w", bucket, err)
	}
	return &KV{js: js, kv: kv, pre: "$KV." + bucket + "."}, nil
}

// Get returns the value of key.
func (k *KV) Get(ctx context.Context, key string) (sinks.KVEntry, bool, error) {
	e, err := k.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return sinks.KVEntry{}, false, nil
	}
	if err != nil {
		return sinks.KVEntry{}, false, err
	}
	return sinks.KVEntry{Value: e.Value(), Revision: e.Revision()}, true, nil
}

// Put sets the value of key if its last revision is last.
func (k *KV) Put(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := k.kv.Update(ctx, key, value, last)
	return rev, k.refused(ctx, key, err)
}

// Delete places a deletion marker for key if its last revision is last
// (as the client's Delete does, but returning the marker's revision).
func (k *KV) Delete(ctx context.Context, key string, last uint64) (uint64, error) {
	m := &natsgo.Msg{Subject: k.pre + key, Header: natsgo.Header{"KV-Operation": []string{"DEL"}}}
	ack, err := k.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(last))
	if err != nil {
		return 0, k.refused(ctx, key, err)
	}
	return ack.Sequence, nil
}

// refused turns the stream's refusal of an expected revision into a
// *sinks.RevisionError with the key's last revision: the one the stream
// named, or the one it holds now when it named none (10164: a replicated
// stream's answer while another write of the key is in progress).
func (k *KV) refused(ctx context.Context, key string, err error) error {
	if err == nil {
		return nil
	}
	found, known, ok := fenceRefused(err)
	if !ok {
		return err
	}
	if !known {
		var gerr error
		if found, gerr = lastStored(ctx, k.js, k.pre+key); gerr != nil {
			return fmt.Errorf("%w (and reading its revision: %v)", err, gerr)
		}
	}
	return &sinks.RevisionError{Key: key, Current: found, Err: err}
}

// List returns the keys under prefix (whole tokens: it ends with a dot)
// and their values, as the bucket holds them now.
func (k *KV) List(ctx context.Context, prefix string) (map[string]sinks.KVEntry, error) {
	filter := prefix[:strings.LastIndexByte(prefix, '.')+1] + ">" // whole tokens; the rest is filtered below
	w, err := k.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string]sinks.KVEntry{}
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
				out[e.Key()] = sinks.KVEntry{Value: e.Value(), Revision: e.Revision()}
			}
		}
	}
}

// Close does nothing: the connection is the host's.
func (k *KV) Close() error { return nil }

package checkpoint

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// KV is a Store in a key-value bucket of a sink's destination (sinks.KV,
// which a sink type provides: the nats sink's is a JetStream KV bucket), so
// that a bridge in another pod (a new leader, a shard's new owner) resumes
// where the last one stopped. Keys are <sink>.<rule>.<base64url(object
// key)>, values JSON entries: the format is the checkpoint's, whatever holds
// the bucket.
//
// Fenced where it lands: every write expects the key's last revision as
// this store last wrote or read it, and the bucket refuses it otherwise. A
// write that a replica sent before it gave its shard up (a stalled link, a
// buffer) and that lands after the shard's new owner wrote the key is
// refused, never stored. On a refusal the store asks whether its writer
// may still write (sinks.MayWrite: the context, and the ownership's fence
// asked now, after the other write); if so the key was written before this
// owner's time (a predecessor's late write, or a write this store never
// saw), and it adopts the bucket's revision and writes again.
type KV struct {
	kv   sinks.KV
	seed maphash.Seed
	mu   sync.Mutex
	revs map[uint64]uint64 // hash of a key -> its last revision known here
}

// NewKV returns the store in bucket.
func NewKV(bucket sinks.KV) *KV {
	return &KV{kv: bucket, seed: maphash.MakeSeed(), revs: map[uint64]uint64{}}
}

// maxRevisions bounds the revisions remembered (an arbitrary one is
// forgotten for each new one past it: it costs a refusal, never a wrong
// write).
const maxRevisions = 1 << 18

// maxRefusals bounds how often one change is written again after the
// bucket refused its expected revision: more means another writer keeps
// writing the key, and the next flush tries again.
const maxRefusals = 3

func kvKey(sink, rule, key string) string {
	return sink + "." + rule + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// rev returns the revision known for key (0: none).
func (k *KV) rev(key string) uint64 {
	h := maphash.String(k.seed, key)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.revs[h]
}

// learn records key's last revision; 0 forgets it (a deleted key: the
// next write learns the deletion's revision from the bucket's refusal).
func (k *KV) learn(key string, rev uint64) {
	h := maphash.String(k.seed, key)
	k.mu.Lock()
	defer k.mu.Unlock()
	if rev == 0 {
		delete(k.revs, h)
		return
	}
	if _, ok := k.revs[h]; !ok && len(k.revs) >= maxRevisions {
		for old := range k.revs {
			delete(k.revs, old)
			break
		}
	}
	k.revs[h] = rev
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
		if err := json.Unmarshal(value.Value, &entry); err != nil {
			return nil, fmt.Errorf("%w: key %s: %v", ErrCorrupt, key, err)
		}
		out[string(raw)] = entry
		k.learn(key, value.Revision)
	}
	return out, nil
}

// Apply writes the changes in order (each key on its own; the bucket keeps
// the latest per key).
func (k *KV) Apply(ctx context.Context, changes []Change) error {
	for _, c := range changes {
		key := kvKey(c.Sink, c.Rule, c.Key)
		var err error
		if c.Entry == nil {
			err = k.delete(ctx, key, c.IfUID)
		} else {
			var v []byte
			if v, err = json.Marshal(c.Entry); err == nil {
				err = k.put(ctx, key, v)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// put writes value under key, expecting the revision known for it.
func (k *KV) put(ctx context.Context, key string, value []byte) error {
	for refused := 0; ; refused++ {
		rev, err := k.kv.Put(ctx, key, value, k.rev(key))
		if err == nil {
			k.learn(key, rev)
			return nil
		}
		if !k.adopt(ctx, key, err, refused) {
			return err
		}
	}
}

// delete removes key, expecting the revision known for it; with ifUID,
// only while the entry it holds is that incarnation's (read, then removed
// at the revision read: a write in between is a refusal, and read again).
func (k *KV) delete(ctx context.Context, key, ifUID string) error {
	for refused := 0; ; refused++ {
		last := k.rev(key)
		if ifUID != "" {
			e, ok, err := k.kv.Get(ctx, key)
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
			var held Entry
			if json.Unmarshal(e.Value, &held) == nil && held.UID != ifUID {
				k.learn(key, e.Revision)
				return nil
			}
			if e.Revision != last {
				// Written by someone else since: delete on top of it only
				// while this writer may still write.
				if err := sinks.MayWrite(ctx); err != nil {
					return err
				}
			}
			last = e.Revision
		}
		_, err := k.kv.Delete(ctx, key, last)
		if err == nil {
			k.learn(key, 0)
			return nil
		}
		if !k.adopt(ctx, key, err, refused) {
			return err
		}
	}
}

// adopt learns the revision a refusal names and says whether to write
// again: the bucket refused the expected revision, the writer may still
// write (sinks.MayWrite, asked after the refusal), and it was not refused
// too often.
func (k *KV) adopt(ctx context.Context, key string, err error, refused int) bool {
	var re *sinks.RevisionError
	if !errors.As(err, &re) || refused >= maxRefusals || sinks.MayWrite(ctx) != nil {
		return false
	}
	k.learn(key, re.Current)
	return true
}

// Close closes the bucket (the connection under it is the host's).
func (k *KV) Close() error { return k.kv.Close() }

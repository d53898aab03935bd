package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Bolt is a Store in a bbolt file: one bucket per sink, one nested bucket
// per rule, object keys to JSON entries.
type Bolt struct {
	db *bolt.DB
}

// OpenBolt opens (creating) the file at path. A file that is not a bbolt
// database, or is damaged, is reported as ErrCorrupt with the path; with
// reset it is moved aside (path.corrupt-<time>) and a new one started.
func OpenBolt(path string, reset bool) (*Bolt, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if reset {
		if _, err := os.Stat(path); err == nil {
			aside := fmt.Sprintf("%s.reset-%s", path, time.Now().UTC().Format("20060102T150405Z"))
			if err := os.Rename(path, aside); err != nil {
				return nil, fmt.Errorf("checkpoint %s: moving it aside: %w", path, err)
			}
		}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("checkpoint %s is locked by another process (another bridge running?)", path)
		}
		return nil, fmt.Errorf("checkpoint %s: %w: %v (start with --reset-checkpoint to move it aside and replay the full view)", path, ErrCorrupt, err)
	}
	// Check every page once at open: a damaged file must not pass for an empty view.
	if err := db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() { // drained in full: the checker stops when the channel does
			if first == nil {
				first = err
			}
		}
		return first
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("checkpoint %s: %w: %v (start with --reset-checkpoint to move it aside and replay the full view)", path, ErrCorrupt, err)
	}
	return &Bolt{db: db}, nil
}

// Load returns the view of sink's rule.
func (b *Bolt) Load(_ context.Context, sink, rule string) (map[string]Entry, error) {
	out := map[string]Entry{}
	err := b.db.View(func(tx *bolt.Tx) error {
		sb := tx.Bucket([]byte(sink))
		if sb == nil {
			return nil
		}
		rb := sb.Bucket([]byte(rule))
		if rb == nil {
			return nil
		}
		return rb.ForEach(func(k, v []byte) error {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("%w: %s/%s/%s: %v", ErrCorrupt, sink, rule, k, err)
			}
			out[string(k)] = e
			return nil
		})
	})
	return out, err
}

// Apply writes the changes in one transaction (fsynced by bbolt).
func (b *Bolt) Apply(_ context.Context, changes []Change) error {
	if len(changes) == 0 {
		return nil
	}
	return b.db.Update(func(tx *bolt.Tx) error {
		for _, c := range changes {
			sb, err := tx.CreateBucketIfNotExists([]byte(c.Sink))
			if err != nil {
				return err
			}
			rb, err := sb.CreateBucketIfNotExists([]byte(c.Rule))
			if err != nil {
				return err
			}
			if c.Entry == nil {
				if c.IfUID != "" {
					var held Entry
					if v := rb.Get([]byte(c.Key)); v == nil || (json.Unmarshal(v, &held) == nil && held.UID != c.IfUID) {
						continue
					}
				}
				if err := rb.Delete([]byte(c.Key)); err != nil {
					return err
				}
				continue
			}
			v, err := json.Marshal(c.Entry)
			if err != nil {
				return err
			}
			if err := rb.Put([]byte(c.Key), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close closes the file.
func (b *Bolt) Close() error { return b.db.Close() }

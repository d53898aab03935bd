package sinks

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// FileDeadLetter appends each refused event as a JSON line
// {"time":…, "sink":…, "error":…, "event":{…}} and fsyncs.
type FileDeadLetter struct {
	mu sync.Mutex
	f  *os.File
}

// OpenFileDeadLetter opens (creating) the dead-letter file at path.
func OpenFileDeadLetter(path string) (*FileDeadLetter, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("dead-letter file: %w", err)
	}
	return &FileDeadLetter{f: f}, nil
}

type deadLetterRecord struct {
	Time  time.Time    `json:"time"`
	Sink  string       `json:"sink"`
	Error string       `json:"error"`
	Event *event.Event `json:"event"`
}

// Put writes the events with their error.
func (d *FileDeadLetter) Put(_ context.Context, sink string, events []*event.Event, cause error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	enc := json.NewEncoder(d.f)
	now := time.Now().UTC()
	for _, e := range events {
		if err := enc.Encode(deadLetterRecord{Time: now, Sink: sink, Error: cause.Error(), Event: e}); err != nil {
			return err
		}
	}
	return d.f.Sync()
}

// Close closes the file.
func (d *FileDeadLetter) Close() error { return d.f.Close() }

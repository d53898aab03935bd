package sinks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/rotatefile"
)

// DeadLetter receives events a sink refused permanently, with the error.
type DeadLetter interface {
	Put(ctx context.Context, sink string, events []*event.Event, cause error) error
}

// FileDeadLetter appends each refused event as a JSON line
// {"time":…, "sink":…, "error":…, "event":{…}} and fsyncs; the file
// rotates by size (maxSizeMB, maxBackups), so a destination that refuses
// everything for days fills no disk.
type FileDeadLetter struct {
	mu  sync.Mutex
	f   *rotatefile.File
	buf bytes.Buffer
}

// OpenFileDeadLetter opens (creating) the dead-letter file at path, which
// rotates at maxSize bytes keeping maxBackups old files.
func OpenFileDeadLetter(path string, maxSize int64, maxBackups int) (*FileDeadLetter, error) {
	f, err := rotatefile.Open(path, maxSize, maxBackups)
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
	// One write (and fsync) for the batch: a rotation happens between
	// writes, never inside one, so every file holds whole records.
	d.buf.Reset()
	enc := json.NewEncoder(&d.buf)
	now := time.Now().UTC()
	for _, e := range events {
		if err := enc.Encode(deadLetterRecord{Time: now, Sink: sink, Error: cause.Error(), Event: e}); err != nil {
			return err
		}
	}
	if err := d.f.Write(d.buf.Bytes()); err != nil {
		return fmt.Errorf("dead-letter file: %w", err)
	}
	return nil
}

// Close closes the file.
func (d *FileDeadLetter) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.f.Close()
}

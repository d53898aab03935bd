// Package file is the file sink: one CloudEvent per line (JSON lines),
// appended to a file that rotates by size, or written to stdout ("-").
//
// A batch is acknowledged after it is written and fsynced, so an
// acknowledged event survives a crash of the bridge or the machine. A failed
// write is reported (the delivery loop retries the batch; lines of a partly
// written batch may then appear twice, never zero times). A full disk is
// reported as such.
//
// Rotation is by size (pkg/internal/rotatefile): when a batch would take the
// file past maxSizeMB, the file is renamed to <path>.1 (older backups shift
// up to <path>.<maxBackups>, the oldest is removed) and a new file is
// started.
package file

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/rotatefile"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds file sinks.
var Factory = sinks.Factory{
	Type:      "file",
	NewConfig: func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:    create,
}

func create(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
	c := s.Config.(*Config)
	if c.Path == "-" {
		return &Sink{out: os.Stdout}, nil
	}
	return Open(c.Path, int64(c.MaxSizeMB)<<20, c.MaxBackups)
}

// Sink writes events as JSON lines.
type Sink struct {
	mu   sync.Mutex // several workers: one write at a time
	path string     // "" for stdout
	f    *rotatefile.File
	out  io.Writer // stdout
	buf  bytes.Buffer
}

// Open opens (creating it and its directory if needed) the file at path for
// appending; it rotates at maxSize bytes keeping maxBackups old files.
func Open(path string, maxSize int64, maxBackups int) (*Sink, error) {
	f, err := rotatefile.Open(path, maxSize, maxBackups)
	if err != nil {
		return nil, fmt.Errorf("file sink: %w", err)
	}
	return &Sink{path: path, f: f}, nil
}

// Ordered: a batch is one write, in order, so an object's events may
// travel in it together.
func (s *Sink) Ordered() bool { return true }

// Send writes the batch and fsyncs it.
func (s *Sink) Send(_ context.Context, events []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
	var errs []error // one event that cannot be encoded is refused alone
	for i, ev := range events {
		b, err := ev.Structured()
		if err != nil {
			if errs == nil {
				errs = make([]error, len(events))
			}
			errs[i] = sinks.Permanent(fmt.Errorf("encoding event %s: %w", ev.ID, err))
			continue
		}
		s.buf.Write(b)
		s.buf.WriteByte('\n')
	}
	if err := s.write(); err != nil {
		return err
	}
	if errs != nil {
		return sinks.Outcome(errs)
	}
	return nil
}

// write appends the buffer (rotating first when it would grow the file
// past maxSize) and fsyncs it.
func (s *Sink) write() error {
	if s.buf.Len() == 0 {
		return nil
	}
	if s.out != nil {
		_, err := s.out.Write(s.buf.Bytes())
		return err
	}
	if s.f == nil {
		return fmt.Errorf("file sink %s: closed", s.path)
	}
	if err := s.f.Write(s.buf.Bytes()); err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	return nil
}

// Close closes the file.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

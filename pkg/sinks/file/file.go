// Package file is the file sink: one CloudEvent per line (JSON lines),
// appended to a file that rotates by size, or written to stdout ("-").
//
// A batch is acknowledged after it is written and fsynced, so an
// acknowledged event survives a crash of the bridge or the machine. A failed
// write is reported (the delivery loop retries the batch; lines of a partly
// written batch may then appear twice, never zero times). A full disk is
// reported as such.
//
// Rotation is by size: when a batch would take the file past maxSizeMB, the
// file is renamed to <path>.1 (older backups shift up to <path>.<maxBackups>,
// the oldest is removed) and a new file is started. lumberjack does the same
// but cannot fsync, which the acknowledgement needs.
package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds file sinks.
var Factory = sinks.Factory{
	Type:      "file",
	NewConfig: func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:    create,
}

func create(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
	c := s.Config.Spec.(*Config)
	if c.Path == "-" {
		return &Sink{out: os.Stdout}, nil
	}
	return Open(c.Path, int64(c.MaxSizeMB)<<20, c.MaxBackups)
}

// Sink writes events as JSON lines.
type Sink struct {
	mu         sync.Mutex // several workers: one write at a time
	path       string     // "" for stdout
	maxSize    int64
	maxBackups int
	f          *os.File
	size       int64
	out        io.Writer // stdout
	buf        bytes.Buffer
}

// Open opens (creating it and its directory if needed) the file at path for
// appending; it rotates at maxSize bytes keeping maxBackups old files.
func Open(path string, maxSize int64, maxBackups int) (*Sink, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("file sink: %w", err)
	}
	s := &Sink{path: path, maxSize: maxSize, maxBackups: maxBackups}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Sink) open() error {
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("file sink: %w", err)
	}
	s.f, s.size = f, st.Size()
	return nil
}

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

// write appends the buffer to the file (rotating first when it would
// grow past maxSize) and fsyncs it.
func (s *Sink) write() error {
	if s.buf.Len() == 0 {
		return nil
	}
	if s.out != nil {
		_, err := s.out.Write(s.buf.Bytes())
		return err
	}
	if s.f == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	if s.size > 0 && s.size+int64(s.buf.Len()) > s.maxSize {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	n, err := s.f.Write(s.buf.Bytes())
	s.size += int64(n)
	if err == nil {
		err = s.f.Sync()
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("file sink %s: disk full: %w", s.path, err)
		}
		return fmt.Errorf("file sink %s: %w", s.path, err)
	}
	return nil
}

// rotate shifts path.N-1 -> path.N ... path -> path.1 and opens a new path.
func (s *Sink) rotate() error {
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("file sink: closing for rotation: %w", err)
	}
	s.f = nil
	if s.maxBackups == 0 {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("file sink: %w", err)
		}
		return s.open()
	}
	_ = os.Remove(s.backup(s.maxBackups))
	for i := s.maxBackups - 1; i >= 1; i-- {
		if err := os.Rename(s.backup(i), s.backup(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("file sink: rotating: %w", err)
		}
	}
	if err := os.Rename(s.path, s.backup(1)); err != nil {
		return fmt.Errorf("file sink: rotating: %w", err)
	}
	return s.open()
}

func (s *Sink) backup(i int) string { return s.path + "." + strconv.Itoa(i) }

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

// Package tsv is a sink type written outside kubebridge: it appends one
// tab-separated line per event to a file, in a format a shell script can
// cut and grep:
//
//	<time RFC 3339>\t<added|updated|deleted>\t<rule>\t<namespace/name>\t<event id>
//
// It shows the whole contract of a sink (pkg/sinks): a Factory with its
// config (defaults, validation), a Send that returns nil only once the
// destination holds the batch (written and fsynced), errors classed by
// whether a retry can help, a Close.
package tsv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Config is the block under a sink's tsv: key.
type Config struct {
	// Path is the file the lines are appended to (created 0600 when absent). Required.
	Path string `yaml:"path"`
}

// Validate checks the block; the loader reports its error with the key
// path and line (sinks[0].tsv.path).
func (c *Config) Validate() error {
	if c.Path == "" {
		return config.ErrorAt("path", "is required")
	}
	if !filepath.IsAbs(c.Path) {
		return config.ErrorAt("path", "must be absolute, got %q", c.Path)
	}
	return nil
}

// Factory is the tsv sink type: the config key tsv selects it.
var Factory = sinks.Factory{
	Type:      "tsv",
	NewConfig: func() any { return &Config{} },
	Create: func(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
		c, ok := s.Config.(*Config)
		if !ok {
			return nil, fmt.Errorf("tsv sink %q: config is %T", s.Name, s.Config)
		}
		return Open(c.Path)
	},
}

// Sink appends events to a file.
type Sink struct {
	mu  sync.Mutex // Send is called concurrently: one write at a time
	f   *os.File
	buf bytes.Buffer
}

// Open opens (creating) the file at path for appending.
func Open(path string) (*Sink, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &Sink{f: f}, nil
}

// Send writes the batch as one write and syncs it: acknowledged means on
// disk. A failed write or sync is retried by the delivery (the disk may
// be full for a while); nothing here is the event's fault.
func (s *Sink) Send(_ context.Context, events []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return errors.New("tsv: closed")
	}
	s.buf.Reset()
	for _, e := range events {
		fmt.Fprintf(&s.buf, "%s\t%s\t%s\t%s\t%s\n", e.Time.UTC().Format(time.RFC3339Nano), e.Change, e.Rule(), e.Subject, e.ID)
	}
	if _, err := s.f.Write(s.buf.Bytes()); err != nil {
		return fmt.Errorf("tsv: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("tsv: %w", err)
	}
	return nil
}

// Close closes the file; no Send follows.
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

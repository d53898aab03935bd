package bridge

import (
	"context"
	"log/slog"
	"reflect"
	"slices"
	"sync"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// sharedSinks builds each sink, and each dead-letter, once for all the
// shards a replica delivers: their deliverers share it (a file appended
// by one writer, one exec plugin process, one connection pool), and the
// last to close it closes it. One is shared by name and settings: a
// reload that changes a sink's settings builds the new one beside the old
// one, which its last shard closes when it retires it.
type sharedSinks struct {
	reg    *sinks.Registry
	host   *host
	logger *slog.Logger // the sinks log for every shard, not the first one's

	mu   sync.Mutex
	refs map[string][]*sharedRef // by key: one per settings in use
}

type sharedRef struct {
	settings any // what it was opened with
	value    any
	close    func(context.Context) error
	n        int
}

func newSharedSinks(reg *sinks.Registry, h *host, logger *slog.Logger) *sharedSinks {
	return &sharedSinks{reg: reg, host: h, logger: logger, refs: map[string][]*sharedRef{}}
}

// acquire returns the value of key with settings, opened at its first
// use, and what releases this use of it.
func (s *sharedSinks) acquire(key string, settings any, open func() (any, func(context.Context) error, error)) (any, func(context.Context) error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r *sharedRef
	for _, o := range s.refs[key] {
		if reflect.DeepEqual(o.settings, settings) {
			r = o
		}
	}
	if r == nil {
		v, c, err := open()
		if err != nil {
			return nil, nil, err
		}
		r = &sharedRef{settings: settings, value: v, close: c}
		s.refs[key] = append(s.refs[key], r)
	}
	r.n++
	var once sync.Once
	release := func(ctx context.Context) (err error) {
		once.Do(func() {
			s.mu.Lock()
			r.n--
			last := r.n == 0
			if last {
				s.refs[key] = slices.DeleteFunc(s.refs[key], func(o *sharedRef) bool { return o == r })
				if len(s.refs[key]) == 0 {
					delete(s.refs, key)
				}
			}
			s.mu.Unlock()
			if last && r.close != nil {
				err = r.close(ctx)
			}
		})
		return err
	}
	return r.value, release, nil
}

// Create implements sinkCreator.
func (s *sharedSinks) Create(ctx context.Context, sc config.Sink, _ *slog.Logger) (sinks.Sink, error) {
	v, release, err := s.acquire("sink/"+sc.Name, sc, func() (any, func(context.Context) error, error) {
		sink, err := s.reg.Create(ctx, sc, s.logger.With("sink", sc.Name))
		if err != nil {
			return nil, nil, err
		}
		return sink, sink.Close, nil
	})
	if err != nil {
		return nil, err
	}
	return shareSink(v.(sinks.Sink), release), nil
}

// deadLetter is delivererOptions.DeadLetter.
func (s *sharedSinks) deadLetter(ctx context.Context, cfg *config.Config, sc config.Sink) (sinks.DeadLetter, func(context.Context) error, error) {
	if sc.DeadLetter == nil {
		return nil, nil, nil
	}
	v, release, err := s.acquire("deadLetter/"+sc.Name, sc.DeadLetter, func() (any, func(context.Context) error, error) {
		dl, c, err := s.host.deadLetter(ctx, cfg, sc.DeadLetter)
		return dl, c, err
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(sinks.DeadLetter), release, nil
}

// sharedSink is one use of a shared sink: Close releases it.
type sharedSink struct {
	sinks.Sink
	release func(context.Context) error
}

func (s *sharedSink) Close(ctx context.Context) error { return s.release(ctx) }

// Ordered is the shared sink's: a batch of an Ordered sink holds an
// object's events together, in every shard as alone (a digest, a webhook
// batch, a file), so the order contract must not be lost by sharing it.
func (s *sharedSink) Ordered() bool {
	o, ok := s.Sink.(sinks.Ordered)
	return ok && o.Ordered()
}

// Unwrap returns the sink shared, for what the delivery does not look for
// (metrics of the sink's own).
func (s *sharedSink) Unwrap() sinks.Sink { return s.Sink }

// shareSink wraps sink for one user, keeping the optional interfaces the
// delivery looks for.
func shareSink(sink sinks.Sink, release func(context.Context) error) sinks.Sink {
	h := &sharedSink{Sink: sink, release: release}
	b, batches := sink.(sinks.Batcher)
	hc, checks := sink.(sinks.HealthChecker)
	switch {
	case batches && checks:
		return struct {
			*sharedSink
			sinks.Batcher
			sinks.HealthChecker
		}{h, b, hc}
	case batches:
		return struct {
			*sharedSink
			sinks.Batcher
		}{h, b}
	case checks:
		return struct {
			*sharedSink
			sinks.HealthChecker
		}{h, hc}
	}
	return h
}

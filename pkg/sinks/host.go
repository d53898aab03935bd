package sinks

import (
	"context"
	"errors"
	"sync"
)

// Host is what the process that runs the sinks owns on their behalf, as
// the OpenTelemetry collector's component.Host is for its components:
// resources that outlive any one sink (a reload replaces sinks, not the
// host) and that sinks, dead-letters and the checkpoint share: a
// connection, a server run in-process. A sink type reaches it through
// Settings.Host; nil (a sink built on its own, in a test or a tool) means
// the sink owns whatever it opens.
type Host interface {
	// Shared returns the resource under key, opened by open at the key's
	// first use and kept until the host closes, after every sink. Calls
	// for one key open it once (concurrent ones wait for that open); an
	// open that fails is not kept, so the next call tries again. Keys are
	// the host's, for every sink type: begin them with the type ("nats.").
	// open may ask the host for other keys (a connection for the server it
	// connects to), never for its own.
	Shared(ctx context.Context, key string, open OpenFunc) (any, error)
}

// OpenFunc opens a resource a Host keeps: its value, and what closes it
// when the host closes (nil for nothing). ctx bounds the opening only.
type OpenFunc func(ctx context.Context) (value any, close func(context.Context) error, err error)

// Pool is a Host: the keyed resources a process shares among its sinks.
// Close closes them, in the reverse order of their opening (a connection
// before the server it connects to, when the connection's open asked for
// the server), and leaves the pool empty and usable again.
type Pool struct {
	mu      sync.Mutex
	entries map[string]*pooled
	opened  []*pooled // in the order their opens finished
}

type pooled struct {
	mu    sync.Mutex // held while opening
	ok    bool
	value any
	close func(context.Context) error
}

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{entries: map[string]*pooled{}} }

// Shared implements Host.
func (p *Pool) Shared(ctx context.Context, key string, open OpenFunc) (any, error) {
	p.mu.Lock()
	e := p.entries[key]
	if e == nil {
		e = &pooled{}
		p.entries[key] = e
	}
	p.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ok {
		return e.value, nil
	}
	v, c, err := open(ctx)
	if err != nil {
		return nil, err
	}
	e.ok, e.value, e.close = true, v, c
	p.mu.Lock()
	if _, held := p.entries[key]; !held {
		p.entries[key] = e // the pool was closed while this opened: the next Close closes it
	}
	p.opened = append(p.opened, e)
	p.mu.Unlock()
	return v, nil
}

// Close closes every resource the pool holds, the last opened first, and
// empties the pool. The sinks using them must be closed already.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	opened := p.opened
	p.entries, p.opened = map[string]*pooled{}, nil
	p.mu.Unlock()
	var errs []error
	for i := len(opened) - 1; i >= 0; i-- {
		if c := opened[i].close; c != nil {
			errs = append(errs, c(ctx))
		}
	}
	return errors.Join(errs...)
}

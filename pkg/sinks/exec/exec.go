// Package exec is the exec sink: it runs a plugin, a command written in any
// language, and hands it events over stdio with the protocol
// kubebridge.exec/v1, newline-delimited JSON (docs/plugins.md has it in
// full):
//
//   - the bridge writes each event to the plugin's stdin as one line: the
//     structured CloudEvent, exactly as the file sink writes it;
//   - the plugin answers each event with one line on stdout, in any order:
//     {"id":"<event id>","ok":true}, or
//     {"id":"<event id>","ok":false,"error":"...","permanent":false,"retryAfter":"5s"}.
//
// The answer is the acknowledgement. Send returns once every event of its
// batch is answered, with one outcome per event (ok; permanent: to the
// dead-letter; retryAfter: retried no sooner; otherwise retried), and the
// delivery loop shared by all sinks retries, dead-letters and checkpoints as
// for any sink.
//
// Order per object: the sink never has two events of one object (event.Key)
// unanswered at once, so a plugin may handle events concurrently and answer
// in any order without reordering an object's changes. An object's next
// event is written once the previous one is answered ok (or refused
// permanently); when one fails retryably, its object's later events of the
// batch are not written and are reported failed, and the delivery loop
// resends them in order. Hence also: an event whose id is still unanswered
// (a retry after a timeout) is never written a second time; the retry waits
// for the first answer. At most Config.Inflight events are unanswered,
// across all workers.
//
// A plugin that exits, closes its stdout, writes a line that is not an
// answer to one of its unanswered events (not JSON, no id or ok, an unknown
// id, a bad retryAfter), or does not answer in time (it is taken for hung:
// see Config.Timeout and watchAnswers), is killed with its process group
// and restarted with exponential backoff (100ms, doubling up to 30s; back to
// 100ms once it has run for a minute); its unanswered events fail retryably
// and are resent. A killed plugin cannot answer late: no answer of a
// previous run is ever taken for the resent event. While no plugin runs,
// Send fails at once, retryably: it never hangs on a dead plugin. Its stderr
// is logged line by line (4 KiB at most per line). It starts with a minimal
// environment (PATH, HOME and LANG from the bridge, plus Config.Env) in its
// own process group; on Linux the kernel kills it if the bridge dies.
//
// Close closes the plugin's stdin, waits until ctx's deadline for the
// outstanding answers and for the plugin to exit, then kills it.
package exec

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Protocol names the wire protocol the exec sink speaks.
const Protocol = "kubebridge.exec/v1"

// Factory builds exec sinks.
var Factory = sinks.Factory{
	Type:      "exec",
	NewConfig: func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:    create,
	OptIn: &sinks.OptIn{Name: OptInName,
		Why: "exec plugins run programs named in the config, as the bridge: start the bridge with --allow-exec-plugins (chart value allowExecPlugins: true) to allow them"},
}

// OptInName is the permission exec sinks need (bridge run
// --allow-exec-plugins).
const OptInName = "exec-plugins"

func create(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
	c, ok := s.Config.(*Config)
	if !ok || c == nil {
		return nil, fmt.Errorf("exec sink %q: no exec config (config is %T)", s.Name, s.Config)
	}
	return New(s.Name, *c, s.Logger)
}

// timing holds the sink's clocks; tests shorten them.
type timing struct {
	minBackoff, maxBackoff time.Duration // between restarts
	healthyAfter           time.Duration // a plugin that ran this long restarts after minBackoff again
	exitGrace              time.Duration // at Close, how long a plugin that answered everything may take to exit
	readGrace              time.Duration // after the plugin exited, how long its output pipes are drained (a child it left may hold them)
	closeTimeout           time.Duration // Close's bound when its ctx has no deadline
}

var defaultTiming = timing{
	minBackoff:   100 * time.Millisecond,
	maxBackoff:   30 * time.Second,
	healthyAfter: time.Minute,
	exitGrace:    5 * time.Second,
	readGrace:    time.Second,
	closeTimeout: 30 * time.Second,
}

// Sink delivers events to a plugin process. Send is safe for concurrent
// use (one call per worker).
type Sink struct {
	name   string
	argv   []string
	env    []string
	logger *slog.Logger
	timing timing
	// timeout bounds the wait for an answer (see watchAnswers).
	timeout time.Duration

	// slots holds one token per unanswered event: its capacity is the
	// inflight bound, shared by every Send.
	slots chan struct{}

	mu             sync.Mutex
	proc           *proc            // the running plugin; nil between restarts
	downErr        error            // why no plugin runs, while proc is nil
	pending        map[string]*call // unanswered events, by id
	byKey          map[string]*call // the same, by object (event.Key)
	closing        bool
	answered       chan struct{} // closed once closing and nothing is unanswered
	answeredClosed bool

	closeOnce sync.Once
	closeReq  chan context.Context // Close -> the supervisor
	stopped   chan struct{}        // closed when the supervisor returned
	closeErr  error
}

// call is one event written (or queued to be written) to a plugin and not
// yet answered. Its err and waiters are guarded by Sink.mu; a Send reads
// err once the call has been sent on its notification channel.
type call struct {
	id, key string
	line    []byte
	proc    *proc
	sent    time.Time      // when it was handed to proc
	elem    *list.Element  // in proc.unanswered, until finished
	err     error          // the outcome, set when finished
	waiters []chan<- *call // Sends to tell when it is finished
}

var (
	errClosed = errors.New("exec sink: closed")
	// errOrder is reported for an object's events after one of its events
	// failed retryably in the same batch: they were not written.
	errOrder = errors.New("exec sink: not sent: an earlier event of the same object failed")
)

// New starts the plugin c describes for the sink named name. The process
// starts before New returns (a command that cannot start is an error);
// later failures are handled by restarts. logger should carry the sink's
// name, as the bridge's does (nil: slog.Default with it).
func New(name string, c Config, logger *slog.Logger) (*Sink, error) {
	return newSink(name, c, logger, defaultTiming)
}

func newSink(name string, c Config, logger *slog.Logger, t timing) (*Sink, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("exec sink %q: %w", name, err)
	}
	if logger == nil {
		logger = slog.Default().With("sink", name)
	}
	s := &Sink{
		name:     name,
		argv:     append([]string(nil), c.Command...),
		env:      environ(c.Env),
		logger:   logger,
		timing:   t,
		timeout:  c.Timeout.D(),
		slots:    make(chan struct{}, c.Inflight),
		pending:  map[string]*call{},
		byKey:    map[string]*call{},
		closeReq: make(chan context.Context, 1),
		stopped:  make(chan struct{}),
	}
	p, err := s.start()
	if err != nil {
		return nil, fmt.Errorf("exec sink %q: starting %s: %w", name, s.argv[0], err)
	}
	s.proc = p
	go s.supervise(p)
	return s, nil
}

// environ is the plugin's whole environment: PATH, HOME and LANG from the
// bridge's, then extra. It is never nil: a nil Cmd.Env would pass on the
// bridge's entire environment.
func environ(extra map[string]string) []string {
	env := make([]string, 0, 3+len(extra))
	for _, k := range []string{"PATH", "HOME", "LANG"} {
		if _, set := extra[k]; set {
			continue
		}
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// Send writes the events to the plugin and returns when each is answered
// (or ctx ends, or the plugin dies), with one outcome per event; an
// object's events are written one at a time (see the package doc).
func (s *Sink) Send(ctx context.Context, events []*event.Event) error {
	b := &batch{
		s:       s,
		events:  events,
		lines:   make([][]byte, len(events)),
		errs:    make([]error, len(events)),
		settled: make([]bool, len(events)),
		queue:   map[string][]int{},
		notify:  make(chan *call, len(events)),
		waiting: map[*call][]waiter{},
	}
	var keys []string // objects in order of first appearance
	for i, e := range events {
		line, err := e.Structured()
		if err != nil {
			b.settle(i, sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err)))
			continue
		}
		b.lines[i] = line
		k := e.Key()
		if _, seen := b.queue[k]; !seen {
			keys = append(keys, k)
		}
		b.queue[k] = append(b.queue[k], i)
	}
	for _, k := range keys {
		if !b.advance(ctx, k) {
			return b.abandon(ctx.Err())
		}
	}
	for len(b.waiting) > 0 {
		select {
		case c := <-b.notify:
			if !b.finished(ctx, c) {
				return b.abandon(ctx.Err())
			}
		case <-ctx.Done():
			return b.abandon(ctx.Err())
		}
	}
	return sinks.Outcome(b.errs)
}

// batch is one Send in progress.
type batch struct {
	s       *Sink
	events  []*event.Event
	lines   [][]byte
	errs    []error
	settled []bool
	queue   map[string][]int // per object, its events not yet written, in order
	notify  chan *call       // finished calls this batch waits for
	waiting map[*call][]waiter
}

// waiter is an event of the batch waiting for a call: its own (same id), or,
// when blocked, another event of its object that is still unanswered.
type waiter struct {
	i       int
	blocked bool
}

func (b *batch) settle(i int, err error) {
	b.errs[i], b.settled[i] = err, true
}

// advance writes the next event of object key, unless the object has
// none left. It returns false when ctx ended while waiting for a slot.
func (b *batch) advance(ctx context.Context, key string) bool {
	if len(b.queue[key]) == 0 {
		return true
	}
	i := b.queue[key][0]
	b.queue[key] = b.queue[key][1:]
	c, own, err := b.s.submit(ctx, b.events[i].ID, key, b.lines[i], b.notify)
	switch {
	case c != nil:
		b.waiting[c] = append(b.waiting[c], waiter{i: i, blocked: !own})
	case ctx.Err() != nil: // no slot before ctx ended: abandon reports it
		return false
	default: // no plugin to take it
		b.settle(i, err)
		b.failRest(key)
	}
	return true
}

// finished handles a call the batch waited for.
func (b *batch) finished(ctx context.Context, c *call) bool {
	ws := b.waiting[c]
	delete(b.waiting, c)
	for _, w := range ws {
		key := b.events[w.i].Key()
		if w.blocked { // its object is free now: try again
			b.queue[key] = append([]int{w.i}, b.queue[key]...)
		} else {
			b.settle(w.i, c.err)
			if c.err != nil && !sinks.IsPermanent(c.err) {
				b.failRest(key)
				continue
			}
		}
		if !b.advance(ctx, key) {
			return false
		}
	}
	return true
}

// failRest reports the object's events not yet written as failed, so that
// the delivery loop resends them after the one that failed.
func (b *batch) failRest(key string) {
	for _, i := range b.queue[key] {
		b.settle(i, errOrder)
	}
	b.queue[key] = nil
}

// abandon ends a Send cut short by ctx: the unanswered events stay
// written (their answers still count against inflight and are awaited by
// Close) but this batch no longer waits for them.
func (b *batch) abandon(cause error) error {
	b.s.mu.Lock()
	for c := range b.waiting {
		c.waiters = removeWaiter(c.waiters, b.notify)
	}
	b.s.mu.Unlock()
	err := fmt.Errorf("exec sink: waiting for the plugin's answer: %w", cause)
	for i := range b.errs {
		if !b.settled[i] {
			b.settle(i, err)
		}
	}
	return sinks.Outcome(b.errs)
}

func removeWaiter(ws []chan<- *call, w chan<- *call) []chan<- *call {
	out := ws[:0]
	for _, x := range ws {
		if x != w {
			out = append(out, x)
		}
	}
	return out
}

// submit hands one event to the plugin and returns the call to wait for:
// its own (own), or the unanswered call of its object, which must be
// answered first. It waits for an inflight slot; with no plugin running it
// fails at once.
func (s *Sink) submit(ctx context.Context, id, key string, line []byte, notify chan<- *call) (c *call, own bool, err error) {
	s.mu.Lock()
	c, own, err = s.attachLocked(id, key, notify)
	s.mu.Unlock()
	if c != nil || err != nil {
		return c, own, err
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, own, err = s.attachLocked(id, key, notify); c != nil || err != nil {
		<-s.slots
		return c, own, err
	}
	c = &call{id: id, key: key, line: line, proc: s.proc, sent: time.Now(), waiters: []chan<- *call{notify}}
	s.pending[id], s.byKey[key] = c, c
	s.proc.enqueue(c)
	return c, true, nil
}

// attachLocked returns the unanswered call an event must wait for (its own
// id's, or its object's), or the reason no plugin can take it, or nothing:
// the event is to be written.
func (s *Sink) attachLocked(id, key string, notify chan<- *call) (*call, bool, error) {
	if c := s.pending[id]; c != nil {
		c.waiters = append(c.waiters, notify)
		return c, true, nil
	}
	if c := s.byKey[key]; c != nil {
		c.waiters = append(c.waiters, notify)
		return c, false, nil
	}
	// Nothing was handed to the plugin: the destination is down (being
	// restarted), not this batch's fault. A plugin that exits while it
	// holds events is a plain failure instead: the payload may be what
	// crashed it, and the delivery tells that apart by trying another
	// object.
	switch {
	case s.closing:
		return nil, false, sinks.Unavailable(errClosed)
	case s.proc == nil:
		return nil, false, sinks.Unavailable(fmt.Errorf("exec sink: plugin not running: %w", s.downErr))
	case s.proc.stopping:
		return nil, false, sinks.Unavailable(fmt.Errorf("exec sink: plugin stopping: %w", s.proc.reasonLocked()))
	}
	return nil, false, nil
}

// finishLocked records a call's outcome, frees its slot and tells its
// waiters. Every waiter's channel has room: a batch has at most one
// outstanding wait per event.
func (s *Sink) finishLocked(c *call, err error) {
	if s.pending[c.id] != c {
		return
	}
	delete(s.pending, c.id)
	if s.byKey[c.key] == c {
		delete(s.byKey, c.key)
	}
	if c.elem != nil {
		if p := c.proc; p.unanswered.Front() == c.elem {
			p.headSince = time.Now() // the next oldest's turn
		}
		c.proc.unanswered.Remove(c.elem)
		c.elem = nil
	}
	c.err = err
	for _, w := range c.waiters {
		w <- c
	}
	c.waiters = nil
	<-s.slots
	s.checkAnsweredLocked()
}

func (s *Sink) checkAnsweredLocked() {
	if s.closing && !s.answeredClosed && len(s.pending) == 0 {
		close(s.answered)
		s.answeredClosed = true
	}
}

// Close closes the plugin's stdin and waits, until ctx's deadline (30s
// when ctx has none), for the outstanding answers and the plugin's exit;
// a plugin that answered everything gets 5s more to exit. Then it is
// killed. It returns an error when events were still unanswered.
func (s *Sink) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.timing.closeTimeout)
			defer cancel()
		}
		s.mu.Lock()
		s.closing = true
		s.answered = make(chan struct{})
		s.checkAnsweredLocked()
		s.mu.Unlock()
		s.closeReq <- ctx
		<-s.stopped
	})
	<-s.stopped
	return s.closeErr
}

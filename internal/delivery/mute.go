package delivery

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// Mute is when a sink's events are held (the sink's mute): during a
// window, the events Matches takes are held before the queue, each
// object's coalesced (the latest state wins), and offered when the window
// ends. An object with events held has all its later ones held behind
// them, so that its order holds.
//
// What is held is not acknowledged: it is the view's pending work, which
// a restart or a reload that rebuilds the sink recomputes from the
// checkpoint (and holds again if the window is still on). A closing
// delivery therefore leaves it, as it leaves an object refused for good.
type Mute struct {
	Schedule config.MuteSchedule
	// Matches says whether an event is held; nil: every event. One it
	// fails on is held (holding loses nothing; sending it would break the
	// quiet), counted and logged.
	Matches func(*event.Event) (bool, error)
}

// muting is a delivery's held events. mu orders an Offer against the
// release, so that an object's events reach the queue in order. The
// release is run's, a goroutine of the delivery's Run: a timer's callback
// may not read the clock (a fake one calls it under its lock).
type muting struct {
	*Mute
	clock  clock.WithDelayedExecution
	logger *slog.Logger
	rearm  chan struct{} // until changed

	mu     sync.Mutex
	held   map[string][]*event.Event // by event key, folded
	order  []string                  // the held keys, in the order they were first held (and some no longer held)
	until  time.Time                 // when the windows holding them end; zero: nothing held
	closed bool

	count atomic.Int64  // events held now
	total atomic.Uint64 // events ever held (kubebridge_sink_withheld_total{reason="mute"})
	// whereErrors counts the events Matches failed on (held all the same);
	// lastWhereErr, under mu, limits their log.
	whereErrors  atomic.Uint64
	lastWhereErr time.Time
	// ended is signalled once a window's end has queued all it held: a
	// digest's take waiting out a period sends at once what is queued.
	// Signalled after the queueing, not before: a take that woke on the
	// first released event and went at once would send a part.
	ended chan struct{}
}

func newMuting(m *Mute, clk clock.WithDelayedExecution, logger *slog.Logger) *muting {
	return &muting{Mute: m, clock: clk, logger: logger, rearm: make(chan struct{}, 1), ended: make(chan struct{}, 1), held: map[string][]*event.Event{}}
}

// offer holds ev if its object has events held or the sink is muted for
// it, else hands it to queue; both under mu.
func (m *muting) offer(ev *event.Event, fold func([]*event.Event) []*event.Event, queue func(*event.Event)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := ev.Key()
	if evs, ok := m.held[key]; ok {
		m.hold(key, append(evs, ev), fold)
		return
	}
	end, muted := m.until, !m.closed
	now := m.clock.Now()
	if muted && !now.Before(end) {
		end, muted = m.Schedule.Until(now)
	}
	if !muted || !m.matches(ev, now) {
		queue(ev)
		return
	}
	if len(m.order) >= 2*len(m.held)+64 { // keys whose events cancelled out: memory per object held, not per name churned
		m.order = slices.DeleteFunc(m.order, func(k string) bool { _, ok := m.held[k]; return !ok })
	}
	m.order = append(m.order, key)
	m.hold(key, []*event.Event{ev}, fold)
	if !end.Equal(m.until) {
		m.until = end
		select {
		case m.rearm <- struct{}{}:
		default:
		}
	}
}

// matches says whether the mute holds ev: Matches' answer, or true where
// it fails. mu is held.
func (m *muting) matches(ev *event.Event, now time.Time) bool {
	if m.Matches == nil {
		return true
	}
	ok, err := m.Matches(ev)
	if err == nil {
		return ok
	}
	n := m.whereErrors.Add(1)
	if now.Sub(m.lastWhereErr) >= errLogEvery {
		m.lastWhereErr = now
		m.logger.Warn("mute where failed; the event is held", "object", ev.Subject, "error", err, "failures", n)
	}
	return true
}

// hold keeps an object's events, folded; mu is held.
func (m *muting) hold(key string, evs []*event.Event, fold func([]*event.Event) []*event.Event) {
	before := len(m.held[key])
	m.total.Add(1)
	evs = fold(evs)
	if len(evs) == 0 { // cancelled out (created and deleted in the window): nothing to send
		delete(m.held, key)
	} else {
		m.held[key] = evs
	}
	m.count.Add(int64(len(evs) - before))
}

// run releases what is held when its windows end, until ctx ends.
func (m *muting) run(ctx context.Context, queue func(*event.Event)) {
	for {
		m.mu.Lock()
		until := m.until
		m.mu.Unlock()
		var due <-chan time.Time
		var t clock.Timer
		if !until.IsZero() {
			wait := until.Sub(m.clock.Now())
			if wait <= 0 {
				m.release(queue)
				continue
			}
			t = m.clock.NewTimer(wait)
			due = t.C()
		}
		select {
		case <-ctx.Done():
		case <-m.rearm:
		case <-due:
			m.release(queue)
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// release offers what is held once no window holds it any more (adjoining
// windows are one: it waits for the last).
func (m *muting) release(queue func(*event.Event)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	if end, muted := m.Schedule.Until(m.clock.Now()); muted {
		m.until = end
		return
	}
	for _, key := range m.order {
		for _, ev := range m.held[key] {
			queue(ev)
		}
		delete(m.held, key) // a key in order twice (held again after it cancelled out) goes once
	}
	if m.count.Load() > 0 {
		select {
		case m.ended <- struct{}{}:
		default:
		}
	}
	clear(m.held)
	m.order, m.until = m.order[:0], time.Time{}
	m.count.Store(0)
}

// close drops what is held (the next start recomputes it): it stays
// counted as pending, left undelivered.
func (m *muting) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	clear(m.held)
	m.order = nil
}

// Package nats is the NATS sink: each event is published, as structured
// CloudEvents JSON with its attributes also in ce-* headers, to a subject
// built from the sink's template (see Token for how values become tokens).
//
// Acknowledgement: with jetstream, every event's PubAck (the stream has
// stored it; Nats-Msg-Id = event id, so the stream drops replays inside its
// duplicate window, and a duplicate PubAck is a delivery too), published
// asynchronously within a window of maxPending pending PubAcks, one event
// per object at a time; with core
// NATS, a flush after the batch (the server has received it; core NATS keeps
// nothing for absent subscribers). Outcomes are per event
// (sinks.EventErrors): an event over the server's max_payload, or one the
// stream refuses, fails alone.
//
// The connection reconnects forever with the client's own buffering off:
// the sink's queue is the buffer, so a publish while disconnected fails and
// is retried by the delivery loop instead of vanishing with a full buffer.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds NATS sinks. Their destinations also take dead letters
// (published to a subject) and hold the checkpoint (a JetStream KV
// bucket), over a connection the host keeps (host.go).
var Factory = sinks.Factory{
	Type:       "nats",
	NewConfig:  func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:     create,
	DeadLetter: deadLetter,
	KV:         openKV,
	Fences:     func(spec any) bool { return spec.(*Config).fenced() },
}

// flushTimeout bounds the wait for a core publish batch to be flushed.
const flushTimeout = 10 * time.Second

// ackTimeout bounds the wait for each JetStream PubAck (a variable for
// tests).
var ackTimeout = flushTimeout

// Sink publishes to NATS.
type Sink struct {
	name     string
	cfg      Config
	jet      bool // JetStream: publishes await their PubAck
	subject  subjectTemplate
	logger   *slog.Logger
	embedded *server.Server // when the sink runs its own server
	window   chan struct{}  // JetStream: a slot per publish awaiting its PubAck
	fence    *lastSeqs      // JetStream fenced: each object's last stored sequence (fence.go)
	mirror   *mirrorState   // mirroring views into KV buckets (mirror.go)
	refused  atomic.Int64   // publishes the stream's fence refused, late ones included
	msgs     sync.Pool      // *natsgo.Msg to reuse

	cur      atomic.Pointer[link]
	mu       sync.Mutex // serializes rebuilds and Close
	shut     bool       // Close was called: never rebuild
	rebuilt  time.Time  // the last rebuild, to space them
	rebuilds atomic.Int64
}

// link is one connection of the sink. nats.go reconnects by itself for
// ever; a connection it closes for good (a protocol error the server ends
// it with, an authorization it gave up on) is replaced by a new link on
// the next Send, with credentials read again.
type link struct {
	nc     *natsgo.Conn
	js     jetstream.JetStream // nil for core NATS
	closed chan struct{}       // closed with the connection
}

// create connects the sink. An embedded sink is a client of the host's
// server (sharedEmbedded), which outlives it; without a host it runs its
// own, which closes with it.
func create(ctx context.Context, s sinks.Settings) (sinks.Sink, error) {
	c := s.Config.(*Config)
	sink, err := connectFor(ctx, s, c)
	switch {
	case err != nil:
		return nil, err
	case c.Mirror != nil:
		return Mirroring{sink}, nil
	}
	return sink, nil
}

// connectFor connects the sink s configures as c, running or sharing the
// embedded server it asks for.
func connectFor(ctx context.Context, s sinks.Settings, c *Config) (*Sink, error) {
	if !c.Embedded {
		return Connect(ctx, s.Name, c, s.Logger)
	}
	if s.Host != nil {
		srv, err := sharedEmbedded(ctx, s.Host, s.Name, c, s.Logger)
		if err != nil {
			return nil, err
		}
		return Connect(ctx, s.Name, c.WithServer(srv.URL), s.Logger)
	}
	srv, url, err := startEmbedded(s.Name, c)
	if err != nil {
		return nil, err
	}
	cc := *c
	cc.URL = url
	sink, err := Connect(ctx, s.Name, &cc, s.Logger)
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	sink.embedded = srv
	if s.Logger != nil {
		s.Logger.Info("embedded nats-server started", "url", url)
	}
	return sink, nil
}

// Connect connects (retrying in the background if the server is not up
// yet) and, when c.Stream is set, creates or updates the stream.
func Connect(ctx context.Context, name string, c *Config, logger *slog.Logger) (*Sink, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tmpl, err := parseTemplate(c.Subject)
	if err != nil {
		return nil, fmt.Errorf("subject: %w", err)
	}
	opts, err := Options(name, c, logger)
	if err != nil {
		return nil, err
	}
	s := &Sink{name: name, cfg: *c, jet: c.jetStream(), subject: tmpl, logger: logger}
	if s.jet {
		window := c.MaxPending
		if window <= 0 {
			window = DefaultMaxPending
		}
		s.window = make(chan struct{}, window)
		if c.fenced() && c.Mirror == nil {
			s.fence = newLastSeqs()
		}
	}
	if c.Mirror != nil {
		s.mirror = newMirrorState(c.Mirror)
	}
	l, err := s.dial(opts)
	if err != nil {
		return nil, err
	}
	s.cur.Store(l)
	if l.js != nil && c.Stream != nil {
		if err := s.ensureStream(ctx, l.js, c); err != nil {
			l.nc.Close()
			return nil, err
		}
	}
	if s.mirror != nil {
		s.startCompactor()
	}
	return s, nil
}

// dial makes a link with opts.
func (s *Sink) dial(opts []natsgo.Option) (*link, error) {
	l := &link{closed: make(chan struct{})}
	var closeOnce sync.Once
	opts = append(opts, natsgo.ClosedHandler(func(*natsgo.Conn) { closeOnce.Do(func() { close(l.closed) }) }))
	nc, err := natsgo.Connect(s.cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redact(s.cfg.URL), err)
	}
	l.nc = nc
	if s.jet {
		// The sink's window bounds what is pending; the client's own limit
		// is a backstop, above what a Send that gave up may leave behind
		// until the client times it out. The timeout also frees the client
		// of publishes whose PubAck never comes.
		// Refusals by the fence are counted however late they come: a
		// Send cut short no longer waits for its PubAcks.
		onErr := jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *natsgo.Msg, err error) {
			if _, _, ok := fenceRefused(err); ok {
				s.refused.Add(1)
			}
		})
		l.js, err = jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackTimeout), jetstream.WithPublishAsyncMaxPending(2*cap(s.window)), onErr)
		if err != nil {
			nc.Close()
			return nil, err
		}
	}
	return l, nil
}

// rebuildEvery spaces rebuilds of a connection closed for good: the
// delivery's backoff already spaces Sends, this bounds what a misbehaving
// server can make the sink do.
const rebuildEvery = time.Second

// link returns the sink's connection, replacing one closed for good.
func (s *Sink) link() (*link, error) {
	l := s.cur.Load()
	if !l.nc.IsClosed() {
		return l, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l = s.cur.Load(); !l.nc.IsClosed() {
		return l, nil
	}
	if s.shut {
		return nil, sinks.Unavailable(natsgo.ErrConnectionClosed)
	}
	if time.Since(s.rebuilt) < rebuildEvery {
		return nil, sinks.Unavailable(fmt.Errorf("the NATS connection was closed; reconnecting: %w", natsgo.ErrConnectionClosed))
	}
	s.rebuilt = time.Now()
	opts, err := Options(s.name, &s.cfg, s.logger)
	if err != nil { // a credential file gone or unreadable
		return nil, sinks.Destination(sinks.ReasonConfig, err)
	}
	nl, err := s.dial(opts)
	if err != nil {
		return nil, sinks.Unavailable(err)
	}
	s.cur.Store(nl)
	s.rebuilds.Add(1)
	s.logger.Warn("nats connection was closed by the client for good; replaced", "error", l.nc.LastError())
	return nl, nil
}

// Options are the connection options of c (auth, TLS, reconnects); other
// clients of kubebridge's NATS, such as bridge tail, connect alike.
func Options(name string, c *Config, logger *slog.Logger) ([]natsgo.Option, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	opts := []natsgo.Option{
		natsgo.Name("kubebridge/" + name),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(time.Second),
		natsgo.ReconnectJitter(500*time.Millisecond, time.Second),
		natsgo.ReconnectBufSize(-1), // the queue is the buffer
		natsgo.RetryOnFailedConnect(true),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			logger.Warn("nats disconnected", "error", err)
		}),
		natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
			logger.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
	}
	switch {
	case c.CredentialsFile != "":
		opts = append(opts, natsgo.UserCredentials(c.CredentialsFile))
	case c.NKeySeedFile != "":
		o, err := natsgo.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nkeySeedFile: %w", err)
		}
		opts = append(opts, o)
	case c.TokenFile != "":
		// Read again on every (re)connect when the file changed: a rotated
		// token is picked up when the server drops the old one.
		tok, err := sinks.OpenCredentialFile(c.TokenFile, sinks.TrimSpace)
		if err != nil {
			return nil, fmt.Errorf("tokenFile: %w", err)
		}
		opts = append(opts, natsgo.TokenHandler(func() string { return sendable(tok, "tokenFile", logger) }))
	case c.User != "":
		pw, err := sinks.OpenCredentialFile(c.PasswordFile, sinks.TrimLine)
		if err != nil {
			return nil, fmt.Errorf("passwordFile: %w", err)
		}
		user := c.User
		opts = append(opts, natsgo.UserInfoHandler(func() (string, string) { return user, sendable(pw, "passwordFile", logger) }))
	}
	if c.TLS != nil {
		tf, err := sinks.OpenTLS(c.TLS)
		if err != nil {
			return nil, err
		}
		if c.TLS.InsecureSkipVerify {
			logger.Warn("TLS server certificates are not verified (insecureSkipVerify)")
		}
		opts = append(opts, natsgo.Secure(tf.Base()))
		// Called on every (re)connect: renewed certificates are used on
		// the next connection.
		var certCB natsgo.TLSCertHandler
		if tf.HasCertificate() {
			certCB = tf.Certificate
		}
		var rootsCB natsgo.RootCAsHandler
		if c.TLS.CAFile != "" {
			rootsCB = tf.RootCAs
		}
		if certCB != nil || rootsCB != nil {
			opts = append(opts, natsgo.ClientTLSConfig(certCB, rootsCB))
		}
	}
	// An authorization refused on reconnect keeps it reconnecting (with
	// the credential read again) instead of closing the connection.
	opts = append(opts, natsgo.IgnoreAuthErrorAbort())
	return opts, nil
}

// sendable is the credential a connection sends, read again; a file
// rotated into something that is no token (a key, a seed) is not sent.
func sendable(f *sinks.CredentialFile, key string, logger *slog.Logger) string {
	v, _ := f.Value()
	if err := config.Sendable(v); err != nil {
		logger.Error("not sending a credential that is no token", "key", key, "error", err)
		return ""
	}
	return string(v)
}

func (s *Sink) ensureStream(ctx context.Context, js jetstream.JetStream, c *Config) error {
	st := c.Stream
	subjects := st.Subjects
	if len(subjects) == 0 {
		subjects = StreamSubjects(c.Subject)
	}
	storage := jetstream.FileStorage
	if st.Storage == "memory" {
		storage = jetstream.MemoryStorage
	}
	sc := jetstream.StreamConfig{Name: st.Name, Subjects: subjects, Storage: storage, MaxAge: st.MaxAge.D(), Duplicates: st.DuplicateWindow.D()}
	if err := waitConnected(ctx, s.Conn(), s.logger); err != nil {
		return fmt.Errorf("creating stream %s: %w", st.Name, err)
	}
	var err error
	for attempt := 0; attempt < 30; attempt++ { // the server may still be starting
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = js.CreateOrUpdateStream(sctx, sc)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return fmt.Errorf("creating stream %s: %w", st.Name, err)
	}
	return nil
}

// waitLogEvery spaces the reminders that the bridge still waits for NATS.
const waitLogEvery = 30 * time.Second

// waitConnected waits until nc is connected, or ctx ends: a server not up
// yet (or unreachable) at start is waited for, the bridge not ready
// meanwhile, rather than failing the start (a request while nats.go
// reconnects is refused at once: its buffer is off).
func waitConnected(ctx context.Context, nc *natsgo.Conn, logger *slog.Logger) error {
	if nc.IsConnected() {
		return nil
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	logged := time.Time{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return natsgo.ErrConnectionClosed
		}
		if time.Since(logged) >= waitLogEvery {
			logged = time.Now()
			logger.Warn("waiting for the NATS server to be reachable", "waited", time.Since(start).Round(time.Second), "error", nc.LastError())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("NATS not reachable (waited %s): %w", time.Since(start).Round(time.Second), ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// FenceRefusals is how many publishes the stream's fence refused
// (sinks.FenceReporter).
func (s *Sink) FenceRefusals() int64 { return s.refused.Load() }

// Conn is the sink's current connection, shared with dead-letters and
// checkpoints.
func (s *Sink) Conn() *natsgo.Conn { return s.cur.Load().nc }

// Send publishes the batch and waits for its acknowledgement.
func (s *Sink) Send(ctx context.Context, events []*event.Event) error {
	if len(events) == 0 {
		return nil
	}
	l, err := s.link()
	if err != nil {
		return err
	}
	if s.mirror != nil {
		return s.sendMirror(ctx, l, events)
	}
	if l.js != nil {
		return s.sendJetStream(ctx, l, events)
	}
	return s.sendCore(ctx, l, events)
}

// outcomes collects the per-event results of a batch; the slice is only
// made when an event fails, so a batch that goes through allocates nothing.
type outcomes struct {
	n    int
	errs []error
}

func (o *outcomes) fail(i int, err error) {
	if o.errs == nil {
		o.errs = make([]error, o.n)
	}
	o.errs[i] = err
}

func (o *outcomes) failed(i int) bool { return o.errs != nil && o.errs[i] != nil }

func (o *outcomes) result() error {
	if o.errs == nil {
		return nil
	}
	return sinks.Outcome(o.errs)
}

func (s *Sink) sendCore(ctx context.Context, l *link, events []*event.Event) error {
	out := outcomes{n: len(events)}
	published := false
	// Core publish copies the message into the connection's buffer at
	// once, so one pooled Msg serves the batch and the next ones.
	msg := s.getMsg()
	defer s.putMsg(msg)
	var subj [128]byte
	buf := subj[:0]
	limit := l.nc.MaxPayload()
	for i, e := range events {
		var err error
		buf, err = s.fill(msg, e, buf, limit, nil)
		if err == nil {
			err = classify(l.nc.PublishMsg(msg))
		}
		if err == nil {
			published = true
			continue
		}
		out.fail(i, err)
		if sinks.IsPermanent(err) {
			continue // too large, unencodable: this event's alone
		}
		// The connection is down: publish nothing more.
		for j := i + 1; j < len(events); j++ {
			out.fail(j, notPublished(err))
		}
		break
	}
	if published {
		fctx, cancel := context.WithTimeout(ctx, flushTimeout)
		err := l.nc.FlushWithContext(fctx)
		cancel()
		if err != nil {
			err = classify(err)
			for i := range events {
				if !out.failed(i) {
					out.fail(i, err)
				}
			}
		}
	}
	return out.result()
}

// pubOpts turn off the client's own re-publishing after "no responders":
// a publish happens only inside Send, so nothing of an object can reach
// the stream after Send has reported it failed and moved on.
var pubOpts = []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}

// sendJetStream publishes asynchronously within the sink's window of
// pending PubAcks (MaxPending, shared by concurrent Sends). The batch's
// events are of different objects (sinks.Sink: the delivery sends an
// object's next event once this one is settled), so all go out at once,
// window permitting, except under the fence: there the events of one
// object's subjects (its events of several rules) go one at a time, each
// published once the one before it is acknowledged or refused for good,
// since in flight together all but the first would expect the same
// sequence and be refused; one failing retryably fails the others
// unpublished. A lost connection or a PubAck timeout stops all publishing
// of the batch.
func (s *Sink) sendJetStream(ctx context.Context, l *link, events []*event.Event) error {
	n := len(events)
	out := outcomes{n: n}
	// next[i] is the index of the next event of events[i]'s subjects, or
	// -1; ready holds what may be published now, in batch order at first.
	next := make([]int, n)
	ready := make([]int, 0, n)
	var subj, filt [128]byte
	buf, filter := subj[:0], filt[:0]
	if s.fence == nil || n == 1 {
		for i := range events {
			next[i], ready = -1, append(ready, i)
		}
	} else {
		last := make(map[uint64]int, n)
		for i, e := range events {
			filter = s.subject.appendFilterTo(filter[:0], e)
			h := s.fence.hash(filter)
			next[i] = -1
			if j, ok := last[h]; ok {
				next[j] = i
			} else {
				ready = append(ready, i)
			}
			last[h] = i
		}
	}
	type flight struct {
		i   int
		f   jetstream.PubAckFuture
		msg *natsgo.Msg
		obj uint64 // the object's filter hash when fenced
	}
	var adopted []uint8 // per event: how often its expectation was refused (fence.go)
	flights := make([]flight, 0, min(n, cap(s.window)))
	limit := l.nc.MaxPayload()
	var stop error // set when nothing more is published
	// holdBack fails the events of i's subjects after i.
	holdBack := func(i int, cause error) {
		for j := next[i]; j >= 0; j = next[j] {
			out.fail(j, cause)
		}
	}
	head := 0
	// publish publishes ready[head], holding a slot of the window.
	publish := func() {
		i := ready[head]
		head++
		if err := ctx.Err(); err != nil {
			s.release()
			out.fail(i, notPublished(err))
			holdBack(i, notPublished(err))
			stop = err
			return
		}
		msg := s.getMsg()
		var obj uint64
		var exp *expectation
		if s.fence != nil {
			filter = s.subject.appendFilterTo(filter[:0], events[i])
			obj = s.fence.hash(filter)
			exp = &expectation{filter: filter, seq: s.fence.get(obj)}
		}
		var err error
		buf, err = s.fill(msg, events[i], buf, limit, exp)
		var f jetstream.PubAckFuture
		if err == nil {
			f, err = l.js.PublishMsgAsync(msg, pubOpts...)
			err = classify(err)
		}
		if err == nil {
			flights = append(flights, flight{i, f, msg, obj})
			return
		}
		s.release()
		s.putMsg(msg)
		out.fail(i, err)
		if sinks.IsPermanent(err) { // too large, unencodable: this event's alone
			if j := next[i]; j >= 0 {
				ready = append(ready, j)
			}
			return
		}
		// Disconnected, stalled: the connection's, not the event's.
		stop = err
		holdBack(i, notPublished(err))
	}
	for {
		for head < len(ready) && stop == nil {
			if s.tryAcquire() {
				publish()
				continue
			}
			if len(flights) > 0 {
				break // wait for the oldest PubAck or a free slot
			}
			// Holding no slot, wait for one: the Sends holding them
			// only wait for their own PubAcks, which come or time out.
			if stop = s.acquire(ctx, l); stop == nil {
				publish()
			}
		}
		if len(flights) == 0 {
			break
		}
		var win chan struct{} // nil: nothing to publish, no slot wanted
		if head < len(ready) && stop == nil {
			win = s.window
		}
		fl := flights[0]
		slot, ack, resolved, err := s.await(ctx, l, fl.f, win)
		if slot { // freed by another Send
			publish()
			continue
		}
		flights = flights[1:]
		s.release()
		if resolved {
			s.putMsg(fl.msg) // the client is done with it
		}
		if err == nil { // a duplicate too: ids are unique per transition, so the stream holds this very event
			if s.fence != nil {
				if events[fl.i].Change == event.Deleted {
					s.fence.forget(fl.obj)
				} else {
					s.fence.set(fl.obj, ack.Sequence)
				}
			}
			if j := next[fl.i]; j >= 0 {
				ready = append(ready, j)
			}
			continue
		}
		if found, known, ok := fenceRefused(err); ok && s.fence != nil { // counted by the link's handler
			// Another writer stored a message of the object since the
			// sequence this one expected. If this Send may still write
			// (its context is live and its ownership's fence holds, asked
			// now, after the other write: sinks.MayWrite), whatever landed
			// is older than this event, so it adopts the stream's sequence
			// and publishes again. A replicated stream may name none
			// (10164: another write of the filter in progress): the same
			// expectation is tried again, then the stream asked.
			if adopted == nil {
				adopted = make([]uint8, n)
			}
			if adopted[fl.i] < maxAdopt && sinks.MayWrite(ctx) == nil {
				adopted[fl.i]++
				if !known && adopted[fl.i] > 1 {
					filter = s.subject.appendFilterTo(filter[:0], events[fl.i])
					var lerr error
					if found, lerr = lastStored(ctx, l.js, string(filter)); lerr == nil {
						known = true
					}
				}
				if known {
					s.fence.adopt(fl.obj, found)
				}
				ready = append(ready, fl.i)
				continue
			}
			err = sinks.Fenced(err)
		}
		err = classify(err)
		out.fail(fl.i, err)
		if sinks.IsPermanent(err) { // refused for good: the subjects' next events go on
			if j := next[fl.i]; j >= 0 {
				ready = append(ready, j)
			}
			continue
		}
		holdBack(fl.i, fmt.Errorf("not published: an earlier event of the object's subjects failed: %w", err))
		if stop == nil && stopsBatch(err) {
			stop = err
		}
	}
	// Ready but never published (stop is set): they and the rest of their
	// subjects' events fail unpublished.
	for _, i := range ready[head:] {
		out.fail(i, notPublished(stop))
		holdBack(i, notPublished(stop))
	}
	return out.result()
}

// stopsBatch says whether a failed publish means the rest of the batch
// would fail alike: the connection is gone, the server no longer answers
// in time, or the caller gave up.
func stopsBatch(err error) bool {
	return errors.Is(err, natsgo.ErrDisconnected) || errors.Is(err, natsgo.ErrConnectionClosed) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded)
}

// tryAcquire takes a slot of the window if one is free.
func (s *Sink) tryAcquire() bool {
	select {
	case s.window <- struct{}{}:
		return true
	default:
		return false
	}
}

// acquire waits for a slot of the window.
func (s *Sink) acquire(ctx context.Context, l *link) error {
	select {
	case s.window <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.closed:
		return natsgo.ErrConnectionClosed
	}
}

func (s *Sink) release() { <-s.window }

// await waits for a PubAck (or the stream's refusal, the client's timeout,
// a disconnect), or, when win is not nil, for a slot of the window (slot:
// the caller holds it now). resolved is false when it gave up first (ctx,
// closed connection): the client may still hold the message.
func (s *Sink) await(ctx context.Context, l *link, f jetstream.PubAckFuture, win chan struct{}) (slot bool, ack *jetstream.PubAck, resolved bool, err error) {
	select {
	case ack := <-f.Ok():
		return false, ack, true, nil
	case err := <-f.Err():
		return false, nil, true, err
	case win <- struct{}{}:
		return true, nil, false, nil
	case <-ctx.Done():
	case <-l.closed:
	}
	select { // what did arrive still counts
	case ack := <-f.Ok():
		return false, ack, true, nil
	case err := <-f.Err():
		return false, nil, true, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return false, nil, false, err
	}
	return false, nil, false, natsgo.ErrConnectionClosed
}

func notPublished(cause error) error {
	return fmt.Errorf("not published after an earlier failure: %w", cause)
}

// getMsg returns a message with a header map to fill; messages are reused
// once the client is done with them (core: at once; JetStream: when the
// PubAck or the refusal came), sparing a map and a dozen header slices
// per event.
func (s *Sink) getMsg() *natsgo.Msg {
	if m, ok := s.msgs.Get().(*natsgo.Msg); ok {
		return m
	}
	return &natsgo.Msg{Header: make(natsgo.Header, 12)}
}

// putMsg returns a message to reuse, without pinning its event's body.
func (s *Sink) putMsg(m *natsgo.Msg) {
	m.Data = nil
	s.msgs.Put(m)
}

// Sizes nats.go encodes headers with: "NATS/1.0\r\n", "key: value\r\n"
// per header, and a final "\r\n".
const (
	hdrPreamble = len("NATS/1.0\r\n") + len("\r\n")
	hdrPerField = len(": \r\n")
)

// fill renders an event into msg: subject, structured JSON body, ce-*
// headers (and Nats-Msg-Id with JetStream). buf is scratch space for the
// subject, returned for the next call; limit is the server's max_payload
// (0: unknown).
func (s *Sink) fill(msg *natsgo.Msg, e *event.Event, buf []byte, limit int64, exp *expectation) ([]byte, error) {
	body, err := e.Structured()
	if err != nil {
		return buf, sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
	}
	buf = s.subject.appendTo(buf[:0], e)
	if len(buf) > MaxSubject {
		// Past the server's control-line limit the server answers with an
		// error that makes nats.go close the connection for good: this
		// event is refused alone instead (an object's name can be long).
		return buf, sinks.Permanent(fmt.Errorf("event %s: its subject is %d bytes, over the %d a NATS server takes in a publish's control line", e.ID, len(buf), MaxSubject))
	}
	if msg.Subject != string(buf) {
		msg.Subject = string(buf)
	}
	msg.Data = body
	h := msg.Header
	size := hdrPreamble
	set := func(k, v string) {
		if cur, ok := h[k]; ok && len(cur) == 1 {
			cur[0] = v
		} else {
			h[k] = []string{v}
		}
		size += len(k) + len(v) + hdrPerField
	}
	delete(h, "ce-kbreplay") // a reused message may hold the previous event's
	delete(h, "ce-kbreason")
	if s.jet {
		set(jetstream.MsgIDHeader, e.ID)
	}
	if exp != nil {
		var seq [20]byte
		set(jetstream.ExpectedLastSubjSeqHeader, string(strconv.AppendUint(seq[:0], exp.seq, 10)))
		set(jetstream.ExpectedLastSubjSeqSubjHeader, string(exp.filter))
	}
	// Percent-encoded as in the CloudEvents HTTP binding: nats.go would
	// turn a CR or LF in a header into a space, so two names could look
	// alike.
	e.Attributes(func(name, value string) { set(ceHeader(name), event.PercentEncode(value)) })
	set("Content-Type", "application/cloudevents+json")
	// The server's limit is on headers and body together; over it, the
	// server would close the connection, failing the whole batch. size is
	// exact (values are percent-encoded: nothing for nats.go to trim);
	// the client's own count confirms a refusal.
	if limit > 0 && int64(size+len(body)) > limit {
		if size := int64(msg.Size() - len(msg.Subject) - len(msg.Reply)); size > limit {
			return buf, sinks.Permanent(fmt.Errorf("event %s is %d bytes with headers, over the server's max_payload %d", e.ID, size, limit))
		}
	}
	return buf, nil
}

// expectation is what a fenced publish expects of the stream: seq is the
// last message of the subjects filter matches (fence.go).
type expectation struct {
	filter []byte
	seq    uint64
}

// ceHeader is the header of a CloudEvents attribute, without building the
// string for the attributes every event has.
func ceHeader(name string) string {
	switch name {
	case "specversion":
		return "ce-specversion"
	case "id":
		return "ce-id"
	case "source":
		return "ce-source"
	case "type":
		return "ce-type"
	case "subject":
		return "ce-subject"
	case "time":
		return "ce-time"
	case "kbrule":
		return "ce-kbrule"
	case "kbcluster":
		return "ce-kbcluster"
	case "kbreplay":
		return "ce-kbreplay"
	case "kbreason":
		return "ce-kbreason"
	case "kbchange":
		return "ce-kbchange"
	}
	return "ce-" + name
}

// MaxSubject is the longest subject the sink publishes: a publish's
// control line ("HPUB <subject> <header bytes> <total bytes>") must fit the
// server's max_control_line, 4096 bytes by default, with room for the rest.
const MaxSubject = 4096 - 64

// Healthy reports a connection that cannot deliver: closed for good
// (replaced on the next Send) or not connected (nats.go reconnecting).
func (s *Sink) Healthy() error {
	nc := s.cur.Load().nc
	switch {
	case nc.IsClosed():
		return errors.New("the NATS connection is closed (replaced on the next delivery)")
	case !nc.IsConnected():
		return fmt.Errorf("not connected to NATS (%s)", nc.Status())
	}
	return nil
}

// classify says whether retrying can help: an event too large for the
// server or the stream, or with an invalid subject, is refused alone for
// good; an authorization or permission the server refuses is the
// destination's config (retried, never given up); a lost connection, a
// timeout or a stream that does not answer pushes back.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, natsgo.ErrMaxPayload) || errors.Is(err, natsgo.ErrBadSubject) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return sinks.Permanent(err)
	case errors.Is(err, natsgo.ErrAuthorization) || errors.Is(err, natsgo.ErrAuthExpired):
		return sinks.Destination(sinks.ReasonUnauthorized, err)
	case errors.Is(err, natsgo.ErrPermissionViolation):
		return sinks.Destination(sinks.ReasonForbidden, err)
	case errors.Is(err, natsgo.ErrConnectionClosed) || errors.Is(err, natsgo.ErrDisconnected) ||
		errors.Is(err, natsgo.ErrTimeout) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, natsgo.ErrNoResponders):
		// No responders: no stream takes the subject, or its leader is
		// being elected; both pass.
		return sinks.Unavailable(err)
	}
	return err
}

// Close drains nothing (unacknowledged events stay queued) and closes.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	s.shut = true
	s.mu.Unlock()
	if s.mirror != nil {
		s.mirror.stopCompactor()
	}
	s.cur.Load().nc.Close()
	if s.embedded != nil {
		s.embedded.Shutdown()
		s.embedded.WaitForShutdown()
	}
	return nil
}

// redact hides credentials and queries in a comma-separated URL list.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = config.RedactURL(p)
	}
	return strings.Join(parts, ",")
}

// Package nats is the NATS sink: each event is published, as structured
// CloudEvents JSON with its attributes also in ce-* headers, to a subject
// built from the sink's template (see Token for how values become tokens).
//
// Acknowledgement: with jetstream, every event's PubAck (the stream has
// stored it; Nats-Msg-Id = event id, so the stream drops replays inside its
// duplicate window, and a duplicate PubAck is a delivery too); with core
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
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds NATS sinks.
var Factory = sinks.Factory{
	Type:      "nats",
	NewConfig: func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:    create,
}

// flushTimeout bounds the wait for a core publish batch to be flushed.
const flushTimeout = 10 * time.Second

// Sink publishes to NATS.
type Sink struct {
	name     string
	nc       *natsgo.Conn
	js       jetstream.JetStream // nil for core NATS
	subject  subjectTemplate
	logger   *slog.Logger
	embedded *server.Server // when the sink runs its own server
}

func create(ctx context.Context, s sinks.Settings) (sinks.Sink, error) {
	c := s.Config.Spec.(*Config)
	if !c.Embedded {
		return Connect(ctx, s.Config.Name, c, s.Logger)
	}
	srv, url, err := startEmbedded(s.Config.Name, c)
	if err != nil {
		return nil, err
	}
	cc := *c
	cc.URL = url
	sink, err := Connect(ctx, s.Config.Name, &cc, s.Logger)
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
	nc, err := natsgo.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redact(c.URL), err)
	}
	s := &Sink{name: name, nc: nc, subject: tmpl, logger: logger}
	if c.JetStream {
		if s.js, err = jetstream.New(nc); err != nil {
			nc.Close()
			return nil, err
		}
		if c.Stream != nil {
			if err := s.ensureStream(ctx, c); err != nil {
				nc.Close()
				return nil, err
			}
		}
	}
	return s, nil
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
		tok, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("tokenFile: %w", err)
		}
		opts = append(opts, natsgo.Token(strings.TrimSpace(string(tok))))
	case c.User != "":
		pw, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("passwordFile: %w", err)
		}
		opts = append(opts, natsgo.UserInfo(c.User, strings.TrimRight(string(pw), "\r\n")))
	}
	if c.TLS != nil {
		tc, err := sinks.TLSConfig(c.TLS)
		if err != nil {
			return nil, err
		}
		if c.TLS.InsecureSkipVerify {
			logger.Warn("TLS server certificates are not verified (insecureSkipVerify)")
		}
		opts = append(opts, natsgo.Secure(tc))
	}
	return opts, nil
}

func (s *Sink) ensureStream(ctx context.Context, c *Config) error {
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
	var err error
	for attempt := 0; attempt < 30; attempt++ { // the server may still be starting
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = s.js.CreateOrUpdateStream(sctx, sc)
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

// Conn is the sink's connection, shared with dead-letters and checkpoints.
func (s *Sink) Conn() *natsgo.Conn { return s.nc }

// Send publishes the batch and waits for its acknowledgement.
func (s *Sink) Send(ctx context.Context, events []*event.Event) error {
	if len(events) == 0 {
		return nil
	}
	if s.js != nil {
		return s.sendJetStream(ctx, events)
	}
	errs := make([]error, len(events))
	published := false
	// Core publish encodes the message at once, so one Msg serves the batch.
	msg := natsgo.NewMsg("")
	var sb strings.Builder
	for i, e := range events {
		err := s.fill(msg, e, &sb)
		if err == nil {
			err = classify(s.nc.PublishMsg(msg))
		}
		if err == nil || sinks.IsPermanent(err) {
			errs[i] = err // too large, unencodable: this event's alone
			published = published || err == nil
			continue
		}
		// The connection is down: publish nothing more.
		errs[i] = err
		for j := i + 1; j < len(events); j++ {
			errs[j] = notPublished(err)
		}
		break
	}
	if published {
		fctx, cancel := context.WithTimeout(ctx, flushTimeout)
		defer cancel()
		if err := s.nc.FlushWithContext(fctx); err != nil {
			for i := range errs {
				if errs[i] == nil {
					errs[i] = classify(err)
				}
			}
		}
	}
	return sinks.Outcome(errs)
}

// sendJetStream publishes asynchronously, in waves: the first event of each
// object in the batch, then once those are acknowledged the second, and so
// on, so an object never has two events in flight and a later event is
// never stored before an earlier one that failed. An object whose event
// failed (retryably) has its later events reported failed, unpublished.
func (s *Sink) sendJetStream(ctx context.Context, events []*event.Event) error {
	errs := make([]error, len(events))
	var waves [][]int // waves[n]: indexes of the events that are their object's n-th in the batch
	seen := make(map[string]int, len(events))
	for i, e := range events {
		n := seen[e.Key]
		seen[e.Key] = n + 1
		if n == len(waves) {
			waves = append(waves, nil)
		}
		waves[n] = append(waves[n], i)
	}
	failed := map[string]error{} // object -> why its later events are held back
	var stop error               // set when nothing more can be published
	var expired error            // set when waiting for PubAcks is over
	deadline := time.NewTimer(flushTimeout)
	defer deadline.Stop()
	type flight struct {
		i int
		f jetstream.PubAckFuture
	}
	var sb strings.Builder
	flights := make([]flight, 0, len(waves[0]))
	for _, wave := range waves {
		flights = flights[:0]
		for _, i := range wave {
			e := events[i]
			if stop == nil && ctx.Err() != nil {
				stop = ctx.Err()
			}
			if stop != nil {
				errs[i] = notPublished(stop)
				continue
			}
			if err := failed[e.Key]; err != nil {
				errs[i] = fmt.Errorf("not published: an earlier event of the object failed: %w", err)
				continue
			}
			msg := natsgo.NewMsg("") // kept by the client until acknowledged
			msg.Header[jetstream.MsgIDHeader] = []string{e.ID}
			err := s.fill(msg, e, &sb)
			var f jetstream.PubAckFuture
			if err == nil {
				f, err = s.js.PublishMsgAsync(msg)
				err = classify(err)
			}
			switch {
			case err == nil:
				flights = append(flights, flight{i, f})
			case sinks.IsPermanent(err):
				errs[i] = err
			default: // disconnected, stalled: the connection's, not the event's
				errs[i], stop = err, err
			}
		}
		for _, fl := range flights {
			var err error
			if expired == nil {
				select {
				case <-fl.f.Ok(): // a duplicate too: the stream holds this very event
				case err = <-fl.f.Err():
				case <-deadline.C:
					expired = errors.New("timed out waiting for JetStream acknowledgements")
				case <-ctx.Done():
					expired = ctx.Err()
				}
			}
			if expired != nil && err == nil { // what did arrive still counts
				stop = expired
				select {
				case <-fl.f.Ok():
				case err = <-fl.f.Err():
				default:
					err = expired
				}
			}
			if err != nil {
				errs[fl.i] = classify(err)
				if !sinks.IsPermanent(errs[fl.i]) {
					failed[events[fl.i].Key] = err
				}
			}
		}
	}
	return sinks.Outcome(errs)
}

func notPublished(cause error) error {
	return fmt.Errorf("not published after an earlier failure: %w", cause)
}

// fill renders an event into msg: structured JSON body, ce-* headers.
func (s *Sink) fill(msg *natsgo.Msg, e *event.Event, sb *strings.Builder) error {
	body, err := e.Structured()
	if err != nil {
		return sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
	}
	msg.Subject = s.subject.render(e, sb)
	msg.Data = body
	h := msg.Header
	set := func(k, v string) {
		if cur, ok := h[k]; ok && len(cur) == 1 {
			cur[0] = v
		} else {
			h[k] = []string{v}
		}
	}
	delete(h, "ce-kbreplay") // a reused header may hold the previous event's
	delete(h, "ce-kbreason")
	// Percent-encoded as in the CloudEvents HTTP binding: nats.go would
	// turn a CR or LF in a header into a space, so two names could look
	// alike.
	e.Attributes(func(name, value string) { set("ce-"+name, event.PercentEncode(value)) })
	set("Content-Type", "application/cloudevents+json")
	// The server's limit is on headers and body together; over it, the
	// server would close the connection, failing the whole batch.
	if limit := s.nc.MaxPayload(); limit > 0 {
		if size := int64(msg.Size() - len(msg.Subject) - len(msg.Reply)); size > limit {
			return sinks.Permanent(fmt.Errorf("event %s is %d bytes with headers, over the server's max_payload %d", e.ID, size, limit))
		}
	}
	return nil
}

// classify marks what retrying cannot fix: the event is too large for the
// server or the stream, or its subject is invalid.
func classify(err error) error {
	if errors.Is(err, natsgo.ErrMaxPayload) || errors.Is(err, natsgo.ErrBadSubject) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		return sinks.Permanent(err)
	}
	return err
}

// Close drains nothing (unacknowledged events stay queued) and closes.
func (s *Sink) Close(context.Context) error {
	s.nc.Close()
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

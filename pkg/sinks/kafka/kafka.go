// Package kafka is the Kafka sink, on franz-go: each event is a record on
// a change topic in CloudEvents' Kafka protocol binding, binary mode (the
// value is the event's data, the attributes are ce_* headers,
// content-type is application/json), keyed by the object's uid. With a
// state topic, each event is also a record on a compacted topic per rule,
// keyed by uid: the structured CloudEvent for added and updated, a
// tombstone for deleted, so that after compaction the topic holds exactly
// the rule's view, and the sink reads it back as what it holds
// (sinks.Holder).
//
// Acknowledgement: acks=all with the idempotent producer (franz-go's
// default): up to 5 produce requests in flight per broker, order kept per
// partition across retries, a record that fails failing every later one
// buffered for its partition (gapless). An object's records always go to
// one partition of each topic (the uid is the key). An event is
// acknowledged when its change record and its state record both are;
// Send returns nil only then, for every event (sinks.EventErrors
// otherwise). An object's events of one batch with different uids (the
// deletion of an object and the addition of its successor under the same
// name) go one after the other: they go to different partitions.
//
// Outcomes: a record that cannot fit a batch alone (maxRecordBytes) or
// cannot be encoded is its event's, for good (Permanent); a broker that
// is unreachable, times out, or is not the leader is the destination's
// (Unavailable); refused credentials or permissions, a missing topic or
// a broker refusing a batch as too large (its limit is below
// maxRecordBytes) are the destination's config (Destination).
//
// Memory is bounded by maxBufferedRecords and maxBufferedBytes: a batch
// waits for room. The sink is not fenced at the destination: Kafka has no
// conditional write per key (see docs/kafka.md).
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds Kafka sinks. They are not fenced at the destination
// (Fences is nil): Kafka has no write conditional on a key's last record,
// so a shard moving to another replica first waits out the bound on how
// long a send its predecessor cut short may still land
// (docs/sharding.md).
var Factory = sinks.Factory{
	Type:      "kafka",
	NewConfig: func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:    create,
}

// Content types of the binding: binary mode's is the data's
// (datacontenttype), structured mode's is the event format's.
const (
	contentTypeData       = "application/json"
	contentTypeStructured = "application/cloudevents+json; charset=UTF-8"
)

// waitGrace is how long Send waits past the record timeout for the
// client to fail what it could not deliver: a record already sent to a
// broker that does not answer is failed only when the request times out.
const waitGrace = 5 * time.Second

// Sink produces to Kafka.
type Sink struct {
	name    string
	cfg     Config
	logger  *slog.Logger
	client  *kgo.Client
	admin   *kadm.Client
	opts    []kgo.Opt // the connection's (brokers, TLS, SASL), for the clients Held makes
	topic   template
	state   *template // nil: no state topic
	timeout time.Duration

	mu      sync.Mutex
	topics  map[string]topicNames // by rule, cluster and resource: rendered and checked
	created map[string]bool       // topics created (or found) with createTopics
	// diagnosed is when diagnose last asked a broker; cause is what it
	// learnt (nil: nothing but an outage).
	diagnosed time.Time
	cause     error

	// down is why the last Send that reached no verdict of the broker
	// failed (nil once a record is acknowledged again): Healthy.
	down atomic.Pointer[error]
}

// topicNames are the topics of one rule's events, or why they are not
// legal.
type topicNames struct {
	change, state string
	err           error
}

// create makes the sink; with a state topic it is a HoldingSink, whose
// destination holds the views (sinks.Holder).
func create(ctx context.Context, s sinks.Settings) (sinks.Sink, error) {
	sink, err := New(ctx, s.Name, s.Config.(*Config), s.Logger)
	if err != nil {
		return nil, err
	}
	if sink.state != nil {
		return HoldingSink{sink}, nil
	}
	return sink, nil
}

// New makes a sink; it connects lazily (a broker not up yet is waited
// for by the deliveries, not by the start).
func New(_ context.Context, name string, c *Config, logger *slog.Logger) (*Sink, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	topic, err := parseTemplate(c.Topic, topicPlaceholders)
	if err != nil {
		return nil, fmt.Errorf("topic: %w", err)
	}
	s := &Sink{name: name, cfg: *c, logger: logger, topic: topic, timeout: c.Timeout.D(),
		topics: map[string]topicNames{}, created: map[string]bool{}}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if c.StateTopic != "" {
		st, err := parseTemplate(c.StateTopic, statePlaceholders)
		if err != nil {
			return nil, fmt.Errorf("stateTopic: %w", err)
		}
		s.state = &st
	}
	s.opts, err = connOptions(name, c, logger)
	if err != nil {
		return nil, err
	}
	maxRecord := c.MaxRecordBytes
	if maxRecord <= 0 {
		maxRecord = DefaultMaxRecordBytes
	}
	opts := append(append([]kgo.Opt(nil), s.opts...),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the idempotent producer's, said aloud
		kgo.ProducerBatchMaxBytes(int32(maxRecord)),
		kgo.MaxBufferedRecords(max(c.MaxBufferedRecords, 2)),
		kgo.MaxBufferedBytes(int(max(c.MaxBufferedBytes, 2*int64(maxRecord)))),
		kgo.RecordDeliveryTimeout(s.timeout),
		kgo.ProduceRequestTimeout(s.timeout),
		kgo.ProducerLinger(0),
	)
	s.client, err = kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	s.admin = kadm.NewClient(s.client)
	return s, nil
}

// connOptions are what a client of c is made of: brokers, client id,
// TLS and SASL.
func connOptions(name string, c *Config, logger *slog.Logger) ([]kgo.Opt, error) {
	id := c.ClientID
	if id == "" {
		id = "kubebridge-" + name
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(id),
		kgo.DialTimeout(5 * time.Second),
		kgo.RetryTimeout(10 * time.Second),
	}
	if c.TLS != nil {
		tf, err := sinks.OpenTLS(c.TLS)
		if err != nil {
			return nil, err
		}
		if c.TLS.InsecureSkipVerify {
			logger.Warn("TLS server certificates are not verified (insecureSkipVerify)")
		}
		// Built on every dial: renewed certificates and CAs are used on
		// the next connection.
		d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			tc, err := tf.Config()
			if err != nil {
				return nil, err
			}
			if h, _, err := net.SplitHostPort(host); err == nil {
				tc.ServerName = h
			}
			return (&tls.Dialer{NetDialer: d, Config: tc}).DialContext(ctx, network, host)
		}))
	}
	if c.SASL != nil {
		pw, err := sinks.OpenCredentialFile(c.SASL.PasswordFile, sinks.TrimLine)
		if err != nil {
			return nil, fmt.Errorf("sasl.passwordFile: %w", err)
		}
		mech, err := mechanism(c.SASL.Mechanism, c.SASL.User, pw)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}

// mechanism is the SASL mechanism, with the password read again (when
// its file changed) on every connection; a file rotated into something
// that is no single-line token is never sent.
func mechanism(name, user string, pw *sinks.CredentialFile) (sasl.Mechanism, error) {
	password := func() (string, error) {
		v, _ := pw.Value()
		if err := config.Sendable(v); err != nil {
			return "", fmt.Errorf("sasl.passwordFile: not sending it: %w", err)
		}
		return string(v), nil
	}
	switch name {
	case "PLAIN":
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			p, err := password()
			return plain.Auth{User: user, Pass: p}, err
		}), nil
	case "SCRAM-SHA-256":
		return scram.Sha256(func(context.Context) (scram.Auth, error) {
			p, err := password()
			return scram.Auth{User: user, Pass: p}, err
		}), nil
	case "SCRAM-SHA-512":
		return scram.Sha512(func(context.Context) (scram.Auth, error) {
			p, err := password()
			return scram.Auth{User: user, Pass: p}, err
		}), nil
	}
	return nil, fmt.Errorf("sasl.mechanism: %q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", name)
}

// maxTopicCache bounds the topics remembered (rules come and go with
// reloads; a sink outlives them).
const maxTopicCache = 4096

// topicsOf returns the topics of e's rule, rendered once per rule.
func (s *Sink) topicsOf(e *event.Event) topicNames {
	gvr := e.GVR()
	key := e.Rule() + "\x00" + e.Cluster() + "\x00" + gvr.Group + "\x00" + gvr.Version + "\x00" + gvr.Resource
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.topics[key]; ok {
		return t
	}
	group := gvr.Group
	if group == "" {
		group = "core"
	}
	v := values{cluster: e.Cluster(), rule: e.Rule(), group: group, version: gvr.Version, resource: gvr.Resource}
	t := topicNames{change: s.topic.render(v)}
	if err := checkTopic(t.change); err != nil {
		t.err = fmt.Errorf("topic: %w", err)
	}
	if s.state != nil && t.err == nil {
		t.state = s.state.render(v)
		if err := checkTopic(t.state); err != nil {
			t.err = fmt.Errorf("stateTopic: %w", err)
		}
	}
	if len(s.topics) >= maxTopicCache {
		clear(s.topics)
	}
	s.topics[key] = t
	return t
}

// StateTopic is the state topic of rule ("" without one).
func (s *Sink) StateTopic(rule string) string {
	if s.state == nil {
		return ""
	}
	return s.state.render(values{rule: rule})
}

// ensureTopics creates the topics (with createTopics) before their first
// record: a missing topic is created, the state topic compacted.
func (s *Sink) ensureTopics(ctx context.Context, t topicNames) error {
	if !s.cfg.CreateTopics {
		return nil
	}
	for _, tp := range []struct {
		name    string
		compact bool
	}{{t.change, false}, {t.state, true}} {
		if tp.name == "" {
			continue
		}
		s.mu.Lock()
		done := s.created[tp.name]
		s.mu.Unlock()
		if done {
			continue
		}
		if err := s.createTopic(ctx, tp.name, tp.compact); err != nil {
			return err
		}
		s.mu.Lock()
		if len(s.created) >= maxTopicCache {
			clear(s.created)
		}
		s.created[tp.name] = true
		s.mu.Unlock()
	}
	return nil
}

func (s *Sink) createTopic(ctx context.Context, name string, compact bool) error {
	var configs map[string]*string
	if compact {
		policy := "compact"
		configs = map[string]*string{"cleanup.policy": &policy}
	}
	partitions, rf := int32(-1), int16(-1)
	if s.cfg.Partitions > 0 {
		partitions = int32(s.cfg.Partitions)
	}
	if s.cfg.ReplicationFactor > 0 {
		rf = int16(s.cfg.ReplicationFactor)
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.admin.CreateTopics(cctx, partitions, rf, configs, name)
	if err == nil {
		var r kadm.CreateTopicResponse
		if r, err = resp.On(name, nil); err == nil {
			err = r.Err
		}
	}
	var ke *kerr.Error
	switch {
	case err == nil:
		s.logger.Info("kafka topic created", "topic", name, "compacted", compact)
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return nil
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return sinks.Unavailable(fmt.Errorf("creating topic %s: no answer within %s", name, s.timeout))
	case ctx.Err() == nil && !errors.As(err, &ke):
		// Not the broker's answer: it could not be asked.
		return sinks.Unavailable(fmt.Errorf("creating topic %s: %w", name, err))
	}
	return fmt.Errorf("creating topic %s: %w", name, err)
}

// records renders e's records: the change record, then the state record
// (when the sink has a state topic).
func (s *Sink) records(e *event.Event, t topicNames) ([]*kgo.Record, error) {
	if t.err != nil {
		return nil, sinks.Permanent(fmt.Errorf("event %s: %w", e.ID, t.err))
	}
	data, err := e.Data()
	if err != nil {
		return nil, sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
	}
	key := []byte(e.UID())
	headers := make([]kgo.RecordHeader, 0, 12)
	e.Attributes(func(name, value string) {
		headers = append(headers, kgo.RecordHeader{Key: "ce_" + name, Value: []byte(strings.ToValidUTF8(value, "\uFFFD"))})
	})
	n := len(headers)
	change := &kgo.Record{Topic: t.change, Key: key, Value: data,
		Headers: append(headers, kgo.RecordHeader{Key: "content-type", Value: []byte(contentTypeData)})}
	size := recordSize(change)
	if size > s.maxRecordBytes() {
		return nil, sinks.Permanent(fmt.Errorf("event %s: its record is about %d bytes, over maxRecordBytes %d", e.ID, size, s.maxRecordBytes()))
	}
	if t.state == "" {
		return []*kgo.Record{change}, nil
	}
	// The state record carries the same attributes as headers (the
	// binding allows them in structured mode); a tombstone is binary
	// mode without data: no value, no content-type.
	state := &kgo.Record{Topic: t.state, Key: key, Headers: headers[:n:n]}
	if e.Change != event.Deleted {
		body, err := e.Structured()
		if err != nil {
			return nil, sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
		}
		state.Value = body
		state.Headers = append(headers[:n:n], kgo.RecordHeader{Key: "content-type", Value: []byte(contentTypeStructured)})
		if size := recordSize(state); size > s.maxRecordBytes() {
			return nil, sinks.Permanent(fmt.Errorf("event %s: its state record is about %d bytes, over maxRecordBytes %d", e.ID, size, s.maxRecordBytes()))
		}
	}
	return []*kgo.Record{change, state}, nil
}

func (s *Sink) maxRecordBytes() int {
	if s.cfg.MaxRecordBytes > 0 {
		return s.cfg.MaxRecordBytes
	}
	return DefaultMaxRecordBytes
}

// recordSize is about what a record takes in a batch of its own: its
// key, value and headers, plus the batch's and the record's overhead.
func recordSize(r *kgo.Record) int {
	n := 61 + 21 + len(r.Key) + len(r.Value) // batch header, record's varints and fields
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// result is one record's outcome, from its promise.
type result struct {
	i   int
	err error
}

// Send produces the batch's records and waits for their acknowledgement
// (see the package doc for order and outcomes).
func (s *Sink) Send(ctx context.Context, events []*event.Event) error {
	n := len(events)
	if n == 0 {
		return nil
	}
	errs := make([]error, n)
	left := make([]int, n)   // records of the event not yet resolved
	next := make([]int, n)   // the next event of the same key, launched once this one is acknowledged, or -1
	waits := make([]bool, n) // the event waits for its key's previous event
	done := make([]bool, n)  // resolved
	last := make(map[string]int, n)
	for i, e := range events {
		next[i] = -1
		if j, ok := last[e.Key()]; ok {
			next[j], waits[i] = i, true
		}
		last[e.Key()] = i
	}
	// Promises may come after Send gave up: the channel holds them all.
	results := make(chan result, 2*n)
	resolved := 0
	var resolve func(i int, err error)
	ensured := map[string]error{} // topics made sure of in this Send, and how
	launch := func(i int) {
		e := events[i]
		t := s.topicsOf(e)
		recs, err := s.records(e, t)
		if err == nil {
			var seen bool
			if err, seen = ensured[t.change+"\x00"+t.state]; !seen {
				err = s.ensureTopics(ctx, t)
				ensured[t.change+"\x00"+t.state] = err
			}
			err = classify(err)
		}
		if err != nil {
			resolve(i, err)
			return
		}
		left[i] = len(recs)
		for _, r := range recs {
			s.client.Produce(ctx, r, func(_ *kgo.Record, err error) { results <- result{i, err} })
		}
	}
	resolve = func(i int, err error) {
		errs[i], done[i] = err, true
		resolved++
		if j := next[i]; j >= 0 {
			if err == nil || sinks.IsPermanent(err) {
				launch(j)
			} else {
				resolve(j, notProduced(err))
			}
		}
	}
	for i := range events {
		if !waits[i] {
			launch(i)
		}
	}
	timer := time.NewTimer(s.timeout + waitGrace)
	defer timer.Stop()
	var stop error
	for resolved < n && stop == nil {
		select {
		case r := <-results:
			if r.err != nil && errs[r.i] == nil {
				errs[r.i] = classify(r.err)
			}
			if left[r.i]--; left[r.i] == 0 {
				resolve(r.i, errs[r.i])
			}
		case <-timer.C:
			stop = sinks.Unavailable(fmt.Errorf("no acknowledgement from Kafka within %s", s.timeout+waitGrace))
		case <-ctx.Done():
			stop = ctx.Err()
		}
	}
	if stop != nil {
		// Unresolved: in flight (they may still land) or never produced.
		for i := range events {
			if !done[i] && errs[i] == nil {
				errs[i] = stop
			}
		}
	}
	unavailable, acked, retryable := false, false, false
	for _, err := range errs {
		unavailable = unavailable || sinks.IsUnavailable(err)
		acked = acked || err == nil
		retryable = retryable || err != nil && !sinks.IsPermanent(err)
	}
	if unavailable {
		if cause := s.diagnose(ctx); cause != nil {
			for i, err := range errs {
				if sinks.IsUnavailable(err) {
					// The refusal's class, the record's story.
					errs[i] = fmt.Errorf("%w; the records were not produced: %s", cause, err)
				}
			}
		}
	}
	switch {
	case acked:
		s.down.Store(nil)
	case retryable && ctx.Err() == nil:
		err := sinks.Outcome(errs)
		s.down.Store(&err)
	}
	return sinks.Outcome(errs)
}

// Healthy reports a sink whose last Send could not reach the brokers (or
// was refused by them as a whole: a credential, a permission), until a
// record is acknowledged again (sinks.HealthChecker).
func (s *Sink) Healthy() error {
	if p := s.down.Load(); p != nil {
		return fmt.Errorf("kafka: the last delivery failed: %w", *p)
	}
	return nil
}

// diagnoseEvery spaces the pings that look for why records time out.
const diagnoseEvery = 5 * time.Second

// diagnose asks a broker, at most every diagnoseEvery, why records could
// not be produced: franz-go fails them with a timeout whatever kept them
// back, and a refused credential or permission is the destination's
// config, not an outage. It returns that refusal, classified, or nil.
func (s *Sink) diagnose(ctx context.Context) error {
	s.mu.Lock()
	if time.Since(s.diagnosed) < diagnoseEvery {
		cause := s.cause
		s.mu.Unlock()
		return cause
	}
	s.diagnosed = time.Now()
	s.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var cause error
	if err := classify(s.client.Ping(pctx)); err != nil {
		if _, ok := sinks.DestinationReason(err); ok {
			cause = err
		}
	}
	s.mu.Lock()
	s.cause = cause
	s.mu.Unlock()
	return cause
}

func notProduced(cause error) error {
	return fmt.Errorf("not acknowledged: an earlier event of the object failed: %w", cause)
}

// classify says whether retrying can help: a record too large for a batch
// of its own is its event's, for good; refused credentials and
// permissions, a missing topic and a broker's limit below the sink's are
// the destination's config; the rest (unreachable, timeouts, leaders
// moving) is the destination being unavailable.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case sinks.IsPermanent(err), sinks.IsUnavailable(err):
		return err
	case errors.Is(err, kerr.MessageTooLarge) && !strings.Contains(err.Error(), ", compressed_bytes="):
		// Refused by the client: the record does not fit a batch alone.
		return sinks.Permanent(err)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge), errors.Is(err, kerr.InvalidRecord):
		// Refused by the broker: a batch of records each within
		// maxRecordBytes, over the topic's max.message.bytes.
		return sinks.Destination(sinks.ReasonConfig, fmt.Errorf("%w (is maxRecordBytes above the topic's max.message.bytes?)", err))
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.UnsupportedSaslMechanism):
		return sinks.Destination(sinks.ReasonUnauthorized, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed):
		return sinks.Destination(sinks.ReasonForbidden, err)
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return sinks.Destination(sinks.ReasonNotFound, fmt.Errorf("%w (create the topic, or set createTopics: true)", err))
	case errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.PolicyViolation), errors.Is(err, kerr.InvalidReplicationFactor),
		errors.Is(err, kerr.InvalidPartitions), errors.Is(err, kerr.InvalidConfig):
		return sinks.Destination(sinks.ReasonConfig, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var ke *kerr.Error
	if errors.As(err, &ke) && !ke.Retriable {
		return err // retried as it is, counted as a failure
	}
	// kgo.ErrRecordTimeout, ErrRecordRetries, ErrClientClosed, a broker
	// unreachable (net errors), NotLeaderForPartition, RequestTimedOut,
	// NotEnoughReplicas, and every other retriable error.
	return sinks.Unavailable(err)
}

// Close stops producing: what is still buffered fails (it stays queued
// for replay) and the connections close.
func (s *Sink) Close(context.Context) error {
	s.client.Close()
	return nil
}

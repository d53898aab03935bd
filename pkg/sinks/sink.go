// Package sinks is the SDK of sink types (docs/sdk.md): what a sink is
// and how sinks are registered (Sink, Factory, Settings, Registry), the
// outcome classes that tell the delivery how to retry (shared with exec
// plugins, pkg/plugin), what the process lends sinks (Host, KV), the
// dead-letter, and the credential and TLS files sinks read. A sink type
// written in another module is a first-class sink: cmd/bridgecmd builds a
// bridge with it, sinkstest checks it against the contract. The delivery
// loop every sink shares (queue -> batch -> Send, retried with backoff until
// acknowledged) wraps the sink from outside, in internal/delivery, in the
// style of the OpenTelemetry collector's exporterhelper: a sink only sends
// and classifies its errors.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks/outcome"
)

// Sink delivers events to one destination.
//
// Order per object (event.Key) is a promise to consumers, and the
// delivery keeps it, not the sink: a batch holds at most one event of each
// object, and the delivery hands an object's next event to Send only once
// the destination took the previous one or refused it for good
// (Permanent). Send may thus send a batch's events in any order, all at
// once, each faring alone. (An Ordered sink gets an object's events
// together instead.) Send is called from several goroutines at once, each
// with its own batch (up to the sink's concurrency: adaptive, or its fixed
// workers), so it must be safe for concurrent use; an object's events are
// never in two batches in flight at once. Each call is one unit of that
// concurrency, whose round trip the delivery measures: one request,
// publish and flush, or write and sync.
//
// Send returns nil only when the destination has acknowledged every event
// of the batch (durably, as far as the destination promises: a flush, a
// PubAck, a 2xx, an fsync). On error the batch is sent again (only its
// failed events when Send reports per event with EventErrors), so a sink
// may deliver an event twice, never zero times. Sinks classify errors and
// never retry themselves: wrap with Permanent what retrying cannot fix.
//
// Close releases the sink's resources; no Send follows it.
type Sink interface {
	Send(ctx context.Context, events []*event.Event) error
	Close(ctx context.Context) error
}

// MaxBatch is the most events handed to one Send when the sink does not
// say otherwise (see Batcher).
const MaxBatch = 256

// Batcher is implemented by sinks that want batches of their own size,
// waiting up to maxWait for a batch to fill (a webhook's batch mode).
type Batcher interface {
	Batching() (maxEvents int, maxWait time.Duration)
}

// Ordered is implemented by sinks whose Send delivers a batch as one
// ordered unit (one request, one write), so that no event lands unless
// every one before it did, or was refused for good. When Ordered returns
// true, a batch may hold several events of an object, consecutive and in
// order, instead of one per Send.
type Ordered interface {
	Ordered() bool
}

// HealthChecker is implemented by sinks that can tell, without sending,
// that they cannot deliver now (a NATS connection closed for good, a
// plugin that keeps crashing). /readyz reports the error, named by sink;
// delivery goes on retrying either way.
type HealthChecker interface {
	Healthy() error
}

// Settings is what a factory gets to build a sink of its type, or what a
// sink of its type provides (Factory.DeadLetter, Factory.KV): the sink's
// own part of the config and what the process running it lends it, never
// the rest of the bridge's config.
type Settings struct {
	// Name is the sink's name (sinks[].name), unique in the config: rules,
	// metrics and logs name the sink by it.
	Name string
	// Config is the sink's type block, decoded strictly into a fresh
	// NewConfig value and validated: a pointer to the factory's own
	// config type.
	Config any
	// Logger logs as the sink (it carries the sink's name). Never nil.
	Logger *slog.Logger
	// Host keeps what outlives the sink and what the type shares among
	// its sinks and capabilities (a connection, an embedded server); nil
	// when the sink is built on its own: it then owns all it opens.
	Host Host
	// InFlight is the most Sends the delivery has in flight at once for
	// the sink (its fixed workers, or its adaptive concurrency's
	// maximum): a sink that keeps connections needs no more than this.
	// 0 when unknown.
	InFlight int
	// MaxRetryInterval is the longest the delivery waits between two
	// attempts (retry.maxInterval): a pause the destination asks for
	// (Retry-After) is worth honouring up to it. 0 when unknown.
	MaxRetryInterval time.Duration
	// Digest is the sink's digest (sinks[].digest), nil without one: the
	// delivery hands the sink a period's events at once (each object's
	// once), to render as one message per group (config.Digest.GroupBy),
	// listing config.Digest.Max of them.
	Digest *config.Digest
}

// KV is a key-value bucket in a sink's destination, which the host keeps
// the checkpoint in (Factory.KV): the checkpoint's keys and values are
// internal/checkpoint's, the bucket's only to store. Keys are tokens of
// letters, digits, - and _ (and =) joined by dots.
//
// Writes are conditional on the key's last revision, which the bucket
// checks where it stores them: a writer that gave up what it writes (a
// shard handed over) may have a write in flight that lands late, and it
// must be refused if anyone wrote the key meanwhile. A refused write
// returns a *RevisionError with the revision the bucket holds.
type KV interface {
	// Get returns the value of key and its revision; ok is false when it
	// has none.
	Get(ctx context.Context, key string) (entry KVEntry, ok bool, err error)
	// Put sets the value of key if its last revision (a value's or a
	// deletion's) is last, 0 for none, and returns the new revision.
	Put(ctx context.Context, key string, value []byte, last uint64) (uint64, error)
	// Delete removes key if its last revision is last, and returns the
	// revision of the deletion.
	Delete(ctx context.Context, key string, last uint64) (uint64, error)
	// List returns every key that starts with prefix, whole tokens of it
	// (prefix ends with a dot), and its value and revision.
	List(ctx context.Context, prefix string) (map[string]KVEntry, error)
	// Close releases the bucket, not what it shares through the Host.
	Close() error
}

// KVEntry is a key's value and the revision that wrote it.
type KVEntry struct {
	Value    []byte
	Revision uint64
}

// RevisionError is a KV write refused because the key's last revision is
// not the one the write expected: Current is the bucket's (0 when the
// bucket did not say). It is a refusal by the destination's fence.
type RevisionError struct {
	Key     string
	Current uint64
	Err     error
}

func (e *RevisionError) Error() string {
	return fmt.Sprintf("key %s: written meanwhile (revision %d): %v", e.Key, e.Current, e.Err)
}

func (e *RevisionError) Unwrap() []error { return []error{ErrFenced, e.Err} }

// Factory is a sink type as a component: the config key that selects it,
// its config (defaults in NewConfig, checks in the config's Validate
// methods, which the loader calls with paths and lines) and its constructor.
// A new sink type is one package exporting a Factory plus one line in the
// list of components (pkg/components), or in the main of a bridge of one's
// own (cmd/bridgecmd).
type Factory struct {
	// Type is the key of the sink's type block in the config (nats:, exec:).
	Type string
	// NewConfig returns a pointer to a fresh config struct with its
	// defaults set; the loader decodes the type block into it strictly.
	NewConfig func() any
	// Create builds a sink; s.Config is the decoded NewConfig value.
	Create func(ctx context.Context, s Settings) (Sink, error)
	// OptIn, when set, is what the operator must allow outside the config
	// before a sink of this type may run (a type that runs programs the
	// config names, say); the host refuses the config otherwise.
	OptIn *OptIn

	// Capabilities: what a sink of this type provides besides delivering,
	// for other parts of the config to name it by (config.Capability).
	// Each gets the Settings of the sink named, with the host's Host: what
	// it opens to the sink's destination it shares through s.Host, which
	// closes it after every sink, so that it outlives a reload of the sink.

	// DeadLetter, when set, returns a dead-letter into the destination of
	// the sink s configures, at target (config.DeadLetterSink: another
	// sink's deadLetter names this sink, and target is its subject). A
	// dead-letter with a Close(context.Context) error method is closed
	// with the sink whose dead-letter it is.
	DeadLetter func(ctx context.Context, s Settings, target string) (DeadLetter, error)
	// KV, when set, opens (creating) the key-value bucket named bucket in
	// the destination of the sink s configures (config.CheckpointKV: the
	// checkpoint names this sink and the bucket).
	KV func(ctx context.Context, s Settings, bucket string) (KV, error)

	// Fences, when set, says whether a sink configured as spec (its
	// NewConfig value) is fenced at its destination: the destination
	// refuses a write sent by a replica that gave the object up once its
	// successor wrote it (JetStream publish expectations). A shard moving
	// between replicas whose sinks all fence starts delivering at once;
	// otherwise its new owner first waits out the bound on how long a
	// send its predecessor cut short may still land (docs/sharding.md).
	Fences func(spec any) bool
}

// OptIn is a permission a sink type needs from the operator.
type OptIn struct {
	// Name is what the host is told to allow, e.g. "exec-plugins".
	Name string
	// Why is the message of a config refused for want of it: what the type
	// does, and how to allow it.
	Why string
}

// Registry maps sink types to factories. Build one with NewRegistry; the
// sink types of kubebridge's build are listed in pkg/components, a
// distribution's in its main (cmd/bridgecmd.Settings). It is the
// config loader's config.SinkTypes, and says which types provide what
// (Provides).
type Registry struct {
	factories map[string]Factory
	host      Host // WithHost
}

// NewRegistry returns a registry of factories, rejecting duplicate types.
func NewRegistry(factories ...Factory) (*Registry, error) {
	r := &Registry{factories: map[string]Factory{}}
	for _, f := range factories {
		if f.Type == "" || f.NewConfig == nil || f.Create == nil {
			return nil, fmt.Errorf("sinks: factory %q is incomplete", f.Type)
		}
		if _, dup := r.factories[f.Type]; dup {
			return nil, fmt.Errorf("sinks: duplicate factory for type %q", f.Type)
		}
		r.factories[f.Type] = f
	}
	return r, nil
}

// Types lists the registered sink types.
func (r *Registry) Types() []string {
	out := make([]string, 0, len(r.factories))
	for t := range r.factories {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// NewSinkConfig returns a fresh, defaulted config for typ (config.SinkTypes).
func (r *Registry) NewSinkConfig(typ string) (any, bool) {
	f, ok := r.factories[typ]
	if !ok {
		return nil, false
	}
	return f.NewConfig(), true
}

// SinkTypeNames lists the registered types (config.SinkTypes).
func (r *Registry) SinkTypeNames() []string { return r.Types() }

// OptIn returns the permission sinks of type typ need, nil for none.
func (r *Registry) OptIn(typ string) *OptIn { return r.factories[typ].OptIn }

// WithHost returns a registry of r's factories that hands h to them
// (Settings.Host): the one a process that runs sinks builds them with.
func (r *Registry) WithHost(h Host) *Registry {
	return &Registry{factories: r.factories, host: h}
}

// Provides reports whether sinks of type typ provide c (config.SinkTypes).
func (r *Registry) Provides(typ string, c config.Capability) bool {
	f := r.factories[typ]
	switch c {
	case config.DeadLetterSink:
		return f.DeadLetter != nil
	case config.CheckpointKV:
		return f.KV != nil
	}
	return false
}

// Fences says whether the sink sc configures is fenced at its destination
// (Factory.Fences).
func (r *Registry) Fences(sc config.Sink) bool {
	f := r.factories[sc.Type]
	return f.Fences != nil && f.Fences(sc.Spec)
}

// Create builds the sink sc configures (sc as the config loader decoded
// it, with this registry); logger logs as the sink.
func (r *Registry) Create(ctx context.Context, sc config.Sink, logger *slog.Logger) (Sink, error) {
	f, err := r.factory(sc)
	if err != nil {
		return nil, err
	}
	return f.Create(ctx, r.settings(sc, logger))
}

// DeadLetter returns the dead-letter into the destination of the sink sc
// configures, at target (Factory.DeadLetter).
func (r *Registry) DeadLetter(ctx context.Context, sc config.Sink, logger *slog.Logger, target string) (DeadLetter, error) {
	f, err := r.factory(sc)
	if err != nil {
		return nil, err
	}
	if f.DeadLetter == nil {
		return nil, errors.New(config.NotProvided(r, sc.Name, config.DeadLetterSink))
	}
	return f.DeadLetter(ctx, r.settings(sc, logger), target)
}

// KV opens the bucket in the destination of the sink sc configures
// (Factory.KV).
func (r *Registry) KV(ctx context.Context, sc config.Sink, logger *slog.Logger, bucket string) (KV, error) {
	f, err := r.factory(sc)
	if err != nil {
		return nil, err
	}
	if f.KV == nil {
		return nil, errors.New(config.NotProvided(r, sc.Name, config.CheckpointKV))
	}
	return f.KV(ctx, r.settings(sc, logger), bucket)
}

func (r *Registry) factory(sc config.Sink) (Factory, error) {
	f, ok := r.factories[sc.Type]
	if !ok {
		return Factory{}, fmt.Errorf("sink %q: type %q is not available in this build (have: %v)", sc.Name, sc.Type, r.Types())
	}
	return f, nil
}

// settings is what the factory of sc gets from r: SettingsFor, with the
// registry's host.
func (r *Registry) settings(sc config.Sink, logger *slog.Logger) Settings {
	s := SettingsFor(sc, logger)
	s.Host = r.host
	return s
}

// SettingsFor returns the Settings of the sink sc configures (sc as the
// config loader decoded it), without a host: what a test or a tool that
// builds one sink on its own hands its factory. A nil logger discards.
func SettingsFor(sc config.Sink, logger *slog.Logger) Settings {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	inFlight, _ := sc.InFlight()
	return Settings{Name: sc.Name, Config: sc.Spec, Logger: logger,
		InFlight: inFlight, MaxRetryInterval: sc.Retry.MaxInterval.D(), Digest: sc.Digest}
}

// The classes an exec plugin answers with too live in package outcome,
// which needs nothing but the standard library; they are the same here.

// Permanent marks err as not worth retrying because of the event itself
// (outcome.Permanent: the dead-letter; a batch refused so is split until
// the culprit is alone).
func Permanent(err error) error { return outcome.Permanent(err) }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return outcome.IsPermanent(err) }

// Throttle marks err as retryable no sooner than after d: the destination
// asked for a pause (an HTTP Retry-After, an exec plugin's retryAfter).
func Throttle(err error, d time.Duration) error { return outcome.Throttle(err, d) }

// ThrottleDelay is the pause a Throttle error asks for, 0 if none.
func ThrottleDelay(err error) time.Duration { return outcome.ThrottleDelay(err) }

// unavailableError marks a failure of the destination as a whole: it is
// down, overloaded or unreachable (connection refused, a timeout, 503).
type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }
func (e unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as the destination's failure, not the events':
// nothing sent now would be taken. The delivery retries with backoff,
// lowers its concurrency (back-pressure) and, until an attempt succeeds
// again, probes the destination with one send at a time instead of
// parking every object it holds. Network errors (net.Error) and Throttle
// count as Unavailable without being marked.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

// IsUnavailable reports whether err was marked with Unavailable.
func IsUnavailable(err error) bool {
	var u unavailableError
	return errors.As(err, &u)
}

// destinationError marks a refusal that says the destination or the
// sink's config is wrong (a bad URL, an expired credential), not the event.
type destinationError struct {
	reason string
	err    error
}

func (e destinationError) Error() string { return e.err.Error() }
func (e destinationError) Unwrap() error { return e.err }

// Destination reasons, the values of the reason label of
// kubebridge_sink_destination_errors_total.
const (
	ReasonUnauthorized = "unauthorized" // HTTP 401, NATS authorization violation
	ReasonForbidden    = "forbidden"    // HTTP 403, NATS permissions violation
	ReasonNotFound     = "not_found"    // HTTP 404 (an ingress while the receiver redeploys), no stream
	ReasonGone         = "gone"         // HTTP 410
	ReasonRedirect     = "redirect"     // HTTP 3xx (never followed)
	ReasonConfig       = "config"       // anything else about the sink's settings
)

// Destination marks err as retryable because the destination or its config
// is at fault (reason says which, see the Reason constants): retrying the
// same payload will succeed once the config, credential or route is fixed
// (a reload, a rotated credential file). Such events are never dead-lettered
// and never recorded as delivered; the delivery counts and logs the reason
// and probes the destination with one send at a time until it takes one.
func Destination(reason string, err error) error {
	if err == nil {
		return nil
	}
	return destinationError{reason, err}
}

// DestinationReason returns the reason err was marked with by Destination.
func DestinationReason(err error) (string, bool) {
	var d destinationError
	if errors.As(err, &d) {
		return d.reason, true
	}
	return "", false
}

// IsThrottle reports whether err was marked with Throttle.
func IsThrottle(err error) bool { return outcome.IsThrottle(err) }

// EventErrors is what Send returns when the events of one batch fared
// differently: Errs[i] is the outcome of events[i] (nil: acknowledged by
// the destination). The delivery loop acknowledges the nil ones, hands the
// Permanent ones to the dead-letter, and retries the rest, in order. A sink
// that publishes events one by one returns it so that one bad event (too
// large, refused) never takes its neighbours down with it.
//
// Order per object: once an object's event (event.Key) fails retryably, the
// sink must not let the destination take that object's later events of the
// batch: it does not send them (or, publishing asynchronously, never has
// two events of one object in flight) and reports them failed too.
type EventErrors struct{ Errs []error }

func (e *EventErrors) Error() string {
	failed, permanent := 0, 0
	var first error
	for _, err := range e.Errs {
		if err != nil {
			failed++
			if IsPermanent(err) {
				permanent++
			}
			if first == nil {
				first = err
			}
		}
	}
	if first == nil {
		return "no event failed"
	}
	return fmt.Sprintf("%d of %d events failed (%d permanently), first: %v", failed, len(e.Errs), permanent, first)
}

// Unwrap returns the per-event errors (so errors.As finds a Throttle).
func (e *EventErrors) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// Outcome reduces the per-event errors of a batch (errs[i] for events[i])
// to Send's result: nil when every event was acknowledged, the first error
// when all are to be retried alike (or there is one event), *EventErrors
// otherwise.
func Outcome(errs []error) error {
	acked, permanent := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			acked++
		case IsPermanent(err):
			permanent++
		}
	}
	switch {
	case acked == len(errs):
		return nil
	case len(errs) == 1 || (acked == 0 && permanent == 0):
		return errs[0]
	}
	return &EventErrors{Errs: errs}
}

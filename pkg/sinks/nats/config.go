package nats

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// DefaultSubject lays subjects out so that wildcards select by cluster,
// group, resource, namespace, name and type (docs/sinks.md, "NATS subjects").
const DefaultSubject = "k8s.{cluster}.{group}.{resource}.{namespace}.{name}.{type}"

var streamName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// Config is the nats sink's type block: it publishes each event to a subject built from a template.
type Config struct {
	// URL is one server URL or a comma-separated list (nats://, tls://, ws://, wss://). Required unless embedded.
	URL string `yaml:"url"`
	// Embedded runs a nats-server inside the bridge (dev and single-node setups); url is then optional.
	Embedded bool `yaml:"embedded"`
	// CredentialsFile is a NATS .creds file (JWT and nkey seed).
	CredentialsFile string `yaml:"credentialsFile"`
	// NKeySeedFile is a file holding an nkey seed.
	NKeySeedFile string `yaml:"nkeySeedFile"`
	// TokenFile is a file holding an auth token.
	TokenFile string `yaml:"tokenFile"`
	// User is the user name for user/password auth; the password comes from passwordFile.
	User string `yaml:"user"`
	// PasswordFile is a file holding the password for user.
	PasswordFile string `yaml:"passwordFile"`
	// TLS configures the client's TLS.
	TLS *config.TLS `yaml:"tls"`
	// Subject is the subject template; placeholders {cluster} {group} {version} {resource} {kind} {namespace} {name} {type} {rule}. Default k8s.{cluster}.{group}.{resource}.{namespace}.{name}.{type}.
	Subject string `yaml:"subject"`
	// JetStream publishes with acknowledgement and Nats-Msg-Id = event id, so the stream dedupes replays. Default false: core publish, acknowledged by flush.
	JetStream bool `yaml:"jetstream"`
	// MaxPending is, with jetstream, the most published events awaiting their PubAck at once, across the sink's concurrent batches (an object never has two events in flight). Default 256, one full batch: a batch goes out in one go, and what the client holds for acknowledgement (and re-sends after a failure) stays bounded however many batches run at once.
	MaxPending int `yaml:"maxPending"`
	// Fence, with jetstream, makes every publish carry the sequence of the object's last message as an expectation the stream enforces (Nats-Expected-Last-Subject-Sequence over the object's subjects), so a replica that gave an object up can never store a message after its successor's (docs/sharding.md, "Fencing"). It needs a subject template with {name} and with {type} and {rule}, if used, as whole tokens; otherwise the sink is not fenced. Default true; false only for a stream that rewrites subjects (subject transforms), where the expectation cannot be checked.
	Fence bool `yaml:"fence"`
	// Stream, when set, is created or updated at start (dev and single-node setups); in production streams are usually managed elsewhere.
	Stream *Stream `yaml:"stream"`
	// Mirror, when set, makes the sink keep each rule's view in a JetStream KV bucket instead of publishing changes to subjects: one key per object in the view (namespace.name), its latest event as the value, deleted when the object leaves the view; consumers list and watch it (docs/mirror.md). It implies jetstream; subject, stream and fence do not apply.
	Mirror *Mirror `yaml:"mirror"`
}

// Mirror is the KV bucket per rule a mirroring nats sink keeps.
type Mirror struct {
	// Bucket names each rule's bucket: a template with {rule}, which it must contain (one bucket per rule); the result must be letters, digits, _ and -, at most 240. Default kubebridge-{rule}.
	Bucket string `yaml:"bucket"`
	// Replicas of each bucket (1 to 5; 3 on a NATS cluster keeps the mirror through a server's loss). Default 1.
	Replicas int `yaml:"replicas"`
	// Storage is file or memory. Default file.
	Storage string `yaml:"storage"`
	// MarkerRetention is how long the marker a deleted object leaves in the bucket is kept before it is compacted away: a consumer that resumes a watch from further back lists again (410 Gone). Default 1h; at least 1m.
	MarkerRetention config.Duration `yaml:"markerRetention"`
}

// DefaultMirrorBucket is the default bucket template of a mirror.
const DefaultMirrorBucket = "kubebridge-{rule}"

// maxBucketLen bounds a rendered bucket name: its stream, KV_<bucket>,
// must stay within the server's 255 bytes, with room.
const maxBucketLen = 240

// SetDefaults names a bucket per rule, on file, kept for an hour of markers.
func (m *Mirror) SetDefaults() {
	m.Bucket = DefaultMirrorBucket
	m.Replicas = 1
	m.Storage = "file"
	m.MarkerRetention = config.Duration(time.Hour)
}

// Validate checks the bucket template, replicas, storage and retention.
func (m *Mirror) Validate() error {
	var errs []error
	switch {
	case !strings.Contains(m.Bucket, "{rule}"):
		errs = append(errs, config.ErrorAt("bucket", "must contain {rule}: each rule's view is a bucket of its own"))
	case !streamName.MatchString(strings.ReplaceAll(m.Bucket, "{rule}", "r")):
		errs = append(errs, config.ErrorAt("bucket", "%q: a bucket name takes letters, digits, _ and - besides {rule}", m.Bucket))
	}
	if m.Replicas < 1 || m.Replicas > 5 {
		errs = append(errs, config.ErrorAt("replicas", "must be between 1 and 5, got %d", m.Replicas))
	}
	if m.Storage != "file" && m.Storage != "memory" {
		errs = append(errs, config.ErrorAt("storage", "must be file or memory, got %q", m.Storage))
	}
	if m.MarkerRetention.D() < time.Minute {
		errs = append(errs, config.ErrorAt("markerRetention", "must be at least 1m, got %s", m.MarkerRetention))
	}
	return errors.Join(errs...)
}

// BucketOf is the bucket of rule.
func (m *Mirror) BucketOf(rule string) string { return strings.ReplaceAll(m.Bucket, "{rule}", rule) }

// CheckRule checks that rule's bucket is a valid bucket name
// (config.RuleChecker).
func (n *Config) CheckRule(r *config.Rule) error {
	if n.Mirror == nil {
		return nil
	}
	b := n.Mirror.BucketOf(r.Name)
	switch {
	case !streamName.MatchString(b):
		return fmt.Errorf("its mirror bucket would be %q, not a bucket name (letters, digits, _ and -): rename the rule or set mirror.bucket", b)
	case len(b) > maxBucketLen:
		return fmt.Errorf("its mirror bucket name would be %d bytes, over %d: shorten the rule's name", len(b), maxBucketLen)
	case len(r.Events) > 0 && !(slices.Contains(r.Events, "added") && slices.Contains(r.Events, "updated") && slices.Contains(r.Events, "deleted")):
		return fmt.Errorf("a mirror holds the rule's view, which takes every change: the rule's events %v leave some out (drop events, or deliver those to another sink)", r.Events)
	case len(r.Changed) > 0:
		return errors.New("a mirror holds each object's latest state, which changed would leave stale: drop changed, or deliver it to another sink")
	case len(r.Include) > 0 && !slices.Contains(r.Include, "object") && !slices.Contains(r.Include, "metadata"):
		return fmt.Errorf("a mirror's values are objects: the rule's include %v has neither object nor metadata", r.Include)
	}
	return nil
}

// Stream is a JetStream stream the bridge creates or updates at start.
type Stream struct {
	// Name of the stream. Required.
	Name string `yaml:"name"`
	// Subjects the stream captures. Default: the subject template up to its first placeholder, then ">" (e.g. k8s.>).
	Subjects []string `yaml:"subjects"`
	// Storage is file or memory. Default file.
	Storage string `yaml:"storage"`
	// MaxAge drops messages older than this. Default 0: kept until other limits apply.
	MaxAge config.Duration `yaml:"maxAge"`
	// DuplicateWindow is how long JetStream remembers event ids to drop replays. Default 2m (the server's default).
	DuplicateWindow config.Duration `yaml:"duplicateWindow"`
}

// DefaultMaxPending is the default window of JetStream publishes awaiting
// their PubAck: sinks.MaxBatch, so one batch is published in one go.
const DefaultMaxPending = 256

// maxMaxPending bounds the window: each pending event is held in memory.
const maxMaxPending = 65536

// SetDefaults sets the subject layout of docs/sinks.md and the JetStream window.
func (n *Config) SetDefaults() {
	n.Subject = DefaultSubject
	n.MaxPending = DefaultMaxPending
	n.Fence = true
}

// fenced says whether the sink's publishes are fenced at the stream
// (fence.go): JetStream, fence on, and a template whose objects the
// stream can tell apart (subjectTemplate.fenceable).
func (n *Config) fenced() bool {
	if n.Mirror != nil {
		return true // every write expects the key's last revision (mirror.go)
	}
	if !n.JetStream || !n.Fence {
		return false
	}
	t, err := parseTemplate(n.Subject)
	return err == nil && t.fenceable()
}

// SetDefaults keeps stored events on disk and dedupes replays for 2 minutes.
func (st *Stream) SetDefaults() {
	st.Storage = "file"
	st.DuplicateWindow = config.Duration(2 * time.Minute)
}

// jetStream says whether the sink writes through JetStream: with
// jetstream, or to a mirror's buckets.
func (n *Config) jetStream() bool { return n.JetStream || n.Mirror != nil }

// CanHoldKV says whether the checkpoint's KV bucket may live behind this
// sink's connection (KV is a JetStream feature).
func (n *Config) CanHoldKV() error {
	if !n.JetStream && !n.Embedded && n.Mirror == nil {
		return errors.New("must have jetstream: true (KV is a JetStream feature)")
	}
	return nil
}

// Validate checks the stream settings.
func (st *Stream) Validate() error {
	var errs []error
	if !streamName.MatchString(st.Name) {
		errs = append(errs, config.ErrorAt("name", "%q is not a valid stream name (letters, digits, _ and -)", st.Name))
	}
	if st.Storage != "file" && st.Storage != "memory" {
		errs = append(errs, config.ErrorAt("storage", "must be file or memory, got %q", st.Storage))
	}
	if st.MaxAge < 0 {
		errs = append(errs, config.ErrorAt("maxAge", "must not be negative, got %s", st.MaxAge))
	}
	if st.DuplicateWindow < 0 {
		errs = append(errs, config.ErrorAt("duplicateWindow", "must not be negative, got %s", st.DuplicateWindow))
	}
	return errors.Join(errs...)
}

var natsSchemes = []string{"nats", "tls", "ws", "wss"}

// Validate checks the server URLs, the auth method and the subject template.
func (n *Config) Validate() error {
	var errs []error
	switch {
	case n.URL == "" && !n.Embedded:
		errs = append(errs, config.ErrorAt("url", "required unless embedded: true"))
	case n.URL != "":
		for _, raw := range strings.Split(n.URL, ",") {
			u, err := config.ParseURL(strings.TrimSpace(raw)) // its error quotes none of the URL
			switch {
			case err != nil:
				errs = append(errs, config.ErrorAt("url", "%v", err))
			case !slices.Contains(natsSchemes, u.Scheme):
				errs = append(errs, config.ErrorAt("url", "URL %q: scheme must be nats, tls, ws or wss", config.RedactURL(raw)))
			case u.Host == "":
				errs = append(errs, config.ErrorAt("url", "URL %q has no host", config.RedactURL(raw)))
			case u.User != nil:
				errs = append(errs, config.WarningAt("url", "URL %q carries credentials; use user/passwordFile, tokenFile or credentialsFile so they stay out of the config", config.RedactURL(raw)))
			}
		}
	}
	var auth []string
	for name, set := range map[string]bool{"credentialsFile": n.CredentialsFile != "", "nkeySeedFile": n.NKeySeedFile != "", "tokenFile": n.TokenFile != "", "user": n.User != ""} {
		if set {
			auth = append(auth, name)
		}
	}
	slices.Sort(auth)
	if len(auth) > 1 {
		errs = append(errs, config.ErrorAt("", "sets %s; choose one auth method", strings.Join(auth, " and ")))
	}
	if n.User != "" && n.PasswordFile == "" {
		errs = append(errs, config.ErrorAt("passwordFile", "required with user"))
	}
	if n.PasswordFile != "" && n.User == "" {
		errs = append(errs, config.ErrorAt("user", "required with passwordFile"))
	}
	if n.Embedded && n.URL != "" && n.TokenFile == "" && n.User == "" {
		if u, err := url.Parse(strings.TrimSpace(strings.Split(n.URL, ",")[0])); err == nil {
			if host := u.Hostname(); host != "" && !loopback(host) {
				errs = append(errs, config.ErrorAt("url", "the embedded server would listen on %s, beyond this machine: set tokenFile or user/passwordFile, which it then requires of every client", host))
			}
		}
	}
	if n.Embedded && (n.CredentialsFile != "" || n.NKeySeedFile != "") {
		errs = append(errs, config.ErrorAt("", "an embedded server takes tokenFile or user/passwordFile; credentialsFile and nkeySeedFile need an operator setup it does not have"))
	}
	if err := ParseSubject(n.Subject); err != nil {
		errs = append(errs, config.ErrorAt("subject", "%v", err))
	}
	switch {
	case !n.jetStream() && n.MaxPending != DefaultMaxPending:
		// A window of PubAcks: a core publish has none (a flush acknowledges it).
		errs = append(errs, config.WarningAt("maxPending", "has no effect without jetstream: true"))
	case n.jetStream() && (n.MaxPending < 1 || n.MaxPending > maxMaxPending):
		errs = append(errs, config.ErrorAt("maxPending", "must be between 1 and %d, got %d", maxMaxPending, n.MaxPending))
	}
	if n.Stream != nil && !n.JetStream && n.Mirror == nil {
		errs = append(errs, config.ErrorAt("stream", "needs jetstream: true"))
	}
	if n.Mirror != nil {
		if n.Stream != nil {
			errs = append(errs, config.ErrorAt("stream", "does not apply with mirror: the mirror keeps its buckets, one per rule"))
		}
		if n.Subject != DefaultSubject {
			errs = append(errs, config.WarningAt("subject", "has no effect with mirror: objects are keys of the rule's bucket"))
		}
	}
	return errors.Join(errs...)
}

// subjectPlaceholders are what a NATS subject template may contain.
var subjectPlaceholders = map[string]bool{
	"cluster": true, "group": true, "version": true, "resource": true, "kind": true,
	"namespace": true, "name": true, "type": true, "rule": true,
}

// ParseSubject checks a NATS subject template: dot-separated tokens, each
// literal text and {placeholder}s; no empty tokens, no wildcards, no spaces.
func ParseSubject(tmpl string) error {
	if tmpl == "" {
		return fmt.Errorf("empty subject")
	}
	for i, tok := range strings.Split(tmpl, ".") {
		if tok == "" {
			return fmt.Errorf("token %d is empty", i+1)
		}
		rest := tok
		for rest != "" {
			open := strings.IndexByte(rest, '{')
			lit := rest
			if open >= 0 {
				lit = rest[:open]
			}
			if j := strings.IndexFunc(lit, func(r rune) bool { return r < 0x21 || r == 0x7f || strings.ContainsRune("*>}", r) }); j >= 0 {
				return fmt.Errorf("token %q has %q; subjects take no wildcards, spaces or stray braces", tok, lit[j])
			}
			if open < 0 {
				break
			}
			end := strings.IndexByte(rest[open:], '}')
			if end < 0 {
				return fmt.Errorf("token %q: unclosed {", tok)
			}
			name := rest[open+1 : open+end]
			if !subjectPlaceholders[name] {
				return fmt.Errorf("unknown placeholder {%s} (have: {cluster} {group} {version} {resource} {kind} {namespace} {name} {type} {rule})", name)
			}
			rest = rest[open+end+1:]
		}
	}
	return nil
}

// Connection returns what a connection is made of (servers, auth, TLS),
// without what a sink publishes: configs with equal Connections can share
// one connection.
func (n *Config) Connection() Config {
	return Config{URL: n.URL, CredentialsFile: n.CredentialsFile, NKeySeedFile: n.NKeySeedFile,
		TokenFile: n.TokenFile, User: n.User, PasswordFile: n.PasswordFile, TLS: n.TLS}
}

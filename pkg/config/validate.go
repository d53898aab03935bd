package config

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubebridge/kubebridge/pkg/fieldpath"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// Limits that keep a config from asking for something absurd.
const (
	maxQueueCapacity  = 10_000_000
	minReplayEvery    = time.Second    // client-go's minimum resync period
	maxUpdateWindow   = 24 * time.Hour // an object's updates held longer are a view no one can trust
	maxWhereExprBytes = 10_000
	maxConcurrency    = 256
	maxSinks          = 100
	maxRules          = 1000
	maxNamespaces     = 1000
)

var kvBucketName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// Validate checks the document as a whole and the references between its
// parts. Each part's own fields are checked by its Validate.
func (c *Config) Validate() error {
	var errs []error
	if c.APIVersion != APIVersion {
		errs = append(errs, ErrorAt("apiVersion", "must be %q, got %q", APIVersion, c.APIVersion))
	}
	if c.Kind != Kind {
		errs = append(errs, ErrorAt("kind", "must be %q, got %q", Kind, c.Kind))
	}
	switch {
	case c.Cluster == "":
		errs = append(errs, ErrorAt("cluster", "required: the name stamped on every event (e.g. prod-eu-1)"))
	default:
		errs = append(errs, dns1123Label("cluster", c.Cluster))
	}
	if len(c.Sinks) == 0 {
		errs = append(errs, ErrorAt("sinks", "at least one sink is required"))
	} else if len(c.Sinks) > maxSinks {
		errs = append(errs, ErrorAt("sinks", "%d sinks, more than %d", len(c.Sinks), maxSinks))
	}
	if len(c.Rules) == 0 {
		errs = append(errs, ErrorAt("rules", "at least one rule is required"))
	} else if len(c.Rules) > maxRules {
		errs = append(errs, ErrorAt("rules", "%d rules, more than %d (each is checked against the cluster at every start and reload)", len(c.Rules), maxRules))
	}

	sinkIndex := map[string]int{}
	var sinkNames []string
	for i, s := range c.Sinks {
		if s.Name == "" {
			continue
		}
		if first, dup := sinkIndex[s.Name]; dup {
			errs = append(errs, ErrorAt(fmt.Sprintf("sinks[%d].name", i), "duplicate sink name %q (first at sinks[%d])", s.Name, first))
			continue
		}
		sinkIndex[s.Name] = i
		sinkNames = append(sinkNames, s.Name)
	}
	have := "have: " + listSome(sinkNames)
	if len(sinkNames) == 0 {
		have = "no sinks are defined"
	}

	used := map[string]bool{}
	ruleIndex := map[string]int{}
	for i, r := range c.Rules {
		if r.Name != "" {
			if first, dup := ruleIndex[r.Name]; dup {
				errs = append(errs, ErrorAt(fmt.Sprintf("rules[%d].name", i), "duplicate rule name %q (first at rules[%d])", r.Name, first))
			} else {
				ruleIndex[r.Name] = i
			}
		}
		for j, name := range r.Sinks {
			if name == "" {
				continue // reported by Rule.Validate
			}
			if _, ok := sinkIndex[name]; !ok {
				errs = append(errs, ErrorAt(fmt.Sprintf("rules[%d].sinks[%d]", i, j), "unknown sink %q (%s)", name, have))
			}
			used[name] = true
		}
	}
	for name, i := range sinkIndex {
		if !used[name] {
			errs = append(errs, WarningAt(fmt.Sprintf("sinks[%d]", i), "sink %q is not used by any rule", name))
		}
	}

	if c.Sharding != nil && c.Checkpoint.NATSKV == nil {
		errs = append(errs, ErrorAt("sharding", "needs checkpoint.natsKV: a shard's acknowledged views must be readable by whichever replica owns the shard next, and a file is one replica's"))
	}

	for _, ref := range c.SinkRefs() { // their types: validateProviders
		if _, ok := sinkIndex[ref.Sink]; !ok && ref.Sink != "" {
			errs = append(errs, ErrorAt(ref.Path+".sink", "unknown sink %q (%s)", ref.Sink, have))
		}
	}
	for i, s := range c.Sinks {
		w, ok := s.Spec.(replayWaiter)
		if !ok {
			continue
		}
		key, wait := w.WaitsForReplay()
		at := fmt.Sprintf("sinks[%d].%s.%s", i, s.Type, key)
		switch {
		case key == "":
		case s.ReplayEvery == 0:
			errs = append(errs, ErrorAt(at, "waits for a timer, which is the sink's replay: set replayEvery (shorter than the wait, e.g. 1m), or the wait ends only at the object's next change"))
		case s.ReplayEvery.D() > wait:
			errs = append(errs, WarningAt(at, "waits %s, but the sink's replay, which ends the wait, comes every %s: it may fire up to %s late", wait, s.ReplayEvery.D(), s.ReplayEvery.D()))
		}
	}
	for i, s := range c.Sinks {
		if d, ok := s.Spec.(digester); s.Digest != nil && (!ok || !d.RendersDigests()) {
			errs = append(errs, ErrorAt(fmt.Sprintf("sinks[%d].digest", i), "this %s sink cannot render a digest: use a webhook with preset slack, teams or generic, or with request.digest (the digest's body)", s.Type))
		}
	}
	for i, s := range c.Sinks {
		if s.UpdateWindow.Key == "" {
			continue
		}
		if m, ok := s.Spec.(messenger); !ok || !m.SendsMessages() {
			errs = append(errs, ErrorAt(fmt.Sprintf("sinks[%d].updateWindow.key", i), "a window per key coalesces different objects into one message: only for a sink that sends messages for people (a webhook with request or preset, not an alert's); this %s sink's consumer, applying events (or alerts) per object, would miss the objects coalesced away (use updateWindow: <duration>, per object)", s.Type))
		}
	}
	for i, s := range c.Sinks {
		if a, ok := s.Spec.(alerter); ok && s.Mute != nil && a.PostsAlerts() {
			errs = append(errs, ErrorAt(fmt.Sprintf("sinks[%d].mute", i), "this %s sink posts alerts, which its replay keeps firing: muted, they would expire in the window (resolved at night) and fire again when it ends; silence them where they are routed instead (an Alertmanager silence or a route's mute_time_intervals)", s.Type))
		}
	}
	errs = append(errs, c.validateSinkRelated()...)
	errs = append(errs, c.validateAlertLifetimes()...)
	errs = append(errs, c.validateRuleTargets()...)
	return errors.Join(errs...)
}

// RuleChecker is implemented by the config of a sink type that names
// something after each rule it delivers (a KV bucket, a Kafka topic):
// CheckRule says whether rule can be delivered by this sink, an error
// naming what the rule's name makes invalid.
type RuleChecker interface {
	CheckRule(rule *Rule) error
}

// validateRuleTargets asks each sink that names things after its rules
// (RuleChecker) about every rule that delivers to it, at the rule's entry
// in its sinks list.
func (c *Config) validateRuleTargets() []error {
	var errs []error
	for i := range c.Rules {
		r := &c.Rules[i]
		for j, name := range r.Sinks {
			k := slices.IndexFunc(c.Sinks, func(s Sink) bool { return s.Name == name })
			if k < 0 {
				continue
			}
			rc, ok := c.Sinks[k].Spec.(RuleChecker)
			if !ok {
				continue
			}
			if err := rc.CheckRule(r); err != nil {
				errs = append(errs, ErrorAt(fmt.Sprintf("rules[%d].sinks[%d]", i, j), "sink %q: %v", name, err))
			}
		}
	}
	return errs
}

// validateProviders checks that each sink the config names for what its
// type provides (SinkRefs: a dead-letter's, the checkpoint's) is of a type
// that provides it, which types (the registry) says, and that a sink named
// for the checkpoint can hold it (kvHolder). Unknown sinks are Validate's.
func (c *Config) validateProviders(types SinkTypes) error {
	if types == nil {
		return nil
	}
	var errs []error
	for _, ref := range c.SinkRefs() {
		i := slices.IndexFunc(c.Sinks, func(s Sink) bool { return s.Name == ref.Sink })
		if ref.Sink == "" || i < 0 || c.Sinks[i].Type == "" {
			continue
		}
		p := ref.Path + ".sink"
		if !types.Provides(c.Sinks[i].Type, ref.Needs) {
			errs = append(errs, ErrorAt(p, "%s", NotProvided(types, ref.Sink, ref.Needs)))
			continue
		}
		if h, ok := c.Sinks[i].Spec.(kvHolder); ok && ref.Needs == CheckpointKV {
			if err := h.CanHoldKV(); err != nil {
				errs = append(errs, ErrorAt(p, "sink %q %v", ref.Sink, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Validate checks the annotation keys.
func (r *Redaction) Validate() error {
	var errs []error
	for i, k := range r.SecretAnnotations {
		if k == "*" {
			continue
		}
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, ErrorAt(fmt.Sprintf("secretAnnotations[%d]", i), "%q is not an annotation key (or \"*\" for all): %s", k, msgs[0]))
		}
	}
	return errors.Join(errs...)
}

// replayWaiter is implemented by the config of a sink type that can wait
// for time to pass (a request's for): the sink's replay re-asks it, so it
// needs replayEvery. WaitsForReplay returns the key that waits and how
// long, or "".
type replayWaiter interface {
	WaitsForReplay() (key string, wait time.Duration)
}

// messenger is implemented by the config of a sink type that may send
// messages for people (a rendered request) rather than events a consumer
// applies by uid: only such a sink may coalesce different objects into one
// message (updateWindow.key).
type messenger interface{ SendsMessages() bool }

// alerter is implemented by the config of a sink type that may fire and
// resolve an alert per object, kept firing by the sink's replay: such a
// sink is never muted (a mute would hold the replay, and the alerts
// expire), its alerts are silenced where they are routed.
type alerter interface{ PostsAlerts() bool }

// digester is implemented by the config of a sink type that can render a
// digest (a sink's digest) as one message per group.
type digester interface{ RendersDigests() bool }

// kvHolder is implemented by the config of a sink type that provides
// CheckpointKV when some of its sinks cannot hold the bucket (one whose
// destination lacks a key-value store, as it is configured).
type kvHolder interface{ CanHoldKV() error }

// maxShards bounds sharding.shards: each shard is a Lease every replica
// reads and its owner renews every retry period (internal/shards.MaxShards).
const maxShards = 256

// Validate checks the shard count and key.
func (s *Sharding) Validate() error {
	var errs []error
	if s.Shards < 1 || s.Shards > maxShards {
		errs = append(errs, ErrorAt("shards", "must be between 1 and %d, got %d", maxShards, s.Shards))
	}
	if s.Key != "uid" && s.Key != "namespace" {
		errs = append(errs, ErrorAt("key", "must be uid or namespace, got %q", s.Key))
	}
	return errors.Join(errs...)
}

// Validate checks that at most one store is chosen.
func (c *Checkpoint) Validate() error {
	if c.File != "" && c.NATSKV != nil {
		return ErrorAt("", "set either file or natsKV, not both")
	}
	return nil
}

// Validate checks the KV store settings.
func (k *NATSKVCheckpoint) Validate() error {
	var errs []error
	if k.Sink == "" {
		errs = append(errs, ErrorAt("sink", "required: the nats sink whose connection holds the bucket"))
	}
	if !kvBucketName.MatchString(k.Bucket) {
		errs = append(errs, ErrorAt("bucket", "%q is not a valid bucket name (letters, digits, _ and -)", k.Bucket))
	}
	return errors.Join(errs...)
}

// Validate checks the sink's name and delivery settings; its type block
// is checked by the type's own Validate, and a missing one by the decoder.
func (s *Sink) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, ErrorAt("name", "required"))
	} else {
		errs = append(errs, dns1123Label("name", s.Name))
	}
	if s.Workers < 0 || s.Workers > maxConcurrency {
		errs = append(errs, ErrorAt("workers", "must be between 1 and %d (or 0: adaptive concurrency), got %d", maxConcurrency, s.Workers))
	}
	if s.Workers > 0 && s.Concurrency != nil {
		errs = append(errs, ErrorAt("concurrency", "set either workers (a fixed number of batches in flight) or concurrency (adaptive), not both"))
	}
	errs = append(errs, s.UpdateWindow.validate()...)
	if s.Digest != nil && s.UpdateWindow.Every > 0 {
		errs = append(errs, ErrorAt("digest", "set either digest or updateWindow: a digest already sends each object at most once per period"))
	}
	if s.Digest != nil && s.RateLimit != nil {
		errs = append(errs, ErrorAt("digest", "set either digest or rateLimit: a digest is one request per group and period"))
	}
	if s.ReplayEvery < 0 || (s.ReplayEvery > 0 && s.ReplayEvery.D() < minReplayEvery) {
		errs = append(errs, ErrorAt("replayEvery", "must be 0 (never) or at least %s, got %s", minReplayEvery, s.ReplayEvery))
	}
	return errors.Join(errs...)
}

// maxWindowKeys bounds updateWindow.maxKeys: each key waiting holds its
// latest events.
const maxWindowKeys = 1_000_000

// validate checks the window, and its key: a CEL expression that yields a
// string (one whose type is only known when evaluated passes; a value
// that is not a string then sends the object under its own key).
func (w UpdateWindow) validate() []error {
	var errs []error
	if w.Every < 0 || w.Every.D() > maxUpdateWindow {
		errs = append(errs, ErrorAt("updateWindow", "must be between 0 (every update) and %s, got %s", maxUpdateWindow, w.Every))
	}
	if w.MaxKeys < 0 || w.MaxKeys > maxWindowKeys {
		errs = append(errs, ErrorAt("updateWindow.maxKeys", "must be between 1 and %d (0: %d), got %d", maxWindowKeys, DefaultWindowMaxKeys, w.MaxKeys))
	}
	switch {
	case w.Key == "" && w.MaxKeys != 0:
		errs = append(errs, ErrorAt("updateWindow.maxKeys", "bounds the keys of a window with key: set key, or leave maxKeys out"))
	case w.Key == "":
	case w.Every == 0:
		errs = append(errs, ErrorAt("updateWindow.key", "needs every: the window each key's messages are held to one in"))
	default:
		if _, cerrs := celsandbox.CompileKey(w.Key); len(cerrs) > 0 {
			for _, e := range cerrs {
				errs = append(errs, ErrorAt("updateWindow.key", "%v", e))
			}
		}
	}
	return errs
}

// Validate checks the rate and the burst.
func (r *RateLimit) Validate() error {
	var errs []error
	if !(r.EventsPerSecond > 0) || r.EventsPerSecond > 1e6 {
		errs = append(errs, ErrorAt("eventsPerSecond", "must be positive and at most 1000000, got %v", r.EventsPerSecond))
	}
	if r.Burst < 0 || r.Burst > 10_000 {
		errs = append(errs, ErrorAt("burst", "must be between 1 and 10000 (0: the rate rounded up), got %d", r.Burst))
	}
	return errors.Join(errs...)
}

// Validate checks the ceiling.
func (c *Concurrency) Validate() error {
	if c.Max < 1 || c.Max > maxConcurrency {
		return ErrorAt("max", "must be between 1 and %d, got %d", maxConcurrency, c.Max)
	}
	return nil
}

// maxDeadLetterSizeMB bounds a dead-letter file's maxSizeMB (1 TiB): in
// bytes it must fit an int64, or the size would wrap negative and every
// write rotate, leaving only the last few records.
const maxDeadLetterSizeMB = 1 << 20

// Validate checks that exactly one destination is set, and the rotation bounds.
func (d *DeadLetter) Validate() error {
	if (d.File == "") == (d.NATS == nil) {
		return ErrorAt("", "set exactly one of file and nats")
	}
	var errs []error
	if d.MaxSizeMB < 1 {
		errs = append(errs, ErrorAt("maxSizeMB", "must be at least 1, got %d", d.MaxSizeMB))
	} else if d.MaxSizeMB > maxDeadLetterSizeMB {
		errs = append(errs, ErrorAt("maxSizeMB", "must be at most %d (1 TiB), got %d", maxDeadLetterSizeMB, d.MaxSizeMB))
	}
	if d.MaxBackups < 0 {
		errs = append(errs, ErrorAt("maxBackups", "must not be negative, got %d", d.MaxBackups))
	} else if d.MaxBackups > MaxBackups {
		errs = append(errs, ErrorAt("maxBackups", "must be at most %d (each rotation renames every copy), got %d", MaxBackups, d.MaxBackups))
	}
	return errors.Join(errs...)
}

// Validate checks the subject; the sink reference is checked by Config.Validate.
func (d *DeadLetterNATS) Validate() error {
	var errs []error
	if d.Sink == "" {
		errs = append(errs, ErrorAt("sink", "required: the nats sink whose connection is used"))
	}
	if d.Subject == "" {
		errs = append(errs, ErrorAt("subject", "required"))
	} else if strings.ContainsAny(d.Subject, "*> \t") || strings.Contains(d.Subject, "..") || strings.HasPrefix(d.Subject, ".") || strings.HasSuffix(d.Subject, ".") {
		errs = append(errs, ErrorAt("subject", "%q is not a valid subject to publish to (no wildcards, spaces or empty tokens)", d.Subject))
	}
	return errors.Join(errs...)
}

// Validate checks the queue bound.
func (q *Queue) Validate() error {
	if q.Capacity < 1 || q.Capacity > maxQueueCapacity {
		return ErrorAt("capacity", "must be between 1 and %d, got %d", maxQueueCapacity, q.Capacity)
	}
	return nil
}

// Validate checks the backoff settings.
func (r *Retry) Validate() error {
	var errs []error
	if r.InitialInterval <= 0 {
		errs = append(errs, ErrorAt("initialInterval", "must be positive, got %s", r.InitialInterval))
	}
	if r.MaxInterval < r.InitialInterval {
		errs = append(errs, ErrorAt("maxInterval", "must be at least initialInterval (%s), got %s", r.InitialInterval, r.MaxInterval))
	}
	if r.MaxElapsed < 0 {
		errs = append(errs, ErrorAt("maxElapsed", "must be 0 (retry until acknowledged) or positive, got %s", r.MaxElapsed))
	}
	return errors.Join(errs...)
}

// UnparsableURL is what RedactURL shows for a URL that does not parse:
// its text may hold a token, so none of it is shown.
const UnparsableURL = "(unparsable URL)"

// RedactURL hides what may be a secret in a URL, for messages, logs and
// dead-letter records: the userinfo, the query, and path segments that
// look like tokens (Slack's and Discord's webhook URLs carry theirs in the
// path; see secretSegment). An unparsable URL is never echoed.
func RedactURL(raw string) string {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return UnparsableURL
	}
	if segs := strings.Split(u.EscapedPath(), "/"); anySecretSegment(segs) {
		for i := len(segs) - 1; i >= 0; i-- { // from the end: a Slack secret is told by the segments before it
			if secretSegment(segs, i) {
				segs[i] = "redacted"
			}
		}
		u.RawPath = strings.Join(segs, "/")
		u.Path, _ = url.PathUnescape(u.RawPath)
		if u.User == nil && u.RawQuery == "" && u.Fragment == "" {
			return u.String()
		}
	}
	if u.User == nil && u.RawQuery == "" && u.Fragment == "" {
		return raw
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	if u.RawQuery != "" {
		u.RawQuery = "redacted"
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// anySecretSegment reports whether any of the path segments looks like a secret.
func anySecretSegment(segs []string) bool {
	for i := range segs {
		if secretSegment(segs, i) {
			return true
		}
	}
	return false
}

// slackID matches the workspace (T…) and channel or app (B…) ids of a
// Slack-style incoming-webhook path.
var slackID = regexp.MustCompile(`^[TB][A-Z0-9]+$`)

// secretSegment reports whether segs[i] (escaped) looks like a secret: a
// token (tokenLike), or the last part of a Slack-style webhook path,
// /services/T…/B…/<secret>, whatever it looks like (Slack's are 24
// letters and digits, without a digit now and then; Slack-compatible
// receivers take any).
func secretSegment(segs []string, i int) bool {
	if tokenLike(segs[i]) {
		return true
	}
	return i >= 3 && segs[i] != "" && segs[i-3] == "services" && slackID.MatchString(segs[i-2]) && slackID.MatchString(segs[i-1])
}

// ErrUnparsableURL is what ParseURL's errors wrap.
var ErrUnparsableURL = errors.New("unparsable URL")

// quotedText matches a Go-quoted string in an error message.
var quotedText = regexp.MustCompile(`\s*"(?:[^"\\]|\\.)*"`)

// ParseURL is url.Parse with an error that shows none of raw. url.Parse's
// errors quote the whole URL, and the error they wrap (what errors.Unwrap
// gives) quotes the piece that failed: the port of
// https://host:<token>/, an escape. Either may be a secret. ParseURL's
// error says why without them ("unparsable URL: invalid port after host")
// and wraps only ErrUnparsableURL, so unwrapping it cannot reach the text.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err == nil {
		return u, nil
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		return nil, ErrUnparsableURL
	}
	why := strings.TrimPrefix(quotedText.ReplaceAllString(ue.Err.Error(), ""), "net/url: ")
	return nil, fmt.Errorf("%w: %s", ErrUnparsableURL, why)
}

// tokenLike says whether a path segment looks like a secret: 20 or more
// characters of letters and digits (and -_.~=), with both letters and
// digits, as generated tokens are and words and ids are not.
func tokenLike(seg string) bool {
	if len(seg) < 20 {
		return false
	}
	letters, digits := false, false
	for _, c := range seg {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letters = true
		case c >= '0' && c <= '9':
			digits = true
		case strings.ContainsRune("-_.~=%", c):
		default:
			return false
		}
	}
	return letters && digits
}

// Validate checks that a client certificate comes with its key.
func (t *TLS) Validate() error {
	var errs []error
	if (t.CertFile == "") != (t.KeyFile == "") {
		errs = append(errs, ErrorAt("", "certFile and keyFile go together"))
	}
	if t.InsecureSkipVerify {
		errs = append(errs, WarningAt("insecureSkipVerify", "server certificates are not verified; anyone on the path can read and alter events"))
	}
	return errors.Join(errs...)
}

// Validate checks the rule's resource, selectors, filters and sink list.
// Whether the sinks exist is checked by Config.Validate.
func (r *Rule) Validate() error {
	var errs []error
	if r.Name == "" {
		errs = append(errs, ErrorAt("name", "required"))
	} else {
		errs = append(errs, dns1123Label("name", r.Name))
	}
	var gvrResource string
	gvr, gvrErr := ParseResource(r.Resource)
	if r.Resource == "" {
		errs = append(errs, ErrorAt("resource", "required (group/version/resource, e.g. apps/v1/deployments, or v1/configmaps for the core group)"))
	} else if gvrErr != nil {
		errs = append(errs, ErrorAt("resource", "%v", gvrErr))
	} else {
		gvrResource = FormatResource(gvr)
	}

	if len(r.Namespaces) > maxNamespaces {
		errs = append(errs, ErrorAt("namespaces", "%d namespaces, more than %d (each is checked against the cluster at every start and reload); use namespaceSelector", len(r.Namespaces), maxNamespaces))
	}
	seenNS := map[string]int{}
	for i, ns := range r.Namespaces {
		p := fmt.Sprintf("namespaces[%d]", i)
		if first, dup := seenNS[ns]; dup {
			errs = append(errs, ErrorAt(p, "duplicate namespace %q (first at namespaces[%d])", ns, first))
			continue
		}
		seenNS[ns] = i
		errs = append(errs, dns1123Label(p, ns))
	}
	if r.NamespaceSelector != "" {
		if len(r.Namespaces) > 0 {
			errs = append(errs, ErrorAt("namespaceSelector", "set either namespaces or namespaceSelector, not both"))
		}
		if _, err := labels.Parse(r.NamespaceSelector); err != nil {
			errs = append(errs, ErrorAt("namespaceSelector", "%v", err))
		}
	}
	if r.LabelSelector != "" {
		if _, err := labels.Parse(r.LabelSelector); err != nil {
			errs = append(errs, ErrorAt("labelSelector", "%v", err))
		}
	}
	if r.FieldSelector != "" {
		if _, err := fields.ParseSelector(r.FieldSelector); err != nil {
			errs = append(errs, ErrorAt("fieldSelector", "%v", err))
		}
	}
	errs = append(errs, oneOfEach("events", r.Events, EventTypes)...)
	errs = append(errs, oneOfEach("include", r.Include, IncludeFields)...)
	if slices.Contains(r.Include, "metadata") && len(slices.DeleteFunc(slices.Clone(r.Include), func(s string) bool { return s == "owners" })) > 1 {
		errs = append(errs, ErrorAt("include", "metadata stands alone (or with owners): it is the object without spec, status or data"))
	}
	errs = append(errs, r.validateOwnerResources(gvr, gvrErr == nil)...)

	keys := make([]string, 0, len(r.Index))
	for k := range r.Index {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p := JoinKey("index", k)
		key, err := ParseIndexKey(k)
		if err != nil {
			errs = append(errs, ErrorAt(p, "%v", err))
			continue
		}
		if len(r.Index[k]) == 0 {
			errs = append(errs, ErrorAt(p, "needs at least one value"))
		}
		for i, v := range r.Index[k] {
			vp := fmt.Sprintf("%s[%d]", p, i)
			switch key.Kind {
			case IndexNamespace:
				errs = append(errs, dns1123Label(vp, v))
			case IndexLabel:
				if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
					errs = append(errs, ErrorAt(vp, "invalid label value %q: %s", v, msgs[0]))
				}
			case IndexOwner:
				if v == "" {
					errs = append(errs, ErrorAt(vp, "empty owner name"))
				}
			}
		}
	}

	if r.Where != "" {
		if len(r.Where) > maxWhereExprBytes {
			errs = append(errs, ErrorAt("where", "expression is %d bytes, more than %d", len(r.Where), maxWhereExprBytes))
		} else if ast, cerrs := celsandbox.CompileWhere(r.Where); len(cerrs) > 0 {
			for _, e := range cerrs {
				errs = append(errs, ErrorAt("where", "%v", e))
			}
		} else {
			errs = append(errs, validateRelated(r, "where", "the rule", gvr, gvrErr == nil, celsandbox.References(ast, celsandbox.CELOwners), celsandbox.References(ast, celsandbox.CELInvolved))...)
		}
	}

	seenPath := map[string]int{}
	for i, p := range r.Changed {
		path := fmt.Sprintf("changed[%d]", i)
		if first, dup := seenPath[p]; dup {
			errs = append(errs, ErrorAt(path, "duplicate path %q (first at changed[%d])", p, first))
			continue
		}
		seenPath[p] = i
		if _, err := fieldpath.Parse(p); err != nil {
			errs = append(errs, ErrorAt(path, "%v", err))
		}
	}
	if len(r.Changed) > 0 && !slices.Contains(r.Events, "updated") {
		errs = append(errs, WarningAt("changed", "has no effect: events does not include updated"))
	}

	if len(r.Sinks) == 0 {
		errs = append(errs, ErrorAt("sinks", "at least one sink is required"))
	}
	seenSink := map[string]int{}
	for i, s := range r.Sinks {
		p := fmt.Sprintf("sinks[%d]", i)
		if s == "" {
			errs = append(errs, ErrorAt(p, "empty sink name"))
			continue
		}
		if first, dup := seenSink[s]; dup {
			errs = append(errs, ErrorAt(p, "sink %q listed twice (first at sinks[%d])", s, first))
		}
		seenSink[s] = i
	}
	errs = append(errs, r.validateRoute()...)
	if r.AllowSecretData && gvrResource != "" && gvrResource != "v1/secrets" {
		errs = append(errs, WarningAt("allowSecretData", "has no effect on %s (only v1/secrets is redacted)", gvrResource))
	}
	return errors.Join(errs...)
}

// validateRoute checks the route's expression and that its default is one
// of the rule's sinks.
func (r *Rule) validateRoute() []error {
	if r.Route == nil {
		return nil
	}
	var errs []error
	switch {
	case r.Route.Sink == "":
		errs = append(errs, ErrorAt("route.sink", "required: a CEL expression giving one of the rule's sinks (e.g. \"'slack-' + namespaceLabels.team\")"))
	case len(r.Route.Sink) > maxWhereExprBytes:
		errs = append(errs, ErrorAt("route.sink", "expression is %d bytes, more than %d", len(r.Route.Sink), maxWhereExprBytes))
	default:
		if ast, cerrs := celsandbox.CompileRoute(r.Route.Sink); len(cerrs) > 0 {
			for _, e := range cerrs {
				errs = append(errs, ErrorAt("route.sink", "%v", e))
			}
		} else {
			gvr, err := ParseResource(r.Resource)
			errs = append(errs, validateRelated(r, "route.sink", "the rule", gvr, err == nil, celsandbox.References(ast, celsandbox.CELOwners), celsandbox.References(ast, celsandbox.CELInvolved))...)
		}
	}
	switch {
	case r.Route.Default == "":
		errs = append(errs, ErrorAt("route.default", "required: the sink of objects whose route names none of the rule's sinks (one of %s)", listSome(r.Sinks)))
	case !slices.Contains(r.Sinks, r.Route.Default):
		errs = append(errs, ErrorAt("route.default", "%q is not one of the rule's sinks (%s): a route chooses among them only", r.Route.Default, listSome(r.Sinks)))
	}
	if len(r.Sinks) == 1 {
		errs = append(errs, WarningAt("route", "has no effect: the rule has one sink"))
	}
	return errs
}

// ReadsNamespaceLabels reports whether the rule depends on its objects'
// namespaces' labels (namespaceSelector, a route reading namespaceLabels):
// the bridge then lists and watches namespaces.
func (r *Rule) ReadsNamespaceLabels() bool {
	if r.NamespaceSelector != "" {
		return true
	}
	if r.Route == nil {
		return false
	}
	ast, errs := celsandbox.CompileRoute(r.Route.Sink)
	return len(errs) == 0 && celsandbox.References(ast, celsandbox.CELNamespaceLabels)
}

// listSome joins names for a message, the first ten only: a message per
// wrong reference must not grow with the config (quadratic output).
func listSome(names []string) string {
	const shown = 10
	if len(names) <= shown {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, ... (%d in all)", strings.Join(names[:shown], ", "), len(names))
}

// oneOfEach checks a non-empty list whose items come from allowed, without duplicates.
func oneOfEach(field string, got, allowed []string) []error {
	if len(got) == 0 {
		return []error{ErrorAt(field, "must list at least one of %s", strings.Join(allowed, ", "))}
	}
	var errs []error
	seen := map[string]int{}
	for i, v := range got {
		p := fmt.Sprintf("%s[%d]", field, i)
		if first, dup := seen[v]; dup {
			errs = append(errs, ErrorAt(p, "%q listed twice (first at %s[%d])", v, field, first))
			continue
		}
		seen[v] = i
		if !slices.Contains(allowed, v) {
			errs = append(errs, ErrorAt(p, "unknown value %q (want one of %s)", v, strings.Join(allowed, ", ")))
		}
	}
	return errs
}

func dns1123Label(path, v string) error {
	if msgs := validation.IsDNS1123Label(v); len(msgs) > 0 {
		return ErrorAt(path, "invalid name %q: %s", v, msgs[0])
	}
	return nil
}

// IsKubernetesEvent reports whether gvr is Kubernetes' Event (core/v1 or
// events.k8s.io/v1): its objects name an involved object.
func IsKubernetesEvent(gvr schema.GroupVersionResource) bool {
	return gvr.Resource == "events" && (gvr.Group == "" && gvr.Version == "v1" || gvr.Group == "events.k8s.io")
}

// validateRelated checks that an expression (at key) reading owners or
// involved has them from rule r (named whose in the errors): include
// owners, and for involved a rule on Kubernetes Events.
func validateRelated(r *Rule, key, whose string, gvr schema.GroupVersionResource, known, readsOwners, readsInvolved bool) []error {
	var errs []error
	owners := slices.Contains(r.Include, "owners")
	if (readsOwners || readsInvolved) && !owners {
		v := "owners"
		if !readsOwners {
			v = "involved"
		}
		errs = append(errs, ErrorAt(key, "reads %s, which %s resolves only with include: [owners] (add owners to its include)", v, whose))
	}
	if readsInvolved && known && !IsKubernetesEvent(gvr) {
		errs = append(errs, ErrorAt(key, "reads involved, which only Kubernetes Events have (v1/events, events.k8s.io/v1/events), not %s of %s", FormatResource(gvr), whose))
	}
	return errs
}

// validateSinkRelated checks a sink's expressions that read owners or
// involved (updateWindow.key, mute.where) against every rule feeding the
// sink: each must resolve what they read, or its events would carry none
// (an evaluation error on each).
func (c *Config) validateSinkRelated() []error {
	var errs []error
	for i, s := range c.Sinks {
		type expr struct {
			key                    string
			readsOwners, readsInvo bool
		}
		var exprs []expr
		if s.UpdateWindow.Key != "" {
			if ast, cerrs := celsandbox.CompileKey(s.UpdateWindow.Key); len(cerrs) == 0 {
				exprs = append(exprs, expr{"updateWindow.key", celsandbox.References(ast, celsandbox.CELOwners), celsandbox.References(ast, celsandbox.CELInvolved)})
			}
		}
		if s.Mute != nil && s.Mute.Where != "" && len(s.Mute.Where) <= maxWhereExprBytes {
			if ast, cerrs := celsandbox.CompileWhere(s.Mute.Where); len(cerrs) == 0 {
				exprs = append(exprs, expr{"mute.where", celsandbox.References(ast, celsandbox.CELOwners), celsandbox.References(ast, celsandbox.CELInvolved)})
			}
		}
		for _, e := range exprs {
			if !e.readsOwners && !e.readsInvo {
				continue
			}
			for j := range c.Rules {
				r := &c.Rules[j]
				if s.Name == "" || !slices.Contains(r.Sinks, s.Name) {
					continue
				}
				gvr, err := ParseResource(r.Resource)
				errs = append(errs, validateRelated(r, fmt.Sprintf("sinks[%d].%s", i, e.key), fmt.Sprintf("rule %q", r.Name), gvr, err == nil, e.readsOwners, e.readsInvo)...)
			}
		}
	}
	return errs
}

// validateOwnerResources checks ownerResources: only with include owners,
// each a group/version/resource named once.
func (r *Rule) validateOwnerResources(gvr schema.GroupVersionResource, known bool) []error {
	var errs []error
	if len(r.OwnerResources) > 0 && !slices.Contains(r.Include, "owners") {
		errs = append(errs, ErrorAt("ownerResources", "has no effect without include: [owners]"))
	}
	if r.OwnerLabels != nil && !slices.Contains(r.Include, "owners") {
		errs = append(errs, ErrorAt("ownerLabels", "has no effect without include: [owners]"))
	}
	for i, k := range r.OwnerLabels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, ErrorAt(fmt.Sprintf("ownerLabels[%d]", i), "invalid label key %q: %s", k, msgs[0]))
		}
	}
	seen := map[string]int{}
	for i, res := range r.OwnerResources {
		p := fmt.Sprintf("ownerResources[%d]", i)
		if first, dup := seen[res]; dup {
			errs = append(errs, ErrorAt(p, "duplicate resource %q (first at ownerResources[%d])", res, first))
			continue
		}
		seen[res] = i
		ogvr, err := ParseResource(res)
		switch {
		case err != nil:
			errs = append(errs, ErrorAt(p, "%v", err))
		case ogvr.Group == "" && ogvr.Resource == "secrets":
			errs = append(errs, ErrorAt(p, "Secrets own nothing, and listing them reads their values: not an owner resource"))
		}
	}
	return errs
}

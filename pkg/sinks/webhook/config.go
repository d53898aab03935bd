package webhook

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// Defaults, named so that docs and code agree.
const (
	DefaultTimeout        = 5 * time.Second
	DefaultMode           = "binary"
	DefaultBatchMaxEvents = 100
	DefaultBatchMaxWait   = 50 * time.Millisecond
	maxBatchEvents        = 10_000
)

// Config is the webhook sink's type block: it POSTs CloudEvents to an HTTP(S) endpoint.
type Config struct {
	// URL is the http:// or https:// endpoint. Required.
	URL string `yaml:"url"`
	// Mode is binary (ce-* headers, body = data) or structured (the whole event as JSON). Default binary; batching always uses batch mode.
	Mode string `yaml:"mode"`
	// SigningSecretFile holds the HMAC-SHA256 key for the X-Kubebridge-Signature header. Default: no signature.
	SigningSecretFile string `yaml:"signingSecretFile"`
	// BearerTokenFile holds a token sent as Authorization: Bearer. Default: none.
	BearerTokenFile string `yaml:"bearerTokenFile"`
	// Headers are added to every request.
	Headers map[string]string `yaml:"headers"`
	// Timeout bounds one request. Default 5s.
	Timeout config.Duration `yaml:"timeout"`
	// Batch sends several events per request (CloudEvents batch mode). Default: one event per request.
	Batch *Batch `yaml:"batch"`
	// TLS configures the client's TLS.
	TLS *config.TLS `yaml:"tls"`
	// Request shapes each request with CEL instead of sending a CloudEvent (docs/actions.md). Default: CloudEvents.
	Request *Request `yaml:"request"`
	// CredentialFiles names files whose contents a request template may send, as credentials.<name>: an API key that goes in a body or a header (PagerDuty's routing_key, Opsgenie's GenieKey). Each must hold a one-line token (a PEM key or certificate, NATS credentials or a seed, a multi-line file, or a file the config uses as a key is refused), is read again when it changes, and is kept out of logs and dead-letters. Default: none.
	CredentialFiles map[string]string `yaml:"credentialFiles"`
	// Preset is a named request for a known receiver (slack, teams, pagerduty, opsgenie, github-dispatch, alertmanager, generic) whose fields request overrides one by one (docs/actions.md). Default: none.
	Preset string `yaml:"preset"`
}

// Batch bounds a batch of events sent in one request.
type Batch struct {
	// MaxEvents is the most events in one batch. Default 100.
	MaxEvents int `yaml:"maxEvents"`
	// MaxWait is how long a partial batch waits for more events. Default 50ms.
	MaxWait config.Duration `yaml:"maxWait"`
}

// SetDefaults sends one event per request in binary mode, 5 s per request.
func (w *Config) SetDefaults() {
	w.Mode = DefaultMode
	w.Timeout = config.Duration(DefaultTimeout)
}

// SetDefaults bounds a batch to 100 events or 50 ms.
func (b *Batch) SetDefaults() {
	b.MaxEvents = DefaultBatchMaxEvents
	b.MaxWait = config.Duration(DefaultBatchMaxWait)
}

// reservedHeaders are set by the webhook sink itself.
var reservedHeaders = []string{"content-type", "content-length", "authorization", "x-kubebridge-signature", "kubebridge-fence"}

// Validate checks the endpoint, mode, headers and timeout.
func (w *Config) Validate() error {
	var errs []error
	if w.URL == "" {
		errs = append(errs, config.ErrorAt("url", "required"))
	} else if u, err := config.ParseURL(w.URL); err != nil { // its error quotes none of the URL
		errs = append(errs, config.ErrorAt("url", "%v", err))
	} else if u.Scheme != "http" && u.Scheme != "https" {
		errs = append(errs, config.ErrorAt("url", "URL %q: scheme must be http or https", config.RedactURL(w.URL)))
	} else if u.Host == "" {
		errs = append(errs, config.ErrorAt("url", "URL %q has no host", config.RedactURL(w.URL)))
	} else if u.User != nil {
		errs = append(errs, config.WarningAt("url", "URL %q carries credentials; use bearerTokenFile (or headers from a mounted file) so they stay out of the config", config.RedactURL(w.URL)))
	}
	if w.Mode != "binary" && w.Mode != "structured" {
		errs = append(errs, config.ErrorAt("mode", "must be binary or structured, got %q", w.Mode))
	}
	names := make([]string, 0, len(w.Headers))
	for name := range w.Headers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		lower := strings.ToLower(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			errs = append(errs, config.ErrorAt(config.JoinKey("headers", name), "invalid header name"))
		case !httpguts.ValidHeaderFieldValue(w.Headers[name]):
			errs = append(errs, config.ErrorAt(config.JoinKey("headers", name), "invalid header value"))
		case strings.HasPrefix(lower, "ce-") || slices.Contains(reservedHeaders, lower):
			errs = append(errs, config.ErrorAt(config.JoinKey("headers", name), "is set by kubebridge and cannot be overridden"))
		}
	}
	if w.Timeout <= 0 {
		errs = append(errs, config.ErrorAt("timeout", "must be positive, got %s", w.Timeout))
	}
	if w.Request != nil && w.Batch != nil {
		errs = append(errs, config.ErrorAt("request", "a request shaped by CEL is one per event: it does not go with batch"))
	}
	if w.Preset != "" {
		if _, ok := Presets[w.Preset]; !ok {
			errs = append(errs, config.ErrorAt("preset", "unknown preset %q (have: %s)", w.Preset, strings.Join(PresetNames(), ", ")))
			return errors.Join(errs...)
		} else if w.Batch != nil {
			errs = append(errs, config.ErrorAt("preset", "a preset is one request per event: it does not go with batch"))
		}
	}
	return errors.Join(append(errs, w.validateRequestCredentials()...)...)
}

// request is the request the sink sends, its preset's fields under its
// own; nil for CloudEvents.
func (w *Config) request() *Request {
	switch {
	case w.Preset != "":
		r := withPreset(w.Preset, w.Request)
		return &r
	case w.Request != nil:
		return w.Request
	}
	return nil
}

// SendsMessages says whether each event is a request shaped by CEL (a
// request or a preset) for people: a message, which may stand for several
// objects (updateWindow.key), not a CloudEvent a consumer applies by uid,
// nor an alert fired and resolved per object (a resolve coalesced into
// another object's message would leave the alert firing).
func (w *Config) SendsMessages() bool {
	return w.request() != nil && !w.PostsAlerts()
}

// PostsAlerts says whether the sink fires and resolves an alert per
// object: an alert preset (alertmanager, pagerduty, opsgenie) or a request
// that posts to Alertmanager's alerts endpoint.
func (w *Config) PostsAlerts() bool {
	if w.request() == nil {
		return false
	}
	if alertPresets[w.Preset] {
		return true
	}
	_, _, posts := w.AlertLifetime()
	return posts
}

// RendersDigests says whether the request (or its preset) has a digest's
// body (request.digest).
func (w *Config) RendersDigests() bool {
	r := w.request()
	return r != nil && strings.TrimSpace(r.Digest) != ""
}

// alertPresets fire and resolve an alert per object.
var alertPresets = map[string]bool{"alertmanager": true, "pagerduty": true, "opsgenie": true}

// WaitsForReplay names the request's for and its duration, which the
// sink's replay ends (config.Validate requires replayEvery with it).
func (w *Config) WaitsForReplay() (string, time.Duration) {
	if r := w.request(); r != nil && r.For > 0 {
		if w.Request != nil && w.Request.For > 0 {
			return "request.for", r.For.D()
		}
		return "preset", r.For.D()
	}
	return "", 0
}

// validateRequestCredentials checks what the request (with its preset)
// and credentialFiles say of each other: every credentials.<name> a
// template reads is declared, every declared file is read by one, and an
// Authorization header is either bearerTokenFile's or the request's.
func (w *Config) validateRequestCredentials() []error {
	var errs []error
	names := sortedKeys(w.CredentialFiles)
	for _, name := range names {
		if !celIdent.MatchString(name) || slices.Contains(celReserved, name) {
			errs = append(errs, config.ErrorAt(config.JoinKey("credentialFiles", name), "a credential's name must be a CEL identifier (letters, digits, _; not a reserved word), as templates read it as credentials.%s", name))
		}
	}
	r := w.request()
	if r == nil {
		if len(names) > 0 {
			errs = append(errs, config.ErrorAt("credentialFiles", "only a request shaped by CEL (request or preset) reads credentialFiles"))
		}
		return errs
	}
	// Where a field came from: the sink's request, or its preset.
	at := func(field, name string) string {
		if w.Request != nil && w.Request.has(field, name) {
			return "request." + templateKey(field, name)
		}
		return "preset"
	}
	read := map[string]bool{}
	r.each(func(field, name, expr, want string) {
		t, es := celsandbox.CompileTemplate(expr, want)
		if es != nil {
			return // reported by Request.Validate, or a preset's own test
		}
		for _, c := range t.Credentials() {
			read[c] = true
			if _, ok := w.CredentialFiles[c]; !ok {
				errs = append(errs, config.ErrorAt(at(field, name), "reads credentials.%s, which credentialFiles does not declare (credentialFiles: {%s: /etc/kubebridge/...})", c, c))
			}
		}
		if field == "headers" && strings.EqualFold(name, "authorization") && w.BearerTokenFile != "" {
			errs = append(errs, config.ErrorAt(at(field, name), "the Authorization header is bearerTokenFile's: set one or the other"))
		}
	})
	for _, name := range names {
		if !read[name] && celIdent.MatchString(name) && !slices.Contains(celReserved, name) {
			errs = append(errs, config.ErrorAt(config.JoinKey("credentialFiles", name), "no template reads credentials.%s", name))
		}
	}
	return errs
}

var celIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// celReserved are CEL's reserved words, which cannot follow a ".".
var celReserved = []string{"as", "break", "const", "continue", "else", "false", "for", "function", "if", "import",
	"in", "let", "loop", "package", "namespace", "null", "return", "true", "var", "void", "while"}

// Validate checks the batch bounds.
func (b *Batch) Validate() error {
	var errs []error
	if b.MaxEvents < 1 || b.MaxEvents > maxBatchEvents {
		errs = append(errs, config.ErrorAt("maxEvents", "must be between 1 and %d, got %d", maxBatchEvents, b.MaxEvents))
	}
	if b.MaxWait < 0 {
		errs = append(errs, config.ErrorAt("maxWait", "must not be negative, got %s", b.MaxWait))
	}
	return errors.Join(errs...)
}

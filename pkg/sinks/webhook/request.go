package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	celast "github.com/google/cel-go/common/ast"
	"golang.org/x/net/http/httpguts"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Request shapes each request with CEL instead of sending a CloudEvent.
// The expressions see what where sees (object, oldObject, type) and
// event (id, type, subject, rule, cluster, change, reason, replay, time)
// and patch; they are type-checked at load and bounded like where. Scheme
// and host stay those of url: object data shapes the path and the query,
// never where the request goes.
type Request struct {
	// Method is the HTTP method: POST, PUT, PATCH or DELETE. Default POST.
	Method string `yaml:"method"`
	// Path is a CEL string appended to the url's path; each "/"-separated part is escaped (an empty, "." or ".." part fails the event). Default: the url's path.
	Path string `yaml:"path"`
	// Query maps query parameters to CEL strings, added to the url's query (an empty value leaves the parameter out).
	Query map[string]string `yaml:"query"`
	// Headers maps header names to CEL strings.
	Headers map[string]string `yaml:"headers"`
	// Body is a CEL expression whose value is the JSON body (map, list, string, number, bool or null), sent as application/json. Default: no body.
	Body string `yaml:"body"`
	// For fires only once the object stayed in the rule's view that long (Prometheus' for): until then its events are handled without a request, and a deletion is always sent; the sink's replay (replayEvery, required) is the timer that ends the wait, and the time an object entered is checkpointed, so a wait survives restarts. Default 0: at once.
	For config.Duration `yaml:"for"`
	// When is a CEL bool: false handles the event without a request (it counts as delivered; a later change or replay is evaluated again). With replayEvery it waits out a duration: timestamp(event.time) - timestamp(event.entered) > duration('5m'). Default: always.
	When string `yaml:"when"`
	// Digest is a CEL expression whose value is the JSON body of a digest's request (the sink's digest): it sees digest ({group, count, entered, left, changed, items: [{change, line, id, type, subject, rule, reason, replay, kind, namespace, name, uid, changes, object}], more, title, text}) and, for path, query and headers too, the first event's variables. Default: the preset's (slack, teams and generic have one).
	Digest string `yaml:"digest"`
}

// SetDefaults POSTs.
func (r *Request) SetDefaults() { r.Method = http.MethodPost }

var requestMethods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Validate compiles every expression, so that a typo is a load error
// naming its key.
func (r *Request) Validate() error {
	var errs []error
	if !slices.Contains(requestMethods, r.Method) {
		errs = append(errs, config.ErrorAt("method", "must be one of %s, got %q", strings.Join(requestMethods, ", "), r.Method))
	}
	if r.For < 0 || r.For.D() > maxFor {
		errs = append(errs, config.ErrorAt("for", "must be between 0 and %s, got %s", maxFor, r.For))
	}
	r.each(func(field, name, expr, want string) {
		if field == "headers" {
			switch lower := strings.ToLower(name); {
			case !httpguts.ValidHeaderFieldName(name):
				errs = append(errs, config.ErrorAt(templateKey(field, name), "invalid header name"))
				return
			case lower == "content-length" || lower == "x-kubebridge-signature" || lower == "kubebridge-fence" || lower == "host":
				errs = append(errs, config.ErrorAt(templateKey(field, name), "is set by kubebridge and cannot be a template"))
				return
			}
		}
		_, es := celsandbox.CompileTemplate(expr, want)
		for _, e := range es {
			errs = append(errs, config.ErrorAt(templateKey(field, name), "%v", e))
		}
	})
	return errors.Join(errs...)
}

// each calls f with every expression of r, in a fixed order: its field
// (path, query, headers, body, when), its name within query or headers,
// the expression and what it must yield (see celsandbox.CompileTemplate).
func (r *Request) each(f func(field, name, expr, want string)) {
	if r.Path != "" {
		f("path", "", r.Path, "string")
	}
	for _, k := range sortedKeys(r.Query) {
		f("query", k, r.Query[k], "string")
	}
	for _, k := range sortedKeys(r.Headers) {
		f("headers", k, r.Headers[k], "string")
	}
	if r.Body != "" {
		f("body", "", r.Body, "json")
	}
	if r.When != "" {
		f("when", "", r.When, "bool")
	}
	if r.Digest != "" {
		f("digest", "", r.Digest, "json")
	}
}

// templateKey is the config key of an expression each names.
func templateKey(field, name string) string {
	if name == "" {
		return field
	}
	return config.JoinKey(field, name)
}

// has says whether r sets the expression at field and name.
func (r *Request) has(field, name string) bool {
	found := false
	r.each(func(f, n, _, _ string) { found = found || (f == field && n == name) })
	return found
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// maxFor bounds a request's for: an object must stay in a view a week at
// most before its alert fires.
const maxFor = 7 * 24 * time.Hour

// shapedRequest is a compiled Request.
type shapedRequest struct {
	method string
	wait   time.Duration // for
	// perObject says the target (path or query) is computed from the
	// event: a 403, 404, 410 or 3xx is about that object's resource, not
	// the destination's (sinks.ObjectTarget).
	perObject bool
	base      *url.URL
	path      *celsandbox.Template
	query     []namedTemplate
	headers   []namedTemplate
	body      *celsandbox.Template
	when      *celsandbox.Template
	digest    *celsandbox.Template // a digest's body
}

type namedTemplate struct {
	name string
	t    *celsandbox.Template
}

// maxRequestLine bounds the URL a template builds, and maxHeaderValue each
// header value: receivers refuse longer ones.
const (
	maxRequestLine = 8 << 10
	maxHeaderValue = 8 << 10
)

func compileRequest(rawURL string, r *Request) (*shapedRequest, error) {
	base, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	out := &shapedRequest{method: r.Method, base: base, wait: r.For.D()}
	if out.method == "" {
		out.method = http.MethodPost
	}
	r.each(func(field, name, expr, want string) {
		if err != nil {
			return
		}
		t, errs := celsandbox.CompileTemplate(expr, want)
		if errs != nil {
			err = fmt.Errorf("%s: %w", templateKey(field, name), errors.Join(errs...))
			return
		}
		// Only what names the resource (the path, the query) makes an
		// answer about it the object's: a header that reads the event (an
		// Idempotency-Key) names no resource, and a wrong URL under it is
		// still the destination's.
		if (field == "path" || field == "query") && readsTheEvent(expr) {
			out.perObject = true
		}
		switch field {
		case "path":
			out.path = t
		case "body":
			out.body = t
		case "when":
			out.when = t
		case "digest":
			out.digest = t
		case "query":
			out.query = append(out.query, namedTemplate{name, t})
		case "headers":
			out.headers = append(out.headers, namedTemplate{http.CanonicalHeaderKey(name), t})
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readsTheEvent reports whether expr reads anything that varies per
// event: object, oldObject, type, patch, changes, owners, involved, or
// event other than its cluster
// and source (the sink's own). Credentials and literals do not.
func readsTheEvent(expr string) bool {
	env, err := celsandbox.CELTemplateEnv()
	if err != nil {
		return true
	}
	parsed, iss := env.Parse(expr)
	if iss.Err() != nil {
		return true
	}
	reads := false
	constant := map[int64]bool{} // event idents selected for cluster or source
	celast.PreOrderVisit(parsed.NativeRep().Expr(), celast.NewExprVisitor(func(x celast.Expr) {
		switch x.Kind() {
		case celast.SelectKind:
			sel := x.AsSelect()
			if op := sel.Operand(); op.Kind() == celast.IdentKind && op.AsIdent() == celsandbox.CELEvent &&
				(sel.FieldName() == "cluster" || sel.FieldName() == "source") {
				constant[op.ID()] = true
			}
		case celast.IdentKind:
			switch x.AsIdent() {
			case celsandbox.CELObject, celsandbox.CELOldObject, celsandbox.CELType, celsandbox.CELPatch, celsandbox.CELChanges, celsandbox.CELOwners, celsandbox.CELInvolved:
				reads = true
			case celsandbox.CELEvent:
				reads = reads || !constant[x.ID()]
			}
		}
	}))
	return reads
}

// vars are the values e's templates see: its data as the rule includes it
// (redacted as its data is) and its attributes.
func vars(e *event.Event, creds map[string]string) (*celsandbox.TemplateVars, error) {
	obj, old, patch, err := e.Payload()
	if err != nil {
		return nil, err
	}
	ev := map[string]string{
		"id": e.ID, "type": e.Type(), "subject": e.Subject, "rule": e.Rule(), "cluster": e.Cluster(),
		"change": string(e.Change), "reason": e.Reason, "replay": e.Replay, "time": e.Time.Format(time.RFC3339Nano),
		"source": e.Source(), "entered": time.Unix(0, e.Entered).UTC().Format(time.RFC3339Nano),
	}
	rel := e.Related()
	return &celsandbox.TemplateVars{Object: obj, OldObject: old, Type: string(e.Change), Event: ev, Patch: patch, Credentials: creds,
		Changes: func() map[string]any { return changesVar(e) }, Owners: rel.OwnersValue(), Involved: rel.InvolvedValue()}, nil
}

// render builds e's request: target URL, headers and body; withheld names
// why there is none (sinks.WithheldFor, sinks.WithheldWhen). An error is
// the event's alone (its data does not fit the template).
func (r *shapedRequest) render(e *event.Event, creds map[string]string) (target string, h http.Header, body []byte, withheld string, err error) {
	v, withheld, err := r.admit(e, creds)
	if v == nil {
		return "", nil, nil, withheld, err
	}
	target, h, body, err = r.build(v, r.body)
	return target, h, body, "", err
}

// admit returns e's template variables, or nil and why e has no request
// (withheld), or nil and the error of the event alone.
func (r *shapedRequest) admit(e *event.Event, creds map[string]string) (v *celsandbox.TemplateVars, withheld string, err error) {
	if r.wait > 0 && e.Change != event.Deleted && e.Time.Sub(time.Unix(0, e.Entered)) < r.wait {
		return nil, sinks.WithheldFor, nil // not in the view for long enough yet: a replay asks again
	}
	if v, err = vars(e, creds); err != nil {
		return nil, "", err
	}
	if r.when != nil {
		ok, err := r.when.Bool(v)
		if err != nil {
			return nil, "", fmt.Errorf("when: %w", err)
		}
		if !ok {
			return nil, sinks.WithheldWhen, nil
		}
	}
	return v, "", nil
}

// build renders the request of v with bodyT as its body (nil: none).
func (r *shapedRequest) build(v *celsandbox.TemplateVars, bodyT *celsandbox.Template) (target string, h http.Header, body []byte, err error) {
	u := *r.base
	if r.path != nil {
		p, err := r.path.String(v)
		if err != nil {
			return "", nil, nil, fmt.Errorf("path: %w", err)
		}
		if u.Path, u.RawPath, err = joinPath(u, p); err != nil {
			return "", nil, nil, fmt.Errorf("path: %w", err)
		}
	}
	if len(r.query) > 0 {
		q := u.Query()
		for _, nt := range r.query {
			val, err := nt.t.String(v)
			if err != nil {
				return "", nil, nil, fmt.Errorf("query.%s: %w", nt.name, err)
			}
			if val != "" { // an empty value leaves the parameter out
				q.Add(nt.name, val)
			}
		}
		u.RawQuery = q.Encode()
	}
	target = u.String()
	if len(target) > maxRequestLine {
		return "", nil, nil, fmt.Errorf("the URL is %d bytes, more than %d", len(target), maxRequestLine)
	}
	h = http.Header{}
	for _, nt := range r.headers {
		val, err := nt.t.String(v)
		if err != nil {
			return "", nil, nil, fmt.Errorf("headers.%s: %w", nt.name, err)
		}
		if len(val) > maxHeaderValue || !httpguts.ValidHeaderFieldValue(val) {
			return "", nil, nil, fmt.Errorf("headers.%s: not a valid header value (%d bytes; control characters are not allowed)", nt.name, len(val))
		}
		h.Set(nt.name, val)
	}
	if bodyT != nil {
		if body, err = bodyT.JSON(v); err != nil {
			return "", nil, nil, fmt.Errorf("body: %w", err)
		}
		if h.Get("Content-Type") == "" {
			h.Set("Content-Type", "application/json")
		}
	}
	return target, h, body, nil
}

// joinPath appends p's "/"-separated parts to u's path, each escaped as
// one segment: data from an object cannot add a query, a fragment, or
// climb out of the base path.
func joinPath(u url.URL, p string) (path, raw string, err error) {
	path, raw = strings.TrimSuffix(u.Path, "/"), strings.TrimSuffix(u.EscapedPath(), "/")
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if part == "" || part == "." || part == ".." {
			return "", "", fmt.Errorf("%q has an empty, \".\" or \"..\" part", p)
		}
		path += "/" + part
		raw += "/" + url.PathEscape(part)
	}
	return path, raw, nil
}

// sendRequest sends e as the request its templates build. A template
// that fails on this event refuses it alone (permanent: the dead-letter).
func (s *Sink) sendRequest(ctx context.Context, e *event.Event) error {
	creds, err := s.credentials()
	if err != nil {
		return err
	}
	target, h, body, withheld, err := s.request.render(e, creds)
	if err != nil {
		// A CEL error may quote a value it failed on: never a credential's.
		return sinks.Permanent(scrubbed(fmt.Errorf("request template for event %s: %w", e.ID, err), creds))
	}
	if withheld != "" {
		s.withheld[withheld].Add(1)
		s.logger.Debug("request withheld", "reason", withheld, "event", e.ID, "change", string(e.Change), "subject", e.Subject)
		return nil // handled: no request is owed for it
	}
	err = s.do(ctx, s.request.method, target, h, body)
	// Not the target: a receiver's URL (a Slack webhook's path) is its secret.
	if s.logger.Enabled(ctx, slog.LevelDebug) {
		attrs := []any{"event", e.ID, "change", string(e.Change), "subject", e.Subject, "method", s.request.method, "bytes", len(body)}
		if err != nil {
			attrs = append(attrs, "error", scrubbed(err, creds))
		}
		s.logger.Debug("request sent", attrs...)
	}
	if reason, ok := sinks.DestinationReason(err); ok && reason != sinks.ReasonConfig && reason != sinks.ReasonUnauthorized && s.request.perObject {
		// The receiver answered about the resource this object's request
		// names (a 404 for /items/<its name>): the object's outcome. A
		// 401 is about the credential, which no object chooses.
		err = sinks.ObjectTarget(err)
	}
	// A receiver may echo the request in its answer, which the error quotes.
	return scrubbed(err, creds)
}

// credentials are the credential files' values as they are now, by name.
func (s *Sink) credentials() (map[string]string, error) {
	if len(s.creds) == 0 {
		return nil, nil
	}
	creds := make(map[string]string, len(s.creds))
	for name, f := range s.creds {
		v, err := sendable(f)
		if err != nil {
			return nil, fmt.Errorf("credentialFiles.%s: %w", name, err)
		}
		creds[name] = string(v)
	}
	return creds, nil
}

// scrubbed is err with every credential value in its message replaced by
// <redacted>: as written, and as a receiver's answer may echo it, escaped
// in a JSON or Go string (\/, \", \u003c in either case, \x3c, with its
// backslashes doubled when quoted again) or percent-encoded. Its class
// (errors.As) stays err's.
func scrubbed(err error, creds map[string]string) error {
	if err == nil {
		return err
	}
	re := credentialPattern(creds)
	if re == nil {
		return err
	}
	msg := err.Error()
	out := re.ReplaceAllLiteralString(msg, "<redacted>")
	if out == msg {
		return err
	}
	return &scrubbedError{msg: out, err: err}
}

// patterns caches the compiled pattern of a set of credential values (they
// change only when a file is rotated).
var patterns = struct {
	sync.Mutex
	m map[string]*regexp.Regexp
}{m: map[string]*regexp.Regexp{}}

// credentialPattern matches any of the values of creds, escaped or not;
// nil when there are none.
func credentialPattern(creds map[string]string) *regexp.Regexp {
	values := make([]string, 0, len(creds))
	for _, v := range creds {
		if v != "" {
			values = append(values, v)
		}
	}
	if len(values) == 0 {
		return nil
	}
	// Longest first: a credential that contains another is replaced whole.
	slices.SortFunc(values, func(a, b string) int {
		if d := len(b) - len(a); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	key := strings.Join(values, "\x00")
	patterns.Lock()
	defer patterns.Unlock()
	if re, ok := patterns.m[key]; ok {
		return re
	}
	alts := make([]string, len(values))
	for i, v := range values {
		alts[i] = escapedPattern(v)
	}
	re := regexp.MustCompile(strings.Join(alts, "|"))
	if len(patterns.m) >= 16 {
		clear(patterns.m)
	}
	patterns.m[key] = re
	return re
}

// escapedPattern matches v with any of its characters escaped.
func escapedPattern(v string) string {
	var b strings.Builder
	for _, r := range v {
		b.WriteString(`(?:\\*`)
		b.WriteString(regexp.QuoteMeta(string(r)))
		if r < 0x10000 {
			fmt.Fprintf(&b, `|\\+u(?i:%04x)`, r)
		}
		if r < 0x80 {
			fmt.Fprintf(&b, `|\\+x(?i:%02x)|%%(?i:%02x)`, r, r)
		}
		b.WriteByte(')')
	}
	return b.String()
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
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
	// Query maps query parameters to CEL strings, added to the url's query.
	Query map[string]string `yaml:"query"`
	// Headers maps header names to CEL strings.
	Headers map[string]string `yaml:"headers"`
	// Body is a CEL expression whose value is the JSON body (map, list, string, number, bool or null), sent as application/json. Default: no body.
	Body string `yaml:"body"`
	// When is a CEL bool: false handles the event without a request (it counts as delivered; a later change or replay is evaluated again). With replayEvery it waits out a duration: timestamp(event.time) - timestamp(event.entered) > duration('5m'). Default: always.
	When string `yaml:"when"`
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
	add := func(key string, es []error) {
		for _, e := range es {
			errs = append(errs, config.ErrorAt(key, "%v", e))
		}
	}
	if r.Path != "" {
		_, es := config.CompileStringTemplate(r.Path)
		add("path", es)
	}
	for _, k := range sortedKeys(r.Query) {
		_, es := config.CompileStringTemplate(r.Query[k])
		add(config.JoinKey("query", k), es)
	}
	for _, name := range sortedKeys(r.Headers) {
		lower := strings.ToLower(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			errs = append(errs, config.ErrorAt(config.JoinKey("headers", name), "invalid header name"))
			continue
		case lower == "content-length" || lower == "authorization" || lower == "x-kubebridge-signature" || lower == "host":
			errs = append(errs, config.ErrorAt(config.JoinKey("headers", name), "is set by kubebridge and cannot be a template"))
			continue
		}
		_, es := config.CompileStringTemplate(r.Headers[name])
		add(config.JoinKey("headers", name), es)
	}
	if r.Body != "" {
		_, es := config.CompileJSONTemplate(r.Body)
		add("body", es)
	}
	if r.When != "" {
		_, es := config.CompileBoolTemplate(r.When)
		add("when", es)
	}
	return errors.Join(errs...)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// shapedRequest is a compiled Request.
type shapedRequest struct {
	method  string
	base    *url.URL
	path    *config.Template
	query   []namedTemplate
	headers []namedTemplate
	body    *config.Template
	when    *config.Template
}

type namedTemplate struct {
	name string
	t    *config.Template
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
	out := &shapedRequest{method: r.Method, base: base}
	if out.method == "" {
		out.method = http.MethodPost
	}
	compile := func(key, expr string, json bool) (*config.Template, error) {
		var t *config.Template
		var errs []error
		if json {
			t, errs = config.CompileJSONTemplate(expr)
		} else {
			t, errs = config.CompileStringTemplate(expr)
		}
		if errs != nil {
			return nil, fmt.Errorf("%s: %w", key, errors.Join(errs...))
		}
		return t, nil
	}
	if r.Path != "" {
		if out.path, err = compile("path", r.Path, false); err != nil {
			return nil, err
		}
	}
	for _, k := range sortedKeys(r.Query) {
		t, err := compile("query."+k, r.Query[k], false)
		if err != nil {
			return nil, err
		}
		out.query = append(out.query, namedTemplate{k, t})
	}
	for _, k := range sortedKeys(r.Headers) {
		t, err := compile("headers."+k, r.Headers[k], false)
		if err != nil {
			return nil, err
		}
		out.headers = append(out.headers, namedTemplate{http.CanonicalHeaderKey(k), t})
	}
	if r.Body != "" {
		if out.body, err = compile("body", r.Body, true); err != nil {
			return nil, err
		}
	}
	if r.When != "" {
		t, errs := config.CompileBoolTemplate(r.When)
		if errs != nil {
			return nil, fmt.Errorf("when: %w", errors.Join(errs...))
		}
		out.when = t
	}
	return out, nil
}

// vars are the values e's templates see: its data as the rule includes it
// (redacted as its data is) and its attributes.
func vars(e *event.Event) (*config.TemplateVars, error) {
	obj, old, patch, err := e.Payload()
	if err != nil {
		return nil, err
	}
	ev := map[string]string{
		"id": e.ID, "type": e.Type, "subject": e.Subject, "rule": e.Rule, "cluster": e.Cluster,
		"change": string(e.Change), "reason": e.Reason, "replay": e.Replay, "time": e.Time.Format(time.RFC3339Nano),
		"source": e.Source, "entered": time.Unix(0, e.Entered).UTC().Format(time.RFC3339Nano),
	}
	return &config.TemplateVars{Object: obj, OldObject: old, Type: string(e.Change), Event: ev, Patch: patch}, nil
}

// render builds e's request: target URL, headers and body; skip when the
// request's when is false. An error is the event's alone (its data does
// not fit the template).
func (r *shapedRequest) render(e *event.Event) (target string, h http.Header, body []byte, skip bool, err error) {
	v, err := vars(e)
	if err != nil {
		return "", nil, nil, false, err
	}
	if r.when != nil {
		ok, err := r.when.Bool(v)
		if err != nil {
			return "", nil, nil, false, fmt.Errorf("when: %w", err)
		}
		if !ok {
			return "", nil, nil, true, nil
		}
	}
	target, h, body, err = r.build(v)
	return target, h, body, false, err
}

func (r *shapedRequest) build(v *config.TemplateVars) (target string, h http.Header, body []byte, err error) {
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
			q.Add(nt.name, val)
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
	if r.body != nil {
		if body, err = r.body.JSON(v); err != nil {
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
	target, h, body, skip, err := s.request.render(e)
	if err != nil {
		return sinks.Permanent(fmt.Errorf("request template for event %s: %w", e.ID, err))
	}
	if skip {
		return nil // handled: when said no request
	}
	return s.do(ctx, s.request.method, target, h, body)
}

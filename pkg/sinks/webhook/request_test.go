package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

var podRule = &event.Rule{Name: "failed-pods", Cluster: "prod-eu", GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, IncludeObject: true}

func pod(ns, name, phase, message string) *event.Event {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod",
		"status": map[string]any{"phase": phase, "message": message}}}
	if phase == "" {
		delete(u.Object, "status")
	}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion("7")
	return event.New(podRule, event.Added, u, nil, time.Now())
}

type seen struct {
	method, path, rawQuery string
	header                 http.Header
	body                   []byte
}

func recordRequests(t *testing.T) (*httptest.Server, func() []seen) {
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

func shaped(t *testing.T, url string, r *Request, extra func(*Config)) *Sink {
	t.Helper()
	if r.Method == "" {
		r.Method = http.MethodPost
	}
	c := &Config{URL: url, Mode: "binary", Timeout: config.Duration(5 * time.Second), Request: r}
	if extra != nil {
		extra(c)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// The request a template builds reaches the receiver as written: method,
// the path under the url's (each part escaped: an object's name cannot add
// a query or a segment), the query, headers, and a JSON body whose strings
// hold whatever the object's do (quotes, braces, newlines) as values.
func TestShapedRequest(t *testing.T) {
	srv, got := recordRequests(t)
	s := shaped(t, srv.URL+"/api/v2?static=1", &Request{
		Method:  http.MethodPut,
		Path:    `'alerts/' + object.metadata.namespace + '/' + object.metadata.name`,
		Query:   map[string]string{"rule": `event.rule`},
		Headers: map[string]string{"X-Phase": `dyn(object).status.phase`},
		Body:    `{"summary": "Pod " + object.metadata.name + " is " + dyn(object).status.phase, "message": dyn(object).status.message, "cluster": event.cluster, "id": event.id}`,
	}, nil)
	hostile := "\"}, \"admin\": true, {\"x\": \"\n"
	e := pod("prod", "web?x=1#frag", "Failed", hostile)
	if err := s.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	reqs := got()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.method != http.MethodPut || r.path != "/api/v2/alerts/prod/web%3Fx=1%23frag" || r.rawQuery != "rule=failed-pods&static=1" {
		t.Errorf("%s %s ? %s", r.method, r.path, r.rawQuery)
	}
	if r.header.Get("X-Phase") != "Failed" || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", r.header)
	}
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	if len(body) != 4 || body["message"] != hostile || body["summary"] != "Pod web?x=1#frag is Failed" || body["cluster"] != "prod-eu" || body["id"] != e.ID {
		t.Errorf("body %s", r.body)
	}
}

// A template that fails on one object (a field it lacks, a path part that
// climbs out) refuses that event alone, permanently (the dead-letter's):
// its neighbours are sent.
func TestTemplateFailureIsTheEventsAlone(t *testing.T) {
	srv, got := recordRequests(t)
	s := shaped(t, srv.URL, &Request{
		Path: `object.metadata.name == 'up' ? '..' : 'pods/' + object.metadata.name`,
		Body: `{"phase": dyn(object).status.phase}`,
	}, nil)
	batch := []*event.Event{pod("a", "ok-1", "Failed", ""), pod("a", "nostatus", "", ""), pod("a", "up", "Failed", ""), pod("a", "ok-2", "Failed", "")}
	err := s.Send(context.Background(), batch)
	var ee *sinks.EventErrors
	if !errors.As(err, &ee) || len(ee.Errs) != 4 {
		t.Fatalf("Send = %v", err)
	}
	if ee.Errs[0] != nil || ee.Errs[3] != nil || !sinks.IsPermanent(ee.Errs[1]) || !sinks.IsPermanent(ee.Errs[2]) {
		t.Errorf("outcomes %v", ee.Errs)
	}
	if !strings.Contains(ee.Errs[1].Error(), "body") || !strings.Contains(ee.Errs[2].Error(), "path") {
		t.Errorf("errors do not name the template: %v", ee.Errs)
	}
	if n := len(got()); n != 2 {
		t.Errorf("%d requests, want the two that rendered", n)
	}
}

// A shaped request is signed like any other (v2 over its body) and
// carries the bearer token.
func TestShapedRequestSigned(t *testing.T) {
	srv, got := recordRequests(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "hmac")
	must(t, os.WriteFile(secret, []byte("s3cr3t\n"), 0o600))
	s := shaped(t, srv.URL, &Request{Body: `{"n": object.metadata.name}`}, func(c *Config) { c.SigningSecretFile = secret })
	must(t, s.Send(context.Background(), []*event.Event{pod("a", "p", "Failed", "")}))
	r := got()[0]
	if err := verifyV2([]byte("s3cr3t"), r.header, r.body, time.Now()); err != nil {
		t.Errorf("signature: %v", err)
	}
}

// Mistakes are load errors naming the key; a template with batch is
// refused.
func TestRequestValidation(t *testing.T) {
	r := &Request{Method: "GET", Path: `objekt.x`, Headers: map[string]string{"X-A": `object.metadata.generation`, "Content-Length": `'1'`}, Body: `{"a": object.metadata.nmae}`}
	err := r.Validate()
	for _, want := range []string{
		`method: must be one of POST, PUT, PATCH, DELETE, got "GET"`,
		`path: undeclared reference to 'objekt' (column 1)`,
		`headers.X-A: must be a string expression, got int`,
		`headers.Content-Length: is set by kubebridge`,
		`body: undefined field 'nmae'`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want %q", err, want)
		}
	}
	c := &Config{URL: "http://x", Mode: "binary", Timeout: config.Duration(time.Second), Request: &Request{Method: "POST"}, Batch: &Batch{MaxEvents: 1}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "does not go with batch") {
		t.Errorf("request with batch: %v", err)
	}
}

// BenchmarkRenderRequest is the cost of shaping one event's request
// (path, a header, a body of five fields), without sending it.
func BenchmarkRenderRequest(b *testing.B) {
	r, err := compileRequest("http://receiver:8080/api", &Request{Method: "POST",
		Path:    `'alerts/' + object.metadata.namespace + '/' + object.metadata.name`,
		Headers: map[string]string{"X-Rule": `event.rule`},
		Body:    `{"summary": "Pod " + object.metadata.name + " failed", "phase": dyn(object).status.phase, "message": dyn(object).status.message, "cluster": event.cluster, "id": event.id}`,
	})
	if err != nil {
		b.Fatal(err)
	}
	e := pod("prod", "web-1", "Failed", "OOMKilled: the container used more than its limit")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, _, err := r.render(e, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendShapedVsCloudEvent sends the same pod events one request
// each to a local receiver, as a CloudEvent (binary mode) and as a shaped
// request: the render's share of a real round trip.
func BenchmarkSendShapedVsCloudEvent(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	req := &Request{Method: "POST",
		Path:    `'alerts/' + object.metadata.namespace + '/' + object.metadata.name`,
		Headers: map[string]string{"X-Rule": `event.rule`},
		Body:    `{"summary": "Pod " + object.metadata.name + " failed", "phase": dyn(object).status.phase, "message": dyn(object).status.message, "cluster": event.cluster, "id": event.id}`,
	}
	for _, tc := range []struct {
		name string
		req  *Request
	}{{"cloudevent", nil}, {"shaped", req}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := New(&Config{URL: srv.URL, Mode: "binary", Timeout: config.Duration(5 * time.Second), Request: tc.req}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			b.ReportAllocs()
			for b.Loop() {
				// A fresh event each time: CloudEvents cache their encoding.
				if err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "OOMKilled")}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Whatever a template's path holds, the URL stays under the url's host and
// path, with no query or fragment of its own.
func FuzzJoinPathStaysUnderTheBase(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "a?b#c", "%2e%2e/x", "//evil.example/x", "a/./b", "\x00/\n"} {
		f.Add(s)
	}
	base, _ := url.Parse("https://receiver.example/api/v1?static=1")
	f.Fuzz(func(t *testing.T, p string) {
		path, raw, err := joinPath(*base, p)
		if err != nil {
			return
		}
		u := *base
		u.Path, u.RawPath = path, raw
		got, err := url.Parse(u.String())
		if err != nil {
			t.Fatalf("%q: %s does not parse: %v", p, u.String(), err)
		}
		if got.Host != "receiver.example" || got.Scheme != "https" || got.RawQuery != "static=1" || got.Fragment != "" ||
			!strings.HasPrefix(got.Path, "/api/v1/") || strings.Contains("/"+got.Path+"/", "/../") {
			t.Fatalf("%q: %s leaves the base", p, u.String())
		}
	})
}

// when decides per event whether a request is made: false handles the
// event without one (a later change or replay asks again). event.entered
// is when the object entered the view, for waiting out a duration.
func TestShapedRequestWhen(t *testing.T) {
	srv, got := recordRequests(t)
	s := shaped(t, srv.URL, &Request{
		When: `dyn(object).?status.?phase.orValue('') == 'Failed' && timestamp(event.time) - timestamp(event.entered) >= duration('0s')`,
		Body: `{"n": object.metadata.name}`,
	}, nil)
	batch := []*event.Event{pod("a", "running", "Running", ""), pod("a", "failed", "Failed", ""), pod("a", "none", "", "")}
	if err := s.Send(context.Background(), batch); err != nil {
		t.Fatalf("Send = %v, want every event handled", err)
	}
	reqs := got()
	if len(reqs) != 1 || !strings.Contains(string(reqs[0].body), `"failed"`) {
		t.Errorf("requests %v, want only the failed pod's", reqs)
	}
	if err := (&Request{Method: "POST", When: `object.metadata.name`}).Validate(); err == nil || !strings.Contains(err.Error(), "when: must be a boolean expression, got string") {
		t.Errorf("a string when: %v", err)
	}
}

// for: an object that entered the view less than for ago is handled
// without a request; one that stayed long enough is sent; a deletion is
// always sent.
func TestRequestFor(t *testing.T) {
	srv, got := recordRequests(t)
	s := shaped(t, srv.URL, &Request{Body: `{"n": object.metadata.name, "t": type}`, For: config.Duration(time.Minute)}, nil)
	young := pod("a", "young", "Failed", "")
	old := pod("a", "old", "Failed", "")
	old.Entered = old.Time.Add(-2 * time.Minute).UnixNano()
	gone := podLeft("a", "young")
	must(t, s.Send(context.Background(), []*event.Event{young, old, gone}))
	var sent []string
	for _, r := range got() {
		sent = append(sent, string(r.body))
	}
	if want := []string{`{"n":"old","t":"added"}`, `{"n":"young","t":"deleted"}`}; !slices.Equal(sent, want) {
		t.Errorf("sent %q, want %q", sent, want)
	}
}

// A request's target is the object's when its path or query is computed
// from the event; the sink's own values (cluster, source) and credentials
// are not, nor is a header (an Idempotency-Key names no resource). Errors
// name the request's method.
func TestTargetChosenByTheObject(t *testing.T) {
	for _, c := range []struct {
		r    Request
		want bool
	}{
		{Request{Path: `'items/' + object.metadata.name`}, true},
		{Request{Query: map[string]string{"id": `event.id`}}, true},
		{Request{Headers: map[string]string{"Idempotency-Key": `event.id`}}, false},
		{Request{Path: `'clusters/' + event.cluster`, Headers: map[string]string{"X-Key": `credentials.key`}}, false},
		{Request{Path: `'items'`, Body: `{"name": object.metadata.name}`}, false},
		{withPreset("opsgenie", nil), true},
		{withPreset("pagerduty", nil), false},
	} {
		r := c.r
		if r.Method == "" {
			r.Method = http.MethodPost
		}
		got, err := compileRequest("http://receiver/api", &r)
		if err != nil {
			t.Fatal(err)
		}
		if got.perObject != c.want {
			t.Errorf("%+v: chosen by the object = %v, want %v", c.r, got.perObject, c.want)
		}
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) }))
	defer srv.Close()
	s := shaped(t, srv.URL, &Request{Method: http.MethodDelete, Path: `'items/' + object.metadata.name`}, nil)
	err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "")})
	if !sinks.IsObjectTarget(err) || !strings.HasPrefix(err.Error(), "DELETE ") {
		t.Errorf("a 404 for /items/web-1: %v (object's: %v), want the object's, naming DELETE", err, sinks.IsObjectTarget(err))
	}
	fixed := shaped(t, srv.URL, &Request{Method: http.MethodPut, Path: `'items'`}, nil)
	err = fixed.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "")})
	if reason, _ := sinks.DestinationReason(err); sinks.IsObjectTarget(err) || reason != sinks.ReasonNotFound || !strings.HasPrefix(err.Error(), "PUT ") {
		t.Errorf("a 404 for a fixed path: %v, want the destination's, naming PUT", err)
	}
}

// A receiver that echoes a credential in its answer, whatever the
// escaping (JSON's \u003c and \/, Go's \x3c, quoted twice, percent-encoded),
// does not put it in the error that reaches logs and dead-letters; nor
// does one echoing the bearer token.
func TestEchoedCredentialsAreScrubbed(t *testing.T) {
	const key = `k3y/with<html>&"quote"`
	echoes := map[string]func(string) string{
		"plain":         func(s string) string { return s },
		"json":          func(s string) string { b, _ := json.Marshal(s); return string(b) },
		"escaped slash": func(s string) string { b, _ := json.Marshal(s); return strings.ReplaceAll(string(b), "/", `\/`) },
		"upper hex": func(s string) string {
			b, _ := json.Marshal(s)
			return strings.ReplaceAll(string(b), `\u003c`, `\u003C`)
		},
		"quoted twice":   func(s string) string { b, _ := json.Marshal(s); b, _ = json.Marshal(string(b)); return string(b) },
		"hex escape":     func(s string) string { return strings.ReplaceAll(fmt.Sprintf("%q", s), "<", `\x3c`) },
		"percent":        func(s string) string { return url.QueryEscape(s) },
		"percent, lower": func(s string) string { return strings.ToLower(url.QueryEscape(s)) },
	}
	var mu sync.Mutex
	echo := echoes["plain"]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var got struct{ Key string }
		_ = json.Unmarshal(body, &got)
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error": "bad key", "key": `+echo(got.Key)+`, "auth": `+echo(r.Header.Get("Authorization"))+`}`)
	}))
	defer srv.Close()
	dir := t.TempDir()
	keyFile, tokenFile := filepath.Join(dir, "key"), filepath.Join(dir, "token")
	must(t, os.WriteFile(keyFile, []byte(key+"\n"), 0o600))
	must(t, os.WriteFile(tokenFile, []byte("t0ken/&<b>\n"), 0o600))
	s := shaped(t, srv.URL, &Request{Method: http.MethodPost, Body: `{"key": credentials.key}`},
		func(c *Config) { c.CredentialFiles, c.BearerTokenFile = map[string]string{"key": keyFile}, tokenFile })
	for name, e := range echoes {
		mu.Lock()
		echo = e
		mu.Unlock()
		err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "")})
		if err == nil || !strings.Contains(err.Error(), "500") || strings.Count(err.Error(), "<redacted>") != 2 ||
			strings.Contains(err.Error(), "k3y") || strings.Contains(err.Error(), "t0ken") {
			t.Errorf("%s echo: %v", name, err)
		}
	}
}

// Package webhook is the HTTP sink: events are POSTed as CloudEvents, in
// binary mode (ce-* headers, body = data) one per request, in structured
// mode (the whole event as JSON) one per request, or, with batch set, in
// batch mode (a JSON array of structured events) per request.
//
// A 2xx response acknowledges the request's events, and nothing else does.
// Other answers are classed by whether sending the same request again can
// help (see classify): only 400, 413, 415 and 422 refuse the events
// themselves (the dead-letter); 401, 403, 404, 410 and redirects (never
// followed: Go would re-send a POST as a body-less GET and count its 200)
// say the sink's URL or credential is wrong and are retried until it is
// fixed (unless an object chose the request's target: then they are that
// object's, sinks.ObjectTarget), as are 408, 429, 5xx, timeouts and
// connection errors, no sooner than a Retry-After says (capped at the
// retry maxInterval); a 409 to a request that carried a fencing token is
// the receiver's fence refusing a stale owner (sinks.Fenced). An event
// that cannot be encoded or carried in headers is refused alone: its
// neighbours are still sent. Whatever the receiver answers costs bounded
// memory: 64 KiB of headers, 64 KiB of body read.
//
// ce-* header values are percent-encoded (the binding's rule), so any
// object name can be carried. With signingSecretFile, each request carries
//
//	X-Kubebridge-Signature: t=<unix seconds>,v1=<...>,v2=<...>,v3=<...>
//
// where v3 signs the timestamp, the method, path and query, the ce-*
// headers, the fencing token (Kubebridge-Fence, sent when the bridge runs
// sharded or leader-elected) and the body (see Sign; docs/sinks.md has the
// verification recipe in Go and Python).
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds webhook sinks.
var Factory = sinks.Factory{
	Type:      "webhook",
	NewConfig: func() any { c := &Config{}; c.SetDefaults(); return c },
	Create:    create,
}

// SignatureHeader carries the HMAC signature.
const SignatureHeader = "X-Kubebridge-Signature"

// FenceHeader carries the fencing token of the ownership a request was sent
// under (sinks.Fence: "shard=3/16;epoch=7"), signed by v3: a receiver that
// keeps the highest epoch per shard refuses a replica that gave the shard
// up and whose request lands late (docs/sinks.md, Refusing stale writes).
const FenceHeader = "Kubebridge-Fence"

// Bounds on what a receiver's answer may cost, whatever it sends: its
// headers (Go's default is 10 MiB per response, times every request in
// flight), the part of its body an error quotes, and the rest read so that
// the connection can be reused.
const (
	maxResponseHeaderBytes = 64 << 10
	maxQuotedBody          = 512
	maxDrainedBody         = 64 << 10
)

// DefaultMaxRetryAfter caps the pause a Retry-After can ask for when the
// sink has no retry maxInterval: one reply must not park a sink for hours.
const DefaultMaxRetryAfter = 5 * time.Minute

// Sink POSTs events to one URL.
type Sink struct {
	url      string
	shownURL string // url without credentials or query, for messages
	mode     string
	batch    *Batch
	headers  http.Header
	request  *shapedRequest                   // the request shaped by CEL, instead of a CloudEvent
	digest   *digest                          // the sink's digest: one request per group of a period's events
	token    *sinks.CredentialFile            // bearerTokenFile, read again when it changes
	secret   *sinks.CredentialFile            // signingSecretFile, likewise
	creds    map[string]*sinks.CredentialFile // credentialFiles, by name, likewise
	// configRefusal says whether a 400's body blames the sink's config (a
	// preset's key in the body), not the event: retried, never dead-lettered.
	configRefusal func(body []byte) bool
	tls           *sinks.TLSFiles // the tls block's files, likewise
	logger        *slog.Logger
	now           func() time.Time
	maxDelay      time.Duration // cap on Retry-After
	timeout       time.Duration

	fenceRefusals atomic.Int64             // 409s to requests that carried a fencing token
	withheld      map[string]*atomic.Int64 // events handled without a request, by sinks.WithheldReasons
	// groupErrors counts the events a digest put in the default group as
	// groupBy failed on them; lastGroupErrLog (unix nanos) limits the log.
	groupErrors, lastGroupErrLog atomic.Int64

	mu     sync.Mutex
	client *http.Client // replaced when the TLS files change
	tlsGen int          // the TLS files' generation client was built with
	idle   int          // idle connections kept (keepConns)
}

func create(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
	sink, err := New(s.Config.(*Config), s.Logger)
	if err != nil {
		return nil, err
	}
	if s.MaxRetryInterval > 0 {
		sink.maxDelay = s.MaxRetryInterval
	}
	if s.Digest != nil {
		if sink.digest, err = newDigest(s.Digest, sink.request); err != nil {
			return nil, err
		}
	}
	if s.InFlight > 0 {
		sink.keepConns(s.InFlight)
	}
	return sink, nil
}

// New builds a webhook sink from its config.
func New(c *Config, logger *slog.Logger) (*Sink, error) {
	s := &Sink{url: c.URL, shownURL: config.RedactURL(c.URL), mode: c.Mode, batch: c.Batch, headers: http.Header{}, now: time.Now, maxDelay: DefaultMaxRetryAfter}
	for k, v := range c.Headers {
		s.headers.Set(k, v)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s.logger = logger
	s.withheld = make(map[string]*atomic.Int64, len(sinks.WithheldReasons))
	for _, r := range sinks.WithheldReasons {
		s.withheld[r] = new(atomic.Int64)
	}
	var err error
	s.configRefusal = presetConfigRefusals[c.Preset]
	if r := c.request(); r != nil {
		if s.request, err = compileRequest(c.URL, r); err != nil {
			if c.Preset != "" {
				return nil, fmt.Errorf("preset %s: %w", c.Preset, err)
			}
			return nil, fmt.Errorf("request: %w", err)
		}
	}
	for _, name := range sortedKeys(c.CredentialFiles) {
		f, err := sinks.OpenCredentialFile(c.CredentialFiles[name], sinks.TrimSpace)
		if err != nil {
			return nil, fmt.Errorf("credentialFiles.%s: %w", name, err)
		}
		if _, err := sendable(f); err != nil {
			return nil, fmt.Errorf("credentialFiles.%s: %w", name, err)
		}
		if s.creds == nil {
			s.creds = map[string]*sinks.CredentialFile{}
		}
		s.creds[name] = f
	}
	if c.BearerTokenFile != "" {
		if s.token, err = sinks.OpenCredentialFile(c.BearerTokenFile, sinks.TrimSpace); err != nil {
			return nil, fmt.Errorf("bearerTokenFile: %w", err)
		}
		if _, err := s.authorization(); err != nil {
			return nil, err
		}
	}
	if c.SigningSecretFile != "" {
		if s.secret, err = sinks.OpenCredentialFile(c.SigningSecretFile, sinks.TrimLine); err != nil {
			return nil, fmt.Errorf("signingSecretFile: %w", err)
		}
	}
	if c.TLS != nil {
		if s.tls, err = sinks.OpenTLS(c.TLS); err != nil {
			return nil, err
		}
		if c.TLS.InsecureSkipVerify {
			logger.Warn("TLS server certificates are not verified (insecureSkipVerify)")
		}
	}
	s.timeout = c.Timeout.D()
	s.idle = config.DefaultConcurrencyMax
	if s.client, err = s.newClient(); err != nil {
		return nil, err
	}
	return s, nil
}

// newClient builds the HTTP client with the TLS files as they are now.
func (s *Sink) newClient() (*http.Client, error) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxResponseHeaderBytes = maxResponseHeaderBytes
	transport.DialContext = dialHard
	if s.tls != nil {
		s.tlsGen = s.tls.Generation()
		tc, err := s.tls.Config()
		if err != nil {
			return nil, err
		}
		transport.TLSClientConfig = tc
	}
	transport.MaxIdleConnsPerHost = s.idle
	transport.MaxIdleConns = max(transport.MaxIdleConns, s.idle)
	return &http.Client{
		Timeout:   s.timeout,
		Transport: transport,
		// Only the configured URL may acknowledge: following a 301/302/303
		// turns the POST into a body-less GET whose 200 would count as a
		// delivery, and a 307/308 hands the events to another host.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// dialer is http.DefaultTransport's.
var dialer = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}

// dialHard dials connections that are closed hard: closing one (a request
// cut short, a timeout) resets it and drops what the kernel still holds
// to send, instead of delivering the rest of a request the bridge gave up
// on (a send cut because the shard's hold lapsed must not land after the
// successor's). Connections are closed only when idle or given up on, so
// nothing that was to arrive is lost.
func dialHard(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := dialer.DialContext(ctx, network, addr)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	return c, err
}

// currentClient returns the client, rebuilt first when the TLS files
// changed (a renewed client certificate, a rotated CA). Files caught
// half-written keep the client that works until they are whole.
func (s *Sink) currentClient() *http.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tls == nil || s.tls.Generation() == s.tlsGen {
		return s.client
	}
	old := s.client
	c, err := s.newClient()
	if err != nil {
		s.logger.Warn("TLS files changed but cannot be used yet; keeping the previous ones", "error", err)
		return old
	}
	s.logger.Info("TLS files changed; new connections use them")
	s.client = c
	old.CloseIdleConnections()
	return c
}

// authorization is the Authorization header from the token file as it is
// now.
func (s *Sink) authorization() (string, error) {
	tok, err := sendable(s.token)
	if err != nil {
		return "", fmt.Errorf("bearerTokenFile: %w", err)
	}
	v := "Bearer " + string(tok)
	if !httpguts.ValidHeaderFieldValue(v) {
		return "", sinks.Destination(sinks.ReasonConfig, fmt.Errorf("bearerTokenFile %s: the token has control characters", s.token.Path()))
	}
	return v, nil
}

// sendable is the content of a credential file the sink sends, read again
// if it changed, refused when it is not a token (config.Sendable: a file
// rotated into a private key is not sent either; the event is retried,
// never lost, once the file holds a token again).
func sendable(f *sinks.CredentialFile) ([]byte, error) {
	v, _ := f.Value()
	if err := config.Sendable(v); err != nil {
		return nil, sinks.Destination(sinks.ReasonConfig, fmt.Errorf("%s %w; not sent", f.Path(), err))
	}
	return v, nil
}

// keepConns keeps up to n idle connections to the receiver: one per
// request the delivery may have in flight (its concurrency), so that
// connections are reused instead of opened and closed per request.
func (s *Sink) keepConns(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = n
	if t, ok := s.client.Transport.(*http.Transport); ok {
		t.MaxIdleConnsPerHost = n
		t.MaxIdleConns = max(t.MaxIdleConns, n)
	}
}

// Batching tells the delivery loop how to batch: maxEvents per request,
// waiting up to maxWait for a batch to fill; one event per request without
// batch, so that each request is one unit of the delivery's (adaptive)
// concurrency and its round trip is what the limiter measures.
func (s *Sink) Batching() (int, time.Duration) {
	if s.batch == nil {
		return 1, 0
	}
	return s.batch.MaxEvents, s.batch.MaxWait.D()
}

// Ordered: in batch mode a batch is one request, all-or-nothing, so an
// object's events may travel in it together, in order; so does a digest's
// group.
func (s *Sink) Ordered() bool { return s.batch != nil || s.digest != nil }

// Send POSTs the events: one request per event, or one per batch. Events
// fare alone where they can (see sinks.EventErrors); without batch they
// are of different objects (sinks.Sink), so none waits for another.
func (s *Sink) Send(ctx context.Context, events []*event.Event) error {
	if s.digest != nil {
		return s.sendDigest(ctx, events)
	}
	if s.batch != nil {
		return s.sendBatch(ctx, events)
	}
	send := s.sendOne
	if s.request != nil {
		send = s.sendRequest
	}
	errs := make([]error, len(events))
	for i, e := range events {
		errs[i] = send(ctx, e)
	}
	return sinks.Outcome(errs)
}

func (s *Sink) sendOne(ctx context.Context, e *event.Event) error {
	h := http.Header{}
	var body []byte
	var err error
	if s.mode == "structured" {
		body, err = e.Structured()
		h.Set("Content-Type", "application/cloudevents+json")
	} else {
		body, err = e.Data()
		h.Set("Content-Type", "application/json")
		// Percent-encoded as the CloudEvents HTTP binding says: a name with
		// a control character is carried, not refused by the transport.
		e.Attributes(func(name, value string) { h.Set("ce-"+name, event.PercentEncode(value)) })
	}
	if err != nil {
		return sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
	}
	return s.post(ctx, h, body)
}

// sendBatch sends the batch as one request, all-or-nothing, but leaves out
// events that cannot be encoded: those are refused alone.
func (s *Sink) sendBatch(ctx context.Context, events []*event.Event) error {
	errs := make([]error, len(events))
	refused := 0
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, e := range events {
		b, err := e.Structured()
		if err != nil {
			errs[i] = sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
			refused++
			continue
		}
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	if refused < len(events) {
		h := http.Header{}
		h.Set("Content-Type", "application/cloudevents-batch+json")
		err := s.post(ctx, h, buf.Bytes())
		if refused == 0 {
			return err
		}
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	return sinks.Outcome(errs)
}

func (s *Sink) post(ctx context.Context, h http.Header, body []byte) error {
	return s.do(ctx, http.MethodPost, s.url, h, body)
}

// do sends one request to target (the sink's URL, or one a template built
// on it) and classifies the answer. Messages name the sink's URL, redacted.
func (s *Sink) do(ctx context.Context, method, target string, h http.Header, body []byte) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil { // the sink's URL, whatever the event
		return sinks.Destination(sinks.ReasonConfig, fmt.Errorf("%s %s: %w", method, s.shownURL, withoutURL(err)))
	}
	for k, v := range s.headers {
		req.Header[k] = v
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if s.token != nil {
		auth, err := s.authorization()
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", auth)
	}
	fence, fenced := sinks.FenceFrom(ctx)
	if fenced {
		req.Header.Set(FenceHeader, fence.String())
	}
	if s.secret != nil {
		secret, _ := s.secret.Value()
		req.Header.Set(SignatureHeader, Sign(secret, s.now(), req, body))
	}
	// Under a fence, the connection the request went out on, to close it
	// hard should the send be cut (HTTP/1 closes it itself; HTTP/2 would
	// only reset the stream and keep the connection, whose buffered bytes
	// still flow; the other requests it carries fail and are retried: a
	// cut is rare, a late write is not to be had).
	var conn net.Conn
	if fenced {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { conn = info.Conn },
		}))
	}
	resp, err := s.currentClient().Do(req)
	if err != nil {
		if ctx.Err() != nil && conn != nil {
			closeHard(conn)
		}
		// Unreachable, refused, timed out: the destination, not the event.
		return sinks.Unavailable(fmt.Errorf("%s %s: %w", method, s.shownURL, withoutURL(err)))
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxQuotedBody))
	// Read to reuse the connection; a longer body is not worth it (closing
	// it unread drops the connection, or the HTTP/2 stream).
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainedBody))
	resp.Body.Close()
	if resp.StatusCode == http.StatusConflict && fenced && fence.Check() != nil {
		// A receiver that keeps the highest epoch per shard refuses ours
		// (docs/sinks.md): another replica owns the shard now, which this
		// one's fence, asked now, confirms. While it still holds, its epoch
		// is the highest there is: the 409 is the receiver's own conflict,
		// classed as any other answer.
		s.fenceRefusals.Add(1)
		return sinks.Fenced(fmt.Errorf("%s %s: %s: %s refused: %s", method, s.shownURL, resp.Status, FenceHeader, fence))
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		// The credential may have been rotated since it was last read:
		// the retry reads the files again.
		s.refreshCredentials()
	}
	err = s.classify(method, resp, snippet)
	if err != nil && s.token != nil {
		// A receiver may echo the Authorization header in its answer.
		tok, _ := s.token.Value()
		err = scrubbed(err, map[string]string{"bearer": string(tok)})
	}
	return err
}

func (s *Sink) refreshCredentials() {
	if s.token != nil {
		s.token.Refresh()
	}
	if s.secret != nil {
		s.secret.Refresh()
	}
	for _, f := range s.creds {
		f.Refresh()
	}
}

// FenceRefusals counts the requests a receiver refused for a stale
// fencing token (kubebridge_sink_fence_refusals_total).
func (s *Sink) FenceRefusals() int64 { return s.fenceRefusals.Load() }

// Withheld is how many events the sink handled without a request because
// of reason (sinks.WithholdReporter).
func (s *Sink) Withheld(reason string) int64 {
	if c := s.withheld[reason]; c != nil {
		return c.Load()
	}
	return 0
}

// closeHard closes the raw connection under c (its TLS layer's, which
// would first try to send a close_notify behind whatever is queued).
func closeHard(c net.Conn) {
	if c == nil {
		return
	}
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	_ = c.Close()
}

// classify turns a non-2xx answer into its outcome, by whether sending the
// same request again can help (docs/sinks.md, the outcome table):
//
//   - 400, 413, 415, 422: the payload itself is refused (Permanent: the
//     dead-letter; for a batch refused as a whole the delivery splits it
//     until the culprit is alone);
//   - 401, 403, 404, 410, 3xx: the URL, route or credential is wrong, not
//     the event (Destination: retried until a reload, a rotated credential
//     or the receiver fixes it; never dead-lettered);
//   - 429, 503: the receiver pushes back (Unavailable, or Throttle with a
//     Retry-After);
//   - anything else (408, 425, other 5xx and 4xx): retried, possibly this
//     payload's failure (the object is parked while the others flow).
func (s *Sink) classify(method string, resp *http.Response, snippet []byte) error {
	code := resp.StatusCode
	err := fmt.Errorf("%s %s: %s: %s", method, s.shownURL, resp.Status, strings.TrimSpace(string(snippet)))
	switch {
	case code >= 200 && code < 300:
		return nil
	case code >= 300 && code < 400:
		// Not a delivery, but not the events' fault either: retried until
		// the URL is fixed (a hot reload), so nothing is lost meanwhile.
		loc := "no Location"
		if l := resp.Header.Get("Location"); l != "" {
			loc = "Location: " + s.location(l)
		}
		return sinks.Destination(sinks.ReasonRedirect, fmt.Errorf("%s %s: %s (%s): redirects are not followed; set the sink's url to the final one", method, s.shownURL, resp.Status, loc))
	case code == http.StatusBadRequest && s.configRefusal != nil && s.configRefusal(snippet):
		return sinks.Destination(sinks.ReasonConfig, err)
	case code == http.StatusBadRequest, code == http.StatusRequestEntityTooLarge, code == http.StatusUnsupportedMediaType, code == http.StatusUnprocessableEntity:
		return sinks.Permanent(err)
	case code == http.StatusUnauthorized:
		return sinks.Destination(sinks.ReasonUnauthorized, err)
	case code == http.StatusForbidden:
		return sinks.Destination(sinks.ReasonForbidden, err)
	case code == http.StatusNotFound:
		return sinks.Destination(sinks.ReasonNotFound, err)
	case code == http.StatusGone:
		return sinks.Destination(sinks.ReasonGone, err)
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), s.now(), s.maxDelay); ok {
			return sinks.Throttle(err, d)
		}
		return sinks.Unavailable(err)
	default:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), s.now(), s.maxDelay); ok {
			return sinks.Throttle(err, d)
		}
		return err
	}
}

// location resolves a Location header against the sink's URL, redacted.
func (s *Sink) location(l string) string {
	base, err := url.Parse(s.url)
	if err != nil {
		return config.RedactURL(l)
	}
	ref, err := url.Parse(l)
	if err != nil {
		return "(unparsable)"
	}
	return config.RedactURL(base.ResolveReference(ref).String())
}

// withoutURL drops a *url.Error's wrapping: its message repeats the URL
// unredacted.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}

// retryAfter parses a Retry-After header, delay-seconds or an HTTP date,
// capped at limit.
func retryAfter(v string, now time.Time, limit time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(limit/time.Second) { // before multiplying: no overflow
			return limit, true
		}
		return min(time.Duration(secs)*time.Second, limit), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), limit), true
	}
	return 0, false
}

// Sign returns the X-Kubebridge-Signature value of req (its method, URL
// and headers) with body, at time t:
//
//	t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>,v2=<hex HMAC-SHA256(secret, SignedContent)>,v3=<hex HMAC-SHA256(secret, SignedRequest)>
//
// v3 covers the method, path and query and the fencing token too, so a
// captured request validates only as itself (not as a DELETE of another
// path); v2 (the ce-* headers and the body) and v1 (the body) stay for
// receivers written before it.
func Sign(secret []byte, t time.Time, req *http.Request, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	v1 := hmac.New(sha256.New, secret)
	v1.Write([]byte(ts))
	v1.Write([]byte("."))
	v1.Write(body)
	v2 := hmac.New(sha256.New, secret)
	v2.Write(SignedContent(ts, req.Header, body))
	v3 := hmac.New(sha256.New, secret)
	v3.Write(SignedRequest(ts, req.Method, req.URL.RequestURI(), req.Header, body))
	return "t=" + ts + ",v1=" + hex.EncodeToString(v1.Sum(nil)) + ",v2=" + hex.EncodeToString(v2.Sum(nil)) + ",v3=" + hex.EncodeToString(v3.Sum(nil))
}

// SignedContent is what v2 signs: the timestamp, a newline, every ce-*
// header as "name:value" and a newline (names lowercased, sorted; values as
// sent, i.e. percent-encoded), a newline, then the raw body.
func SignedContent(ts string, h http.Header, body []byte) []byte {
	return signed(ts, "", "", h, false, body)
}

// SignedRequest is what v3 signs: the timestamp, the method and the
// request target as sent (the escaped path, then "?" and the raw query if
// it has one), each followed by a newline, then every ce-* header and the
// Kubebridge-Fence header as "name:value" and a newline (names lowercased,
// sorted; values as sent), a newline, then the raw body.
func SignedRequest(ts, method, target string, h http.Header, body []byte) []byte {
	return signed(ts, method, target, h, true, body)
}

func signed(ts, method, target string, h http.Header, v3 bool, body []byte) []byte {
	var lines []string
	for k, v := range h {
		lk := strings.ToLower(k)
		if (strings.HasPrefix(lk, "ce-") || (v3 && lk == "kubebridge-fence")) && len(v) > 0 {
			lines = append(lines, lk+":"+v[0]+"\n")
		}
	}
	slices.Sort(lines) // the lines, as the recipes sort them
	b := make([]byte, 0, len(body)+len(ts)+len(method)+len(target)+64*len(lines)+4)
	b = append(append(b, ts...), '\n')
	if v3 {
		b = append(append(b, method...), '\n')
		b = append(append(b, target...), '\n')
	}
	for _, l := range lines {
		b = append(b, l...)
	}
	b = append(b, '\n')
	return append(b, body...)
}

// Close releases idle connections.
func (s *Sink) Close(context.Context) error {
	s.client.CloseIdleConnections()
	return nil
}

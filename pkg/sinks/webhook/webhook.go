// Package webhook is the HTTP sink: events are POSTed as CloudEvents, in
// binary mode (ce-* headers, body = data) one per request, in structured
// mode (the whole event as JSON) one per request, or, with batch set, in
// batch mode (a JSON array of structured events) per request.
//
// A 2xx response acknowledges the request's events. 408, 429, 5xx,
// timeouts and connection errors are retried by the delivery loop, no
// sooner than a Retry-After says; any other status is permanent: the events
// go to the dead-letter.
//
// With signingSecretFile, each request carries
//
//	X-Kubebridge-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
//
// (docs/webhook.md has the verification recipe).
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
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Factory builds webhook sinks.
var Factory = sinks.Factory{Type: "webhook", Create: create}

// SignatureHeader carries the HMAC signature.
const SignatureHeader = "X-Kubebridge-Signature"

// Sink POSTs events to one URL.
type Sink struct {
	url     string
	mode    string
	batch   *config.Batch
	headers http.Header
	secret  []byte
	client  *http.Client
	now     func() time.Time
}

func create(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
	return New(s.Config.Webhook, s.Logger)
}

// New builds a webhook sink from its config.
func New(c *config.WebhookSink, logger *slog.Logger) (*Sink, error) {
	s := &Sink{url: c.URL, mode: c.Mode, batch: c.Batch, headers: http.Header{}, now: time.Now}
	for k, v := range c.Headers {
		s.headers.Set(k, v)
	}
	if c.BearerTokenFile != "" {
		tok, err := os.ReadFile(c.BearerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("bearerTokenFile: %w", err)
		}
		s.headers.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	if c.SigningSecretFile != "" {
		secret, err := os.ReadFile(c.SigningSecretFile)
		if err != nil {
			return nil, fmt.Errorf("signingSecretFile: %w", err)
		}
		s.secret = bytes.TrimRight(secret, "\r\n")
		if len(s.secret) == 0 {
			return nil, fmt.Errorf("signingSecretFile %s is empty", c.SigningSecretFile)
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 16
	if c.TLS != nil {
		tc, err := sinks.TLSConfig(c.TLS)
		if err != nil {
			return nil, err
		}
		if c.TLS.InsecureSkipVerify && logger != nil {
			logger.Warn("TLS server certificates are not verified (insecureSkipVerify)")
		}
		transport.TLSClientConfig = tc
	}
	s.client = &http.Client{Timeout: c.Timeout.D(), Transport: transport}
	return s, nil
}

// Batching tells the delivery loop how to batch: maxEvents per request,
// waiting up to maxWait for a batch to fill; one event per request without batch.
func (s *Sink) Batching() (int, time.Duration) {
	if s.batch == nil {
		return 1, 0
	}
	return s.batch.MaxEvents, s.batch.MaxWait.D()
}

// Send POSTs the events: one request per event, or one per batch.
func (s *Sink) Send(ctx context.Context, events []*event.Event) error {
	if s.batch != nil {
		return s.sendBatch(ctx, events)
	}
	for _, e := range events {
		if err := s.sendOne(ctx, e); err != nil {
			return err
		}
	}
	return nil
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
		h.Set("ce-specversion", event.SpecVersion)
		h.Set("ce-id", e.ID)
		h.Set("ce-source", e.Source)
		h.Set("ce-type", e.Type)
		h.Set("ce-subject", e.Subject)
		h.Set("ce-time", e.Time.Format(time.RFC3339Nano))
		h.Set("ce-kbrule", e.Rule)
		h.Set("ce-kbcluster", e.Cluster)
		if e.Replay != "" {
			h.Set("ce-kbreplay", e.Replay)
		}
		if e.Reason != "" {
			h.Set("ce-kbreason", e.Reason)
		}
	}
	if err != nil {
		return sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
	}
	return s.post(ctx, h, body)
}

func (s *Sink) sendBatch(ctx context.Context, events []*event.Event) error {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, e := range events {
		if i > 0 {
			buf.WriteByte(',')
		}
		b, err := e.Structured()
		if err != nil {
			return sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	h := http.Header{}
	h.Set("Content-Type", "application/cloudevents-batch+json")
	return s.post(ctx, h, buf.Bytes())
}

func (s *Sink) post(ctx context.Context, h http.Header, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return sinks.Permanent(err)
	}
	for k, v := range s.headers {
		req.Header[k] = v
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if s.secret != nil {
		req.Header.Set(SignatureHeader, Sign(s.secret, s.now(), body))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", s.url, errors.Unwrap(err))
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // reuse the connection
	resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		err := fmt.Errorf("POST %s: %s: %s", s.url, resp.Status, strings.TrimSpace(string(snippet)))
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), s.now()); ok {
			return sinks.Throttle(err, d)
		}
		return err
	default:
		return sinks.Permanent(fmt.Errorf("POST %s: %s: %s", s.url, resp.Status, strings.TrimSpace(string(snippet))))
	}
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// Sign returns the X-Kubebridge-Signature value for body at time t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Close releases idle connections.
func (s *Sink) Close(context.Context) error {
	s.client.CloseIdleConnections()
	return nil
}

package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// podLeft is the event of pod name leaving the view (deleted).
func podLeft(ns, name string) *event.Event {
	e := pod(ns, name, "Failed", "")
	u := e.Object()
	return event.New(podRule, event.Deleted, u, nil, time.Now())
}

// incidents is a test receiver that keeps what a lifecycle receiver keeps:
// the open alerts by their key, after checking each request against the
// vendor's documented schema (check returns the key, whether the request
// opens or closes it, and a refusal as the vendor would answer it).
type incidents struct {
	mu      sync.Mutex
	open    map[string]bool
	refused []string
	keys    []string // each request's credential, as the receiver saw it
}

func (in *incidents) serve(t *testing.T, status int, check func(r *http.Request, body []byte) (key string, opens bool, credential string, err error)) *httptest.Server {
	in.open = map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key, opens, cred, err := check(r, body)
		in.mu.Lock()
		defer in.mu.Unlock()
		in.keys = append(in.keys, cred)
		if err != nil {
			in.refused = append(in.refused, err.Error())
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if opens {
			in.open[key] = true
		} else {
			delete(in.open, key)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (in *incidents) state() (open []string, refused []string, keys []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for k := range in.open {
		open = append(open, k)
	}
	slices.Sort(open)
	return open, slices.Clone(in.refused), slices.Clone(in.keys)
}

func maxRunes(errs *[]string, field, v string, n int) {
	if utf8.RuneCountInString(v) > n {
		*errs = append(*errs, fmt.Sprintf("%s: %d characters, more than %d", field, utf8.RuneCountInString(v), n))
	}
}

// pagerDutyEvent checks an Events API v2 request
// (developer.pagerduty.com/docs/events-api-v2/trigger-events and
// .../resolve-events): POST /v2/enqueue, JSON; routing_key and
// event_action (trigger, acknowledge, resolve) required; dedup_key at most
// 255 characters (required to resolve); a trigger's payload has summary
// (at most 1,024 characters), source and severity (critical, error,
// warning, info), timestamp ISO 8601 if set.
func pagerDutyEvent(r *http.Request, body []byte) (string, bool, string, error) {
	var b struct {
		RoutingKey  string `json:"routing_key"`
		EventAction string `json:"event_action"`
		DedupKey    string `json:"dedup_key"`
		Payload     *struct {
			Summary   string `json:"summary"`
			Source    string `json:"source"`
			Severity  string `json:"severity"`
			Timestamp string `json:"timestamp"`
		} `json:"payload"`
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v2/enqueue" || r.Header.Get("Content-Type") != "application/json" {
		return "", false, "", fmt.Errorf("%s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", false, "", err
	}
	var errs []string
	if b.RoutingKey == "" {
		errs = append(errs, "routing_key: required")
	}
	if b.DedupKey == "" {
		errs = append(errs, "dedup_key: required here (a resolve needs it)")
	}
	maxRunes(&errs, "dedup_key", b.DedupKey, 255)
	switch b.EventAction {
	case "trigger":
		if b.Payload == nil {
			errs = append(errs, "payload: required to trigger")
			break
		}
		if b.Payload.Summary == "" || b.Payload.Source == "" {
			errs = append(errs, "payload.summary and payload.source are required")
		}
		maxRunes(&errs, "payload.summary", b.Payload.Summary, 1024)
		if !slices.Contains([]string{"critical", "error", "warning", "info"}, b.Payload.Severity) {
			errs = append(errs, "payload.severity: "+b.Payload.Severity)
		}
		if _, err := time.Parse(time.RFC3339, b.Payload.Timestamp); b.Payload.Timestamp != "" && err != nil {
			errs = append(errs, "payload.timestamp: "+err.Error())
		}
	case "resolve", "acknowledge":
	default:
		errs = append(errs, "event_action: "+b.EventAction)
	}
	if errs != nil {
		return "", false, b.RoutingKey, errors.New(strings.Join(errs, "; "))
	}
	return b.DedupKey, b.EventAction == "trigger", b.RoutingKey, nil
}

var opsgenieClose = regexp.MustCompile(`^/v2/alerts/([^/]+)/close$`)

// opsgenieAlert checks an Alert API request (docs.opsgenie.com/docs/alert-api):
// Authorization: GenieKey <key>; create is POST /v2/alerts with message
// (required, at most 130 characters), alias (512), description (15,000),
// source (100), entity (512), tags (at most 20, each 50), priority P1-P5;
// close is POST /v2/alerts/<identifier>/close?identifierType=alias with
// optional user, source (100) and note (25,000).
func opsgenieAlert(r *http.Request, body []byte) (string, bool, string, error) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "GenieKey ")
	if !ok || key == "" || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		return "", false, key, fmt.Errorf("%s %s, Authorization %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
	}
	var errs []string
	if m := opsgenieClose.FindStringSubmatch(r.URL.EscapedPath()); m != nil {
		var b struct{ User, Source, Note string }
		if err := json.Unmarshal(body, &b); err != nil {
			return "", false, key, err
		}
		if r.URL.Query().Get("identifierType") != "alias" {
			errs = append(errs, "identifierType: "+r.URL.RawQuery)
		}
		maxRunes(&errs, "source", b.Source, 100)
		maxRunes(&errs, "note", b.Note, 25000)
		if errs != nil {
			return "", false, key, errors.New(strings.Join(errs, "; "))
		}
		return r.URL.Path[len("/v2/alerts/") : len(r.URL.Path)-len("/close")], false, key, nil
	}
	if r.URL.Path != "/v2/alerts" || r.URL.RawQuery != "" {
		return "", false, key, fmt.Errorf("not an alert API path: %s?%s", r.URL.Path, r.URL.RawQuery)
	}
	var b struct {
		Message, Alias, Description, Source, Entity, Priority string
		Tags                                                  []string
		Details                                               map[string]string
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", false, key, err
	}
	if b.Message == "" {
		errs = append(errs, "message: required")
	}
	maxRunes(&errs, "message", b.Message, 130)
	maxRunes(&errs, "alias", b.Alias, 512)
	maxRunes(&errs, "description", b.Description, 15000)
	maxRunes(&errs, "source", b.Source, 100)
	maxRunes(&errs, "entity", b.Entity, 512)
	if len(b.Tags) > 20 {
		errs = append(errs, "tags: more than 20")
	}
	for _, tag := range b.Tags {
		maxRunes(&errs, "tags", tag, 50)
	}
	if b.Priority != "" && !slices.Contains([]string{"P1", "P2", "P3", "P4", "P5"}, b.Priority) {
		errs = append(errs, "priority: "+b.Priority)
	}
	if errs != nil {
		return "", false, key, errors.New(strings.Join(errs, "; "))
	}
	return b.Alias, true, key, nil
}

// The PagerDuty and Opsgenie presets, each against a receiver that checks
// its vendor's documented schema and keeps the open alerts by their key:
// an object that enters the view opens one (a name longer than any field
// takes is cut, not refused), one that leaves closes it, with the same key;
// the API key comes from its file and a rotated one is read again after
// the receiver's 401, the event retried rather than lost.
func TestLifecyclePresetsOpenAndCloseAlerts(t *testing.T) {
	old := sinks.CheckEvery
	sinks.CheckEvery = time.Hour // only the 401 makes the sink read the file again
	t.Cleanup(func() { sinks.CheckEvery = old })
	long := strings.Repeat("n", 300)
	for _, tc := range []struct {
		preset, path, credential string
		status                   int
		check                    func(*http.Request, []byte) (string, bool, string, error)
	}{
		{"pagerduty", "/v2/enqueue", "routingKey", http.StatusAccepted, pagerDutyEvent},
		{"opsgenie", "/v2/alerts", "apiKey", http.StatusAccepted, opsgenieAlert},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			in := &incidents{}
			want := "key-one"
			var wmu sync.Mutex
			srv := in.serve(t, tc.status, func(r *http.Request, body []byte) (string, bool, string, error) {
				return tc.check(r, body)
			})
			// The receiver refuses any key but the current one with 401.
			gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				_, _, cred, _ := tc.check(r.Clone(r.Context()), body)
				wmu.Lock()
				ok := cred == want
				wmu.Unlock()
				if !ok {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				r.Body = io.NopCloser(strings.NewReader(string(body)))
				srv.Config.Handler.ServeHTTP(w, r)
			}))
			t.Cleanup(gate.Close)
			keyFile := filepath.Join(t.TempDir(), "key")
			must(t, os.WriteFile(keyFile, []byte("key-one\n"), 0o600))
			s := presetSink(t, gate.URL+tc.path, tc.preset, nil, func(c *Config) { c.CredentialFiles = map[string]string{tc.credential: keyFile} })
			ctx := context.Background()
			must(t, s.Send(ctx, []*event.Event{pod("prod", "web-1", "Failed", "OOMKilled"), pod("prod", long, "Failed", ""), pod("prod", "web-2", "Failed", "")}))
			must(t, s.Send(ctx, []*event.Event{podLeft("prod", "web-1")}))
			open, refused, _ := in.state()
			if len(refused) > 0 {
				t.Fatalf("the receiver refused: %v", refused)
			}
			if len(open) != 2 || !strings.Contains(open[0]+open[1], "uid-web-2") || strings.Contains(strings.Join(open, " "), "uid-web-1") {
				t.Fatalf("open alerts %q, want web-2's and the long one's", open)
			}

			// Rotated: the old key is refused (401, retried), the file is
			// read again, and the close goes through with the new key.
			wmu.Lock()
			want = "key-two"
			wmu.Unlock()
			must(t, os.WriteFile(keyFile, []byte("key-two\n"), 0o600))
			err := s.Send(ctx, []*event.Event{podLeft("prod", "web-2")})
			if r, ok := sinks.DestinationReason(err); !ok || r != sinks.ReasonUnauthorized {
				t.Fatalf("with the old key: %v, want a destination error (retried, not lost)", err)
			}
			must(t, s.Send(ctx, []*event.Event{podLeft("prod", "web-2")}))
			open, _, keys := in.state()
			if len(open) != 1 || strings.Contains(open[0], "uid-web-2") {
				t.Errorf("open alerts %q after web-2 left, want only the long one's", open)
			}
			if keys[len(keys)-1] != "key-two" {
				t.Errorf("the receiver saw %q", keys[len(keys)-1])
			}
		})
	}
}

// credentialFiles and the templates that read them are checked against
// each other at load, naming the key.
func TestCredentialFilesValidation(t *testing.T) {
	base := func() *Config {
		return &Config{URL: "https://events.pagerduty.com/v2/enqueue", Mode: "binary", Timeout: config.Duration(time.Second)}
	}
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string // "" = valid
	}{
		{"preset with its key", func(c *Config) {
			c.Preset, c.CredentialFiles = "pagerduty", map[string]string{"routingKey": "/etc/kubebridge/pd"}
		}, ""},
		{"preset without its key", func(c *Config) { c.Preset = "pagerduty" },
			"preset: reads credentials.routingKey, which credentialFiles does not declare (credentialFiles: {routingKey: /etc/kubebridge/...})"},
		{"a template reads an undeclared one", func(c *Config) {
			c.Request = &Request{Method: "POST", Headers: map[string]string{"X-Key": "credentials.kee"}}
		}, "request.headers.X-Key: reads credentials.kee, which credentialFiles does not declare"},
		{"declared, read by nothing", func(c *Config) {
			c.Preset, c.CredentialFiles = "pagerduty", map[string]string{"routingKey": "/k", "spare": "/s"}
		}, "credentialFiles.spare: no template reads credentials.spare"},
		{"not a CEL name", func(c *Config) {
			c.Preset, c.CredentialFiles = "pagerduty", map[string]string{"routingKey": "/k", "api-key": "/s"}
		}, `credentialFiles.api-key: a credential's name must be a CEL identifier`},
		{"without a request", func(c *Config) { c.CredentialFiles = map[string]string{"k": "/k"} },
			"credentialFiles: only a request shaped by CEL (request or preset) reads credentialFiles"},
		{"the whole map", func(c *Config) {
			c.Request = &Request{Method: "POST", Body: `{"all": credentials}`}
		}, "body: credentials is read by name only: credentials.<name>"},
		{"a computed name", func(c *Config) {
			c.Request, c.CredentialFiles = &Request{Method: "POST", Body: `{"k": credentials[object.metadata.name]}`}, map[string]string{"k": "/k"}
		}, "body: credentials is read by name only"},
		{"Authorization twice", func(c *Config) {
			c.Preset, c.CredentialFiles, c.BearerTokenFile = "opsgenie", map[string]string{"apiKey": "/k"}, "/t"
		}, "preset: the Authorization header is bearerTokenFile's: set one or the other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.set(c)
			if c.Request != nil && c.Request.Validate() != nil && tc.want == "" {
				t.Fatal(c.Request.Validate())
			}
			err := c.Validate()
			if c.Request != nil {
				err = errors.Join(err, c.Request.Validate())
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v\nwant %q", err, tc.want)
			}
		})
	}
}

// A template that fails on a credential's value never quotes it (Go's
// regexp errors quote the pattern): the error goes to logs and
// dead-letters.
func TestTemplateErrorsNeverQuoteACredential(t *testing.T) {
	srv, got := recordRequests(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	must(t, os.WriteFile(keyFile, []byte("s3cr3t-(value\n"), 0o600))
	s := presetSink(t, srv.URL, "", &Request{Method: "POST", Body: `{"n": "x".matches(credentials.key)}`},
		func(c *Config) { c.CredentialFiles = map[string]string{"key": keyFile} })
	err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "")})
	if !sinks.IsPermanent(err) {
		t.Fatalf("got %v, want the event's permanent refusal", err)
	}
	if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "<redacted>") || len(got()) != 0 {
		t.Errorf("%v (%d requests)", err, len(got()))
	}
}

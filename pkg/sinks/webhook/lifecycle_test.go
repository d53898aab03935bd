package webhook

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
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
		{"pagerduty", "/v2/enqueue", "routingKey", http.StatusAccepted, testenv.PagerDutyEvent},
		{"opsgenie", "/v2", "apiKey", http.StatusAccepted, testenv.OpsgenieAlert},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			want := "key-one"
			var wmu sync.Mutex
			in, srv := testenv.ServeIncidents(t, tc.status, tc.check)
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
			open, refused, _ := in.State()
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
			open, _, keys := in.State()
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

// A 400 from PagerDuty that blames the routing key is the config's fault,
// not the event's: retried (a fixed key file is read again), never
// dead-lettered; a 400 about the event stays its own permanent refusal. A
// receiver that echoes the key in its answer does not put it in the error.
func TestPagerDutyRefusalOfTheKeyIsTheConfigs(t *testing.T) {
	answer := `{"status":"invalid event","message":"Event object is invalid","errors":["Length of 'routing_key' is incorrect (should be 32 characters)"]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusBadRequest)
		if strings.Contains(string(body), "short-key") {
			_, _ = io.WriteString(w, answer+` (routing_key "short-key")`)
			return
		}
		_, _ = io.WriteString(w, `{"status":"invalid event","errors":["'payload.summary' is missing"]}`)
	}))
	t.Cleanup(srv.Close)
	keyFile := filepath.Join(t.TempDir(), "key")
	must(t, os.WriteFile(keyFile, []byte("short-key\n"), 0o600))
	s := presetSink(t, srv.URL+"/v2/enqueue", "pagerduty", nil, func(c *Config) { c.CredentialFiles = map[string]string{"routingKey": keyFile} })
	err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "")})
	if r, ok := sinks.DestinationReason(err); !ok || r != sinks.ReasonConfig {
		t.Errorf("a refused key: %v, want a config error (retried, never dead-lettered)", err)
	}
	if err == nil || strings.Contains(err.Error(), "short-key") || !strings.Contains(err.Error(), "<redacted>") {
		t.Errorf("the echoed key is in the error: %v", err)
	}
	must(t, os.WriteFile(keyFile, []byte("a-key-of-thirty-two-characters!!\n"), 0o600))
	s = presetSink(t, srv.URL+"/v2/enqueue", "pagerduty", nil, func(c *Config) { c.CredentialFiles = map[string]string{"routingKey": keyFile} })
	if err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", "")}); !sinks.IsPermanent(err) {
		t.Errorf("a refused event: %v, want its permanent refusal", err)
	}
}

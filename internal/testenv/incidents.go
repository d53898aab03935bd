package testenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Incidents is a receiver that keeps what a lifecycle receiver (PagerDuty,
// Opsgenie) keeps:
// the open alerts by their key, after checking each request against the
// vendor's documented schema (check returns the key, whether the request
// opens or closes it, and a refusal as the vendor would answer it).
type Incidents struct {
	mu      sync.Mutex
	open    map[string]bool
	refused []string
	keys    []string // each request's credential, as the receiver saw it
}

// ServeIncidents starts a receiver that checks each request with check
// (which returns the alert's key, whether the request opens or closes it,
// the credential it carried, and a refusal as the vendor would answer
// it: 400) and answers status to the others.
func ServeIncidents(t testing.TB, status int, check func(r *http.Request, body []byte) (key string, opens bool, credential string, err error)) (*Incidents, *httptest.Server) {
	in := &Incidents{open: map[string]bool{}}
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
	return in, srv
}

// State returns the open alerts' keys (sorted), the refusals, and the
// credential each request carried, in order.
func (in *Incidents) State() (open []string, refused []string, keys []string) {
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

// PagerDutyEvent checks an Events API v2 request
// (developer.pagerduty.com/docs/events-api-v2/trigger-events and
// .../resolve-events): POST /v2/enqueue, JSON; routing_key and
// event_action (trigger, acknowledge, resolve) required; dedup_key at most
// 255 characters (required to resolve); a trigger's payload has summary
// (at most 1,024 characters), source and severity (critical, error,
// warning, info), timestamp ISO 8601 if set.
func PagerDutyEvent(r *http.Request, body []byte) (string, bool, string, error) {
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

// OpsgenieAlert checks an Alert API request (docs.opsgenie.com/docs/alert-api):
// Authorization: GenieKey <key>; create is POST /v2/alerts with message
// (required, at most 130 characters), alias (512), description (15,000),
// source (100), entity (512), tags (at most 20, each 50), priority P1-P5;
// close is POST /v2/alerts/<identifier>/close?identifierType=alias with
// optional user, source (100) and note (25,000).
func OpsgenieAlert(r *http.Request, body []byte) (string, bool, string, error) {
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

package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/fieldpath"
)

func presetSink(t *testing.T, url, preset string, r *Request, extra func(*Config)) *Sink {
	t.Helper()
	c := &Config{URL: url, Mode: "binary", Timeout: config.Duration(5 * time.Second), Preset: preset, Request: r}
	if extra != nil {
		extra(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// Each preset's request, as its receiver's documentation says it must be
// (the check beside each), including for an object whose name is longer
// than the receiver takes: cut, ending in "…", not refused.
func TestPresetsFollowTheirReceiversSchemas(t *testing.T) {
	long := strings.Repeat("n", 50_000)
	events := []*event.Event{pod("prod", "web-1", "Failed", "OOMKilled"), pod("prod", long, "Failed", "")}
	for _, tc := range []struct {
		preset string
		check  func(t *testing.T, r seen)
	}{
		{"slack", func(t *testing.T, r seen) { // api.slack.com/messaging/webhooks: {"text": string}, 40,000 characters
			var b struct {
				Text string `json:"text"`
			}
			mustJSON(t, r.body, &b)
			if b.Text == "" || utf8.RuneCountInString(b.Text) > 40_000 {
				t.Errorf("text of %d characters", utf8.RuneCountInString(b.Text))
			}
		}},
		{"teams", func(t *testing.T, r seen) { // a message with an Adaptive Card attachment (learn.microsoft.com, Teams workflows)
			var b struct {
				Type        string `json:"type"`
				Attachments []struct {
					ContentType string `json:"contentType"`
					Content     struct {
						Type    string           `json:"type"`
						Version string           `json:"version"`
						Body    []map[string]any `json:"body"`
					} `json:"content"`
				} `json:"attachments"`
			}
			mustJSON(t, r.body, &b)
			if b.Type != "message" || len(b.Attachments) != 1 || b.Attachments[0].ContentType != "application/vnd.microsoft.card.adaptive" ||
				b.Attachments[0].Content.Type != "AdaptiveCard" || b.Attachments[0].Content.Version != "1.4" || len(b.Attachments[0].Content.Body) == 0 {
				t.Errorf("not a Teams Adaptive Card message: %.300s", r.body)
			}
			if text, _ := b.Attachments[0].Content.Body[0]["text"].(string); utf8.RuneCountInString(text) > 2000 {
				t.Errorf("card text of %d characters", utf8.RuneCountInString(text))
			}
		}},
		{"github-dispatch", func(t *testing.T, r seen) { // docs.github.com: event_type ≤ 100 characters, client_payload ≤ 10 keys
			var b struct {
				EventType     string         `json:"event_type"`
				ClientPayload map[string]any `json:"client_payload"`
			}
			mustJSON(t, r.body, &b)
			if b.EventType == "" || utf8.RuneCountInString(b.EventType) > 100 || len(b.ClientPayload) == 0 || len(b.ClientPayload) > 10 {
				t.Errorf("event_type %q, %d payload keys", b.EventType, len(b.ClientPayload))
			}
			if r.header.Get("Accept") != "application/vnd.github+json" || r.header.Get("X-GitHub-Api-Version") == "" || r.header.Get("Authorization") != "Bearer ghp-test" {
				t.Errorf("headers %v", r.header)
			}
		}},
		{"alertmanager", func(t *testing.T, r seen) { // prometheus.io/docs/alerting/latest/clients: a list of alerts with labels
			var b []struct {
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
				StartsAt    time.Time         `json:"startsAt"`
				EndsAt      time.Time         `json:"endsAt"`
			}
			mustJSON(t, r.body, &b)
			if len(b) != 1 || b[0].Labels["alertname"] != "failed-pods" || b[0].Labels["uid"] == "" || !b[0].EndsAt.After(b[0].StartsAt) ||
				b[0].Labels["pod"] != b[0].Labels["name"] || b[0].Labels["name"] == "" {
				t.Errorf("alerts %.300s", r.body)
			}
		}},
		{"generic", func(t *testing.T, r seen) {
			var b map[string]any
			mustJSON(t, r.body, &b)
			if b["change"] != "added" || b["object"] == nil {
				t.Errorf("body %.300s", r.body)
			}
		}},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			srv, got := recordRequests(t)
			tok := filepath.Join(t.TempDir(), "token")
			must(t, os.WriteFile(tok, []byte("ghp-test\n"), 0o600))
			s := presetSink(t, srv.URL, tc.preset, nil, func(c *Config) { c.BearerTokenFile = tok })
			if err := s.Send(context.Background(), events); err != nil {
				t.Fatal(err)
			}
			reqs := got()
			if len(reqs) != 2 {
				t.Fatalf("%d requests", len(reqs))
			}
			for _, r := range reqs {
				if r.method != http.MethodPost || r.header.Get("Content-Type") != "application/json" {
					t.Errorf("%s, Content-Type %q", r.method, r.header.Get("Content-Type"))
				}
				tc.check(t, r)
			}
			// Where the receiver limits a text (Slack, Teams), the long name
			// is cut there, visibly (the checks above bound the lengths).
			if (tc.preset == "slack" || tc.preset == "teams") && (strings.Contains(string(reqs[1].body), long) || !strings.Contains(string(reqs[1].body), "…")) {
				t.Errorf("the long name was not cut visibly: %d bytes", len(reqs[1].body))
			}
		})
	}
}

// A sink's request overrides a preset field by field; headers merge.
func TestPresetOverrides(t *testing.T) {
	srv, got := recordRequests(t)
	s := presetSink(t, srv.URL, "github-dispatch", &Request{Method: "POST", Body: `{"event_type": "custom", "client_payload": {}}`,
		Headers: map[string]string{"X-Extra": `'1'`}}, nil)
	must(t, s.Send(context.Background(), []*event.Event{pod("a", "p", "Failed", "")}))
	r := got()[0]
	if string(r.body) != `{"client_payload":{},"event_type":"custom"}` || r.header.Get("X-Extra") != "1" || r.header.Get("Accept") != "application/vnd.github+json" {
		t.Errorf("body %s, headers %v", r.body, r.header)
	}
	c := &Config{URL: "http://x", Mode: "binary", Timeout: config.Duration(time.Second), Preset: "pagerdooty"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `unknown preset "pagerdooty" (have: alertmanager, generic, github-dispatch, opsgenie, pagerduty, slack, teams)`) {
		t.Errorf("unknown preset: %v", err)
	}
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%.300s: %v", b, err)
	}
}

// The alertmanager preset labels the object by its kind, as
// kube-state-metrics' alerts do (pod: web-1); a kind that would collide
// with another label (a Namespace) is labelled object instead of failing.
func TestAlertmanagerPresetLabelsTheKind(t *testing.T) {
	srv, got := recordRequests(t)
	s := presetSink(t, srv.URL, "alertmanager", nil, nil)
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
	ns.SetName("team-a")
	ns.SetUID("uid-ns")
	if err := s.Send(context.Background(), []*event.Event{pod("prod", "web-1", "Failed", ""), event.New(podRule, event.Added, ns, nil, time.Now())}); err != nil {
		t.Fatal(err)
	}
	var labels []map[string]string
	for _, r := range got() {
		var b []struct {
			Labels map[string]string `json:"labels"`
		}
		mustJSON(t, r.body, &b)
		labels = append(labels, b[0].Labels)
	}
	if len(labels) != 2 || labels[0]["pod"] != "web-1" || labels[0]["namespace"] != "prod" ||
		labels[1]["object"] != "team-a" || labels[1]["namespace"] != "" || labels[1]["name"] != "team-a" {
		t.Fatalf("labels %v", labels)
	}
}

// The chat presets say what an update changed, in the rule's paths, with
// keyed list elements named; an update found at a start, without its
// previous state, says it cannot tell rather than guess.
func TestSlackPresetSaysWhatChanged(t *testing.T) {
	images, err := fieldpath.Parse("spec.template.spec.containers[*].image")
	must(t, err)
	rule := &event.Rule{Name: "images", Cluster: "prod", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
		IncludeObject: true, Changed: []fieldpath.Path{images}}
	deploy := func(image, env string) *unstructured.Unstructured {
		d := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
			"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{
				map[string]any{"name": "sidecar", "image": "envoy:1"},
				map[string]any{"name": "web", "image": image, "env": []any{map[string]any{"name": "A", "value": env}}}}}}}}}
		d.SetNamespace("team-a")
		d.SetName("web")
		d.SetUID("uid-web")
		return d
	}
	srv, got := recordRequests(t)
	s := presetSink(t, srv.URL, "slack", nil, nil)
	now := time.Now()
	if err := s.Send(context.Background(), []*event.Event{
		event.Build(rule, event.Transition{Change: event.Updated, Object: deploy("web:2", "x"), Old: deploy("web:1", "y"), Time: now}),
		event.Build(rule, event.Transition{Change: event.Updated, Object: deploy("web:3", "x"), Time: now}),
	}); err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, r := range got() {
		var b struct{ Text string }
		mustJSON(t, r.body, &b)
		texts = append(texts, b.Text)
	}
	want := []string{
		"updated Deployment team-a/web (rule images, cluster prod)\nspec.template.spec.containers[name=web].image: web:1 → web:2",
		"updated Deployment team-a/web (rule images, cluster prod)\n" + unknownChanges,
	}
	if len(texts) != 2 || texts[0] != want[0] || texts[1] != want[1] {
		t.Fatalf("texts\n%q\nwant\n%q", texts, want)
	}
}

// A Kubernetes Event says what happened to the object it involves and how
// often: a recurring Event (its count or series grows) is told as one
// incident, "5× in 10 min", for core/v1 and events.k8s.io/v1 alike, and a
// chat message says nothing more (what changed is the count and
// timestamps, which that says).
func TestPresetsTellAKubernetesEvent(t *testing.T) {
	rule := &event.Rule{Name: "warnings", Cluster: "prod", GVR: schema.GroupVersionResource{Version: "v1", Resource: "events"}, IncludeObject: true}
	core := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Event",
		"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container web",
		"involvedObject": map[string]any{"kind": "Pod", "namespace": "team-a", "name": "web-1"},
		"count":          int64(5), "firstTimestamp": "2026-11-27T03:00:00Z", "lastTimestamp": "2026-11-27T03:10:00Z"}}
	core.SetNamespace("team-a")
	core.SetName("web-1.1")
	once := core.DeepCopy()
	once.Object["count"] = int64(1)
	once.Object["firstTimestamp"] = nil // as Kubernetes serializes an unset one
	series := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "events.k8s.io/v1", "kind": "Event",
		"type": "Normal", "reason": "ScalingReplicaSet", "note": "Scaled up replica set web-6d4 to 3",
		"regarding": map[string]any{"kind": "Deployment", "namespace": "team-a", "name": "web"},
		"eventTime": "2026-11-27T03:00:00.000000Z", "series": map[string]any{"count": int64(3), "lastObservedTime": "2026-11-27T03:00:40.000000Z"}}}
	series.SetNamespace("team-a")
	series.SetName("web.2")
	srv, got := recordRequests(t)
	s := presetSink(t, srv.URL, "slack", nil, nil)
	now := time.Now()
	var evs []*event.Event
	before := core.DeepCopy()
	before.Object["count"], before.Object["lastTimestamp"] = int64(4), "2026-11-27T03:08:00Z"
	for _, o := range []*unstructured.Unstructured{core, once, series} {
		evs = append(evs, event.Build(rule, event.Transition{Change: event.Updated, Object: o, Old: before, Time: now}))
	}
	if err := s.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, r := range got() {
		var b struct{ Text string }
		mustJSON(t, r.body, &b)
		texts = append(texts, b.Text)
	}
	want := []string{
		"Warning BackOff on Pod team-a/web-1: Back-off restarting failed container web (5× in 10 min) (rule warnings, cluster prod)",
		"Warning BackOff on Pod team-a/web-1: Back-off restarting failed container web (rule warnings, cluster prod)",
		"Normal ScalingReplicaSet on Deployment team-a/web: Scaled up replica set web-6d4 to 3 (3× in 40 s) (rule warnings, cluster prod)",
	}
	if !slices.Equal(texts, want) {
		t.Fatalf("texts\n%q\nwant\n%q", texts, want)
	}
	srv, got = recordRequests(t)
	if err := presetSink(t, srv.URL, "teams", nil, nil).Send(context.Background(), evs[:1]); err != nil {
		t.Fatal(err)
	}
	if body := string(got()[0].body); !strings.Contains(body, "5× in 10 min") || strings.Contains(body, "count") {
		t.Errorf("the Teams card of a recurring Event: %s", body)
	}
}

// A CRD of kind Event is not told as a Kubernetes Event (its fields may
// be anything): it gets the plain summary, never a template error.
func TestPresetsTellOnlyKubernetesEventsAsEvents(t *testing.T) {
	rule := &event.Rule{Name: "crd", Cluster: "prod", GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "events"}, IncludeObject: true}
	crd := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Event",
		"firstTimestamp": "yesterday", "lastTimestamp": "today", "count": int64(3), "involvedObject": "not a map"}}
	crd.SetNamespace("a")
	crd.SetName("e")
	srv, got := recordRequests(t)
	s := presetSink(t, srv.URL, "slack", nil, nil)
	if err := s.Send(context.Background(), []*event.Event{event.Build(rule, event.Transition{Change: event.Added, Object: crd, Time: time.Now()})}); err != nil {
		t.Fatal(err)
	}
	var b struct{ Text string }
	mustJSON(t, got()[0].body, &b)
	if b.Text != "added Event a/e (rule crd, cluster prod)" {
		t.Fatalf("text %q", b.Text)
	}
}

// With include: [owners], a message names the top owner: "Pod
// team-a/web-1 (Deployment web)", and for a Kubernetes Event the involved
// object's; the generic preset carries the chain and the involved object.
// Without a chain (none resolved, or no owners) the line is as before.
func TestPresetsNameTheTopOwner(t *testing.T) {
	chain := []event.Owner{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-6d4", UID: "rs"},
		{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Labels: map[string]string{"team": "payments"}}}
	pods := &event.Rule{Name: "pods", Cluster: "prod", GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, IncludeObject: true, IncludeOwners: true}
	events := &event.Rule{Name: "warnings", Cluster: "prod", GVR: schema.GroupVersionResource{Version: "v1", Resource: "events"}, IncludeObject: true, IncludeOwners: true}
	p := pod("team-a", "web-1", "Running", "").Object()
	ev := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Event",
		"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container web",
		"involvedObject": map[string]any{"kind": "Pod", "namespace": "team-a", "name": "web-1"}}}
	ev.SetNamespace("team-a")
	ev.SetName("web-1.1")
	ev.SetUID("ev-uid")
	now := time.Now()
	evs := []*event.Event{
		event.Build(pods, event.Transition{Change: event.Added, Object: p, Time: now, Related: &event.Related{Owners: chain}}),
		event.Build(events, event.Transition{Change: event.Added, Object: ev, Time: now, Related: &event.Related{
			Involved: &event.Involved{APIVersion: "v1", Kind: "Pod", Namespace: "team-a", Name: "web-1", Owners: chain, Found: true}}}),
		event.Build(pods, event.Transition{Change: event.Added, Object: p, Time: now, Related: &event.Related{}}),
		event.Build(events, event.Transition{Change: event.Added, Object: ev, Time: now}),
	}
	want := []string{
		"added Pod team-a/web-1 (Deployment web) (rule pods, cluster prod)",
		"Warning BackOff on Pod team-a/web-1 (Deployment web): Back-off restarting failed container web (rule warnings, cluster prod)",
		"added Pod team-a/web-1 (rule pods, cluster prod)",
		"Warning BackOff on Pod team-a/web-1: Back-off restarting failed container web (rule warnings, cluster prod)",
	}
	for _, preset := range []string{"slack", "teams", "pagerduty", "generic"} {
		t.Run(preset, func(t *testing.T) {
			srv, got := recordRequests(t)
			key := filepath.Join(t.TempDir(), "key")
			must(t, os.WriteFile(key, []byte("R0UTINGKEY00000000000000000000XX"), 0o600))
			s := presetSink(t, srv.URL, preset, nil, func(c *Config) {
				if preset == "pagerduty" {
					c.CredentialFiles = map[string]string{"routingKey": key}
				}
			})
			if err := s.Send(context.Background(), evs); err != nil {
				t.Fatal(err)
			}
			reqs := got()
			if len(reqs) != len(want) {
				t.Fatalf("%d requests", len(reqs))
			}
			for i, r := range reqs {
				switch preset {
				case "generic":
					var b struct {
						Owners   []event.Owner  `json:"owners"`
						Involved map[string]any `json:"involved"`
					}
					mustJSON(t, r.body, &b)
					if i == 0 && (len(b.Owners) != 2 || b.Owners[1].Labels["team"] != "payments") || i == 1 && b.Involved["name"] != "web-1" ||
						i >= 2 && (len(b.Owners) != 0 || b.Involved != nil) {
						t.Errorf("body %d: %s", i, r.body)
					}
				default:
					if !strings.Contains(string(r.body), want[i]) {
						t.Errorf("body %d: %s\nwant it to say %q", i, r.body, want[i])
					}
				}
			}
		})
	}
}

package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/fieldpath"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func digestSink(t *testing.T, url, preset string, r *Request, d config.Digest) *Sink {
	t.Helper()
	c := &Config{URL: url, Mode: "binary", Timeout: config.Duration(5 * time.Second), Preset: preset, Request: r}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.RendersDigests() {
		t.Fatalf("preset %q renders no digest", preset)
	}
	s, err := create(context.Background(), sinks.Settings{Config: c, Digest: &d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s.(*Sink)
}

// digestEvents are a period's events in two namespaces: three entered
// team-a (one is a Deployment whose image changed), one left team-b.
func digestEvents(t *testing.T) []*event.Event {
	images, err := fieldpath.Parse("spec.template.spec.containers[*].image")
	must(t, err)
	rule := &event.Rule{Name: "images", Cluster: "prod", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
		IncludeObject: true, Changed: []fieldpath.Path{images}}
	deploy := func(ns, name, image string) *unstructured.Unstructured {
		d := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
			"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{
				map[string]any{"name": "web", "image": image}}}}}}}
		d.SetNamespace(ns)
		d.SetName(name)
		d.SetUID(types.UID("uid-" + ns + "-" + name))
		return d
	}
	now := time.Now()
	return []*event.Event{
		event.Build(rule, event.Transition{Change: event.Deleted, Object: deploy("team-b", "old", "x:1"), Time: now}),
		event.Build(rule, event.Transition{Change: event.Updated, Object: deploy("team-a", "web", "web:2"), Old: deploy("team-a", "web", "web:1"), Time: now}),
		event.Build(rule, event.Transition{Change: event.Added, Object: deploy("team-a", "api", "api:1"), Time: now}),
		event.Build(rule, event.Transition{Change: event.Added, Object: deploy("team-a", "db", "db:1"), Time: now}),
	}
}

// A digest is one Slack message per group, in Slack's documented schema
// ({"text"}, at most 40,000 characters): a title that counts what entered,
// changed and left, then a line per object, entered first, an update with
// what changed; past max the rest are counted, not listed, and delivered
// with the message all the same.
func TestSlackDigestListsWhatEnteredAndLeft(t *testing.T) {
	srv, got := recordRequests(t)
	s := digestSink(t, srv.URL, "slack", nil, config.Digest{Every: config.Duration(5 * time.Minute), GroupBy: "object.metadata.namespace", Max: 2})
	if err := s.Send(context.Background(), digestEvents(t)); err != nil {
		t.Fatal(err)
	}
	reqs := got()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want one per namespace", len(reqs))
	}
	var texts []string
	for _, r := range reqs {
		var b struct {
			Text string `json:"text"`
		}
		mustJSON(t, r.body, &b)
		if b.Text == "" || utf8.RuneCountInString(b.Text) > 40_000 {
			t.Errorf("text of %d characters", utf8.RuneCountInString(b.Text))
		}
		texts = append(texts, b.Text)
	}
	want := []string{
		"kubebridge digest for team-b (cluster prod, 5m0s): 0 entered, 0 changed, 1 left\n• deleted Deployment team-b/old",
		"kubebridge digest for team-a (cluster prod, 5m0s): 2 entered, 1 changed, 0 left\n" +
			"• added Deployment team-a/api\n• added Deployment team-a/db\n… and 1 more",
	}
	if len(texts) != 2 || texts[0] != want[0] || texts[1] != want[1] {
		t.Errorf("texts\n%q\nwant\n%q", texts, want)
	}

	// With room for all, the update says what changed.
	srv, got = recordRequests(t)
	s = digestSink(t, srv.URL, "slack", nil, config.Digest{Every: config.Duration(time.Minute), Max: 50})
	if err := s.Send(context.Background(), digestEvents(t)); err != nil {
		t.Fatal(err)
	}
	if reqs := got(); len(reqs) != 1 || !strings.Contains(string(reqs[0].body), `• updated Deployment team-a/web: spec.template.spec.containers[name=web].image: web:1 → web:2`) {
		t.Errorf("one group: %d requests, %s", len(reqs), reqs[0].body)
	}
}

// Teams gets an Adaptive Card; generic the items with their objects, for
// a consumer that applies them by uid.
func TestTeamsAndGenericDigests(t *testing.T) {
	srv, got := recordRequests(t)
	s := digestSink(t, srv.URL, "teams", nil, config.Digest{Every: config.Duration(time.Minute), Max: 50})
	must(t, s.Send(context.Background(), digestEvents(t)))
	var card struct {
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
	mustJSON(t, got()[0].body, &card)
	if card.Type != "message" || len(card.Attachments) != 1 || card.Attachments[0].ContentType != "application/vnd.microsoft.card.adaptive" ||
		card.Attachments[0].Content.Version != "1.4" || len(card.Attachments[0].Content.Body) != 2 ||
		!strings.Contains(card.Attachments[0].Content.Body[1]["text"].(string), "• deleted Deployment team-b/old") {
		t.Errorf("not the digest as a Teams Adaptive Card: %s", got()[0].body)
	}

	srv, got = recordRequests(t)
	s = digestSink(t, srv.URL, "generic", nil, config.Digest{Every: config.Duration(time.Minute), Max: 50})
	must(t, s.Send(context.Background(), digestEvents(t)))
	var b struct {
		Entered, Changed, Left, More int
		Items                        []struct {
			ID, Change, UID string
			Object          map[string]any
		}
	}
	mustJSON(t, got()[0].body, &b)
	if b.Entered != 2 || b.Changed != 1 || b.Left != 1 || b.More != 0 || len(b.Items) != 4 || b.Items[3].Change != "deleted" ||
		b.Items[3].UID != "uid-team-b-old" || b.Items[0].ID == "" || b.Items[0].Object == nil {
		t.Errorf("generic digest %s", got()[0].body)
	}
}

// Each group fares as its request does: a receiver refusing one group's
// fails its events alone.
func TestDigestGroupsFareApart(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b struct{ Group string }
		if err := json.NewDecoder(r.Body).Decode(&b); err == nil && b.Group == "team-b" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	s := digestSink(t, srv.URL, "generic", nil, config.Digest{Every: config.Duration(time.Minute), GroupBy: "object.metadata.namespace", Max: 50})
	err := s.Send(context.Background(), digestEvents(t))
	var each *sinks.EventErrors
	if !errors.As(err, &each) || len(each.Errs) != 4 || each.Errs[0] == nil || each.Errs[1] != nil || each.Errs[2] != nil || each.Errs[3] != nil {
		t.Fatalf("outcome %v, want team-b's deletion alone failed", err)
	}
}

// An object whose group cannot be told (groupBy reads a label it lacks)
// is in the default group's message, counted, not refused: refused, it
// was parked for good and never in a digest.
func TestDigestGroupByFailingIsTheDefaultGroup(t *testing.T) {
	srv, got := recordRequests(t)
	s := digestSink(t, srv.URL, "slack", nil, config.Digest{Every: config.Duration(time.Minute), GroupBy: "object.metadata.labels.team", Max: 50})
	evs := digestEvents(t)
	evs[1].Object().SetLabels(map[string]string{"team": "web"}) // team-a/web is team web's; the others have no team
	if err := s.Send(context.Background(), evs); err != nil {
		t.Fatalf("objects without the label: %v; want them sent in the default group", err)
	}
	var texts []string
	for _, r := range got() {
		var b struct {
			Text string `json:"text"`
		}
		mustJSON(t, r.body, &b)
		texts = append(texts, b.Text)
	}
	slices.Sort(texts)
	if len(texts) != 2 || !strings.HasPrefix(texts[0], "kubebridge digest (cluster prod, 1m0s): 2 entered, 0 changed, 1 left\n") ||
		!strings.HasPrefix(texts[1], "kubebridge digest for web (cluster prod, 1m0s): 0 entered, 1 changed, 0 left\n") {
		t.Errorf("messages:\n%s\nwant the three without a team in the default group's, web's apart", strings.Join(texts, "\n"))
	}
	if n := s.DigestGroupErrors(); n != 3 {
		t.Errorf("DigestGroupErrors = %d, want 3", n)
	}
}

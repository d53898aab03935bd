package webhook

import (
	"encoding/json"
	"net/url"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// alertsPath is the path of Alertmanager's API v2 alerts endpoint.
const alertsPath = "/api/v2/alerts"

// alertmanagerResolveTimeout is Alertmanager's default resolve_timeout:
// how long an alert posted without endsAt stays active.
const alertmanagerResolveTimeout = 5 * time.Minute

// AlertLifetime says whether the sink posts Alertmanager alerts, which
// expire at their endsAt unless sent again (so the sink's replayEvery must
// re-send them well before), and how long one send keeps an alert active.
// sure: the alertmanager preset, rather than a request that posts to
// .../api/v2/alerts. The lifetime is read from the request rendered for a
// sample firing event, as the sink would send it: the earliest endsAt
// (without one, Alertmanager's default resolve_timeout, 5m); 0 when the
// request does not render so (it reads what the sample lacks).
func (w *Config) AlertLifetime() (lifetime time.Duration, sure, posts bool) {
	r := w.request()
	if r == nil {
		return 0, false, false
	}
	sure = w.Preset == "alertmanager"
	base, err := url.Parse(w.URL)
	if err != nil {
		return 0, sure, sure
	}
	v, at, err := sampleFiring(w.CredentialFiles)
	if err != nil {
		return 0, sure, sure
	}
	path := base.Path
	if r.Path != "" {
		t, errs := celsandbox.CompileTemplate(r.Path, "string")
		if errs != nil {
			return 0, sure, sure
		}
		p, err := t.String(v)
		if err != nil {
			return 0, sure, sure
		}
		path = strings.TrimSuffix(path, "/") + "/" + strings.TrimPrefix(p, "/")
	}
	posts = sure || strings.HasSuffix(strings.TrimSuffix(path, "/"), alertsPath)
	if !posts || r.Body == "" {
		return 0, sure, posts
	}
	t, errs := celsandbox.CompileTemplate(r.Body, "json")
	if errs != nil {
		return 0, sure, posts
	}
	body, err := t.JSON(v)
	if err != nil {
		return 0, sure, posts
	}
	var alerts []struct {
		EndsAt *time.Time `json:"endsAt"`
	}
	if json.Unmarshal(body, &alerts) != nil || len(alerts) == 0 {
		return 0, sure, posts
	}
	for i, a := range alerts {
		d := alertmanagerResolveTimeout
		if a.EndsAt != nil {
			d = a.EndsAt.Sub(at)
		}
		if i == 0 || d < lifetime {
			lifetime = d
		}
	}
	return max(lifetime, 0), sure, posts
}

// sampleFiring is what a request's templates see of a Failed Pod that
// entered a view long ago (past any for), observed at the returned time;
// each declared credential reads as "x".
func sampleFiring(credentials map[string]string) (*celsandbox.TemplateVars, time.Time, error) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "sample", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000",
			"resourceVersion": "1", "labels": map[string]any{}, "annotations": map[string]any{}},
		"spec":   map[string]any{},
		"status": map[string]any{"phase": "Failed", "message": "sample"},
	}}
	rule := &event.Rule{Name: "sample", Cluster: "sample", GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, IncludeObject: true}
	e := event.Build(rule, event.Transition{Change: event.Added, Object: pod, Time: at, Entered: at.Add(-2 * maxFor).UnixNano()})
	creds := make(map[string]string, len(credentials))
	for name := range credentials {
		creds[name] = "x"
	}
	v, err := vars(e, creds)
	return v, at, err
}

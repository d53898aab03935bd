package webhook

import (
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Presets are named requests for the receivers teams already have: each
// is a Request whose fields a sink's own request overrides one by one (a
// field set in request wins; headers and query merge, request's winning
// per name). Each keeps to its receiver's documented limits, truncating a
// value visibly (ending in "…") rather than being refused.
var Presets = map[string]Request{
	// Slack incoming webhook (api.slack.com/messaging/webhooks): {"text"},
	// at most 40,000 characters (Slack truncates longer ones).
	"slack": {
		Method: "POST",
		Body:   `{"text": ` + truncated(summary, 40000) + `}`,
	},
	// Microsoft Teams workflow webhook ("Post to a channel when a webhook
	// request is received"): a message with one Adaptive Card 1.4 attachment.
	"teams": {
		Method: "POST",
		Body: `{"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": null,
			"content": {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4",
			"body": [{"type": "TextBlock", "text": ` + truncated(summary, 2000) + `, "wrap": true, "weight": "Bolder"},
			         {"type": "FactSet", "facts": [{"title": "Rule", "value": event.rule}, {"title": "Cluster", "value": event.cluster},
			                                      {"title": "Change", "value": event.change}]}]}}]}`,
	},
	// GitHub repository_dispatch (docs.github.com/rest/repos/repos#create-a-repository-dispatch-event):
	// url https://api.github.com/repos/OWNER/REPO/dispatches, bearerTokenFile a token with
	// contents: write; event_type at most 100 characters, client_payload at most 10 top-level keys.
	"github-dispatch": {
		Method:  "POST",
		Headers: map[string]string{"Accept": `'application/vnd.github+json'`, "X-GitHub-Api-Version": `'2022-11-28'`},
		Body: `{"event_type": ` + truncated(`"kubebridge." + event.rule + "." + event.change`, 100) + `,
			"client_payload": {"rule": event.rule, "cluster": event.cluster, "change": event.change, "subject": event.subject,
			                   "id": event.id, "uid": object.metadata.uid}}`,
	},
	// Alertmanager API v2 (POST /api/v2/alerts): one alert per object in
	// the view, resolved when it leaves; pair it with replayEvery (shorter
	// than 5m) so firing alerts are re-sent.
	"alertmanager": {
		Method: "POST",
		Body: `[{"labels": {"alertname": event.rule, "cluster": event.cluster, "namespace": object.metadata.?namespace.orValue(""),
			"name": object.metadata.name, "uid": object.metadata.uid},
			"annotations": {"summary": ` + truncated(summary, 1024) + `},
			"startsAt": event.time,
			"endsAt": type == "deleted" ? event.time : string(timestamp(event.time) + duration("5m"))}]`,
	},
	// A plain JSON request any receiver can take: the change and the object.
	"generic": {
		Method: "POST",
		Body: `{"id": event.id, "type": event.type, "change": event.change, "rule": event.rule, "cluster": event.cluster,
			"subject": event.subject, "reason": event.reason, "object": dyn(object)}`,
	},
}

// summary is one line about the change, e.g. "updated Pod prod/web-1 (rule
// failed-pods, cluster prod-eu-1)".
const summary = `event.change + " " + dyn(object).?kind.orValue("object") + " " + event.subject + " (rule " + event.rule + ", cluster " + event.cluster + ")"`

// truncated is expr cut to n characters, ending in "…" when cut.
func truncated(expr string, n int) string {
	return "((" + expr + ").size() > " + strconv.Itoa(n) + " ? (" + expr + ").substring(0, " + strconv.Itoa(n-1) + ") + \"…\" : (" + expr + "))"
}

// PresetNames lists the presets, sorted.
func PresetNames() []string { return slices.Sorted(maps.Keys(Presets)) }

// withPreset is r over the preset named name: r's fields win.
func withPreset(name string, r *Request) Request {
	p := Presets[name]
	out := p
	out.Headers = maps.Clone(p.Headers)
	out.Query = maps.Clone(p.Query)
	if r == nil {
		return out
	}
	if r.Method != "" && (r.Method != "POST" || p.Method == "") {
		out.Method = r.Method
	}
	for _, f := range []struct{ dst, src *string }{{&out.Path, &r.Path}, {&out.Body, &r.Body}, {&out.When, &r.When}} {
		if strings.TrimSpace(*f.src) != "" {
			*f.dst = *f.src
		}
	}
	for k, v := range r.Headers {
		if out.Headers == nil {
			out.Headers = map[string]string{}
		}
		out.Headers[k] = v
	}
	for k, v := range r.Query {
		if out.Query == nil {
			out.Query = map[string]string{}
		}
		out.Query[k] = v
	}
	return out
}

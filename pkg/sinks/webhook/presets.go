package webhook

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Presets are named requests for the receivers teams already have (the
// chat ones and PagerDuty say what an update changed: changes.text); each
// is a Request whose fields a sink's own request overrides one by one (a
// field set in request wins; headers and query merge, request's winning
// per name). Each keeps to its receiver's documented limits, truncating a
// value visibly (ending in "…") rather than being refused.
var Presets = map[string]Request{
	// Slack incoming webhook (api.slack.com/messaging/webhooks): {"text"},
	// at most 40,000 characters (Slack truncates longer ones).
	"slack": {
		Method: "POST",
		Body:   `{"text": ` + truncated(summary+` + (`+changesTold+` ? "\n" + changes.text : "")`, 40000) + `}`,
		Digest: `{"text": ` + truncated(`digest.title + "\n" + digest.text`, 40000) + `}`,
	},
	// Microsoft Teams workflow webhook ("Post to a channel when a webhook
	// request is received"): a message with one Adaptive Card 1.4 attachment.
	"teams": {
		Method: "POST",
		Body: `{"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": null,
			"content": {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4",
			"body": [{"type": "TextBlock", "text": ` + truncated(summary, 2000) + `, "wrap": true, "weight": "Bolder"},
			         {"type": "FactSet", "facts": [{"title": "Rule", "value": event.rule}, {"title": "Cluster", "value": event.cluster},
			                                      {"title": "Change", "value": event.change}]}] +
			        (` + changesTold + ` ? [{"type": "TextBlock", "text": ` + truncated(`changes.text`, 10000) + `, "wrap": true, "fontType": "Monospace"}] : [])}}]}`,
		Digest: `{"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": null,
			"content": {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4",
			"body": [{"type": "TextBlock", "text": ` + truncated(`digest.title`, 2000) + `, "wrap": true, "weight": "Bolder"},
			         {"type": "TextBlock", "text": ` + truncated(`digest.text`, 20000) + `, "wrap": true}]}}]}`,
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
	// the view, resolved when it leaves. Labels name the object as
	// kube-state-metrics does (pod: web-1, deployment: api), so routes and
	// silences written for those alerts fit. Each send keeps it active for 5m
	// (endsAt), so the sink's replay must re-send it well within that:
	// validate requires replayEvery (at most 2m30s; 1m15s, four re-sends
	// per endsAt as Prometheus does, without a warning; AlertLifetime).
	"alertmanager": {
		Method: "POST",
		Body: `[{"labels": {"alertname": event.rule, "cluster": event.cluster, "namespace": object.metadata.?namespace.orValue(""),
			"name": object.metadata.name, "uid": object.metadata.uid, ` + kindLabel + `: object.metadata.name},
			"annotations": {"summary": ` + truncated(summary, 1024) + `},
			"startsAt": event.time,
			"endsAt": type == "deleted" ? event.time : string(timestamp(event.time) + duration("5m"))}]`,
	},
	// PagerDuty Events API v2 (developer.pagerduty.com/docs/events-api-v2/trigger-events,
	// .../resolve-events): url https://events.pagerduty.com/v2/enqueue,
	// credentialFiles {routingKey: <the integration key's file>}. An object
	// that enters the view triggers, one that leaves resolves, by
	// dedup_key (cluster/rule/uid, at most 255 characters); summary at
	// most 1,024 characters, source and severity required.
	"pagerduty": {
		Method: "POST",
		Body: `type == "deleted"
			? {"routing_key": credentials.routingKey, "event_action": "resolve", "dedup_key": ` + truncated(alertKey("/"), 255) + `}
			: {"routing_key": credentials.routingKey, "event_action": "trigger", "dedup_key": ` + truncated(alertKey("/"), 255) + `,
			   "client": "kubebridge",
			   "payload": {"summary": ` + truncated(summary, 1024) + `, "source": ` + truncated(`event.cluster`, 255) + `, "severity": "error",
			               "timestamp": event.time, "component": ` + truncated(`event.subject`, 255) + `, "class": event.rule,
			               "group": object.metadata.?namespace.orValue(""),
			               "custom_details": {"rule": event.rule, "cluster": event.cluster, "change": event.change, "subject": event.subject, "uid": object.metadata.uid,
			                                      "changes": ` + truncated(`changes.text`, 10000) + `}}}`,
	},
	// Opsgenie Alert API (docs.opsgenie.com/docs/alert-api): url
	// https://api.opsgenie.com/v2 (api.eu.opsgenie.com in the EU),
	// credentialFiles {apiKey: <an API integration key's file>}. An object
	// that enters the view creates an alert (POST /v2/alerts), one that
	// leaves closes it (POST /v2/alerts/<alias>/close?identifierType=alias);
	// alias kubebridge.<cluster>.<rule>.<uid> (512 characters); message at
	// most 130 characters, description 15,000, source 100, entity 512.
	"opsgenie": {
		Method:  "POST",
		Path:    `type == "deleted" ? "alerts/" + ` + truncated(alertKey("."), 512) + ` + "/close" : "alerts"`,
		Query:   map[string]string{"identifierType": `type == "deleted" ? "alias" : ""`},
		Headers: map[string]string{"Authorization": `"GenieKey " + credentials.apiKey`},
		Body: `type == "deleted"
			? {"source": "kubebridge", "note": ` + truncated(summary, 25000) + `}
			: {"message": ` + truncated(summary, 130) + `, "alias": ` + truncated(alertKey("."), 512) + `,
			   "description": ` + truncated(summary, 15000) + `, "source": "kubebridge", "entity": ` + truncated(`event.subject`, 512) + `,
			   "tags": ["kubebridge", ` + truncated(`event.rule`, 50) + `], "priority": "P3",
			   "details": {"rule": event.rule, "cluster": event.cluster, "change": event.change, "subject": event.subject, "uid": object.metadata.uid}}`,
	},
	// A plain JSON request any receiver can take: the change, the object,
	// and its owners and involved object (include: [owners]; else [] and
	// null).
	"generic": {
		Method: "POST",
		Body: `{"id": event.id, "type": event.type, "change": event.change, "rule": event.rule, "cluster": event.cluster,
			"subject": event.subject, "reason": event.reason, "object": dyn(object),
			"changes": changes.known ? changes.list : null, "owners": owners, "involved": involved}`,
		Digest: `{"cluster": event.cluster, "group": digest.group, "count": digest.count, "entered": digest.entered, "changed": digest.changed,
			"left": digest.left, "more": digest.more,
			"items": digest.items.map(i, {"id": i.id, "type": i.type, "change": i.change, "rule": i.rule, "subject": i.subject,
			                              "uid": i.uid, "line": i.line, "object": i.object})}`,
	},
}

// presetConfigRefusals tell, per preset, a 400 that blames the sink's
// config from one that blames the event: PagerDuty answers a wrong routing
// key with 400 {"status": "invalid event", "errors": ["Length of
// 'routing_key' is incorrect ..."]} (developer.pagerduty.com, Events API
// v2 responses); dead-lettering every alert for it would lose them all.
var presetConfigRefusals = map[string]func(body []byte) bool{
	"pagerduty": func(body []byte) bool { return bytes.Contains(bytes.ToLower(body), []byte("routing_key")) },
}

// summary is one line about the change, e.g. "updated Pod prod/web-1
// (Deployment web) (rule failed-pods, cluster prod-eu-1)", the top owner
// named when the rule includes owners; for a Kubernetes Event, what it
// says about the object it involves and how often: "Warning BackOff on Pod
// prod/web-1 (Deployment web): Back-off restarting failed container (5× in
// 10 min) (rule ..., cluster ...)". A recurring Event is one object whose count (or
// series) grows, so its updates are one incident told again, not new ones.
var summary = `(` + isKubeEvent + ` ? ` + eventLine + ` : event.change + " " + dyn(object).?kind.orValue("object") + " " + event.subject + ` + topOwner(`owners`) + `)` +
	` + " (rule " + event.rule + ", cluster " + event.cluster + ")"`

// isKubeEvent says the object is a Kubernetes Event (core/v1 or
// events.k8s.io/v1; a CRD of kind Event is not one).
const isKubeEvent = `(dyn(object).?kind.orValue("") == "Event" && dyn(object).?apiVersion.orValue("") in ["v1", "events.k8s.io/v1"])`

// changesTold says a chat message tells what an update changed: not for a
// Kubernetes Event, whose changes are its count and timestamps, which the
// summary already tells ("5× in 10 min").
const changesTold = `(changes.text != "" && !` + isKubeEvent + `)`

// topOwner is " (Deployment web)", the top controller of a chain (a list
// of owners, nearest first), when the rule includes owners and the chain
// has one; "" otherwise.
func topOwner(chain string) string {
	return `(size(` + chain + `) > 0 ? " (" + ` + chain + `[size(` + chain + `) - 1].kind + " " + ` + chain + `[size(` + chain + `) - 1].name + ")" : "")`
}

// eventLine is a core/v1 or events.k8s.io/v1 Event in one line.
var eventLine = `(` + str(`dyn(object).?type`) + ` + " " + ` + str(`dyn(object).?reason`) + ` + " on " + ` +
	str(`dyn(object).?involvedObject.?kind.or(dyn(object).?regarding.?kind)`) + ` + " " + ` +
	`(` + str(`dyn(object).?involvedObject.?namespace.or(dyn(object).?regarding.?namespace)`) + ` != "" ? ` +
	str(`dyn(object).?involvedObject.?namespace.or(dyn(object).?regarding.?namespace)`) + ` + "/" : "") + ` +
	str(`dyn(object).?involvedObject.?name.or(dyn(object).?regarding.?name)`) + ` + (involved != null ? ` + topOwner(`involved.owners`) + ` : "") + ": " + ` +
	str(`dyn(object).?message.or(dyn(object).?note)`) + ` + ` + recurrence + `)`

// recurrence is " (5× in 10 min)" for an Event seen more than once: its
// count (series.count, count, deprecatedCount) and the time from its first
// occurrence to its last.
var recurrence = func() string {
	count := `dyn(object).?series.?count.or(dyn(object).?count).or(dyn(object).?deprecatedCount)`
	first := str(`dyn(object).?firstTimestamp.or(dyn(object).?deprecatedFirstTimestamp).or(dyn(object).?eventTime)`)
	last := str(`dyn(object).?series.?lastObservedTime.or(dyn(object).?lastTimestamp).or(dyn(object).?deprecatedLastTimestamp)`)
	n := `(type(` + count + `.orValue(1)) == int ? ` + count + `.orValue(1) : 1)`
	span := `(timestamp(` + last + `) - timestamp(` + first + `))`
	took := `(` + first + ` != "" && ` + last + ` != "" ? " in " + (` + span + `.getHours() >= 1 ? string(` + span + `.getHours()) + " h" : ` +
		span + `.getMinutes() >= 1 ? string(` + span + `.getMinutes()) + " min" : string(` + span + `.getSeconds()) + " s") : "")`
	return `(` + n + ` > 1 ? " (" + string(` + n + `) + "×" + ` + took + ` + ")" : "")`
}()

// str is an optional field's value when it is a string, else "" (a field
// Kubernetes serializes as null, such as an Event's firstTimestamp).
func str(opt string) string {
	return `(type(` + opt + `.orValue("")) == string ? ` + opt + `.orValue("") : "")`
}

// kindLabel is the object's kind as a Prometheus label name (pod,
// deployment); "object" for a kind that would collide with another label
// (a Namespace's "namespace").
const kindLabel = `(dyn(object).?kind.orValue("object").lowerAscii() in ["alertname", "cluster", "namespace", "name", "uid"] ? "object" : dyn(object).?kind.orValue("object").lowerAscii())`

// alertKey is an alert's identity, the same for its fire and its
// resolve: kubebridge<sep>cluster<sep>rule<sep>uid (cluster and rule are
// DNS labels, so sep cannot occur in them).
func alertKey(sep string) string {
	return `"kubebridge` + sep + `" + event.cluster + "` + sep + `" + event.rule + "` + sep + `" + object.metadata.uid`
}

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
	if r.For != 0 {
		out.For = r.For
	}
	for _, f := range []struct{ dst, src *string }{{&out.Path, &r.Path}, {&out.Body, &r.Body}, {&out.When, &r.When}, {&out.Digest, &r.Digest}} {
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

package webhook

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// digest is how the sink renders a digest (the sink's digest): the
// delivery hands it a period's events, each object once, and each group
// (groupBy) is one request whose body is the request's digest.
type digest struct {
	every   time.Duration
	groupBy *celsandbox.Template // nil: one group
	max     int
}

func newDigest(c *config.Digest, r *shapedRequest) (*digest, error) {
	if r == nil || r.digest == nil {
		return nil, fmt.Errorf("digest: the sink has no digest body: use preset slack, teams or generic, or set request.digest")
	}
	d := &digest{every: c.Every.D(), max: c.Max}
	if c.GroupBy != "" {
		t, errs := celsandbox.CompileTemplate(c.GroupBy, "string")
		if errs != nil {
			return nil, fmt.Errorf("digest.groupBy: %v", errs[0])
		}
		d.groupBy = t
	}
	return d, nil
}

// sendDigest sends events as one request per group. An event withheld by
// the request's for or when is handled without one; one whose group
// cannot be told (groupBy fails on it, e.g. a label its object lacks) is
// in the default group "", counted and logged; each event fares as its
// group's request does.
func (s *Sink) sendDigest(ctx context.Context, events []*event.Event) error {
	creds, err := s.credentials()
	if err != nil {
		return err
	}
	errs := make([]error, len(events))
	type group struct {
		key  string
		idx  []int
		vars []*celsandbox.TemplateVars
	}
	var groups []*group
	byKey := map[string]*group{}
	for i, e := range events {
		v, withheld, err := s.request.admit(e, creds)
		if v == nil {
			if err != nil {
				errs[i] = sinks.Permanent(scrubbed(fmt.Errorf("request template for event %s: %w", e.ID, err), creds))
			} else {
				s.withheld[withheld].Add(1)
			}
			continue
		}
		key := ""
		if s.digest.groupBy != nil {
			if key, err = s.digest.groupBy.String(v); err != nil {
				key = ""
				s.groupFailed(ctx, e, scrubbed(err, creds))
			}
		}
		g := byKey[key]
		if g == nil {
			g = &group{key: key}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.idx, g.vars = append(g.idx, i), append(g.vars, v)
	}
	for _, g := range groups {
		v := *g.vars[0] // path, query and headers see the first event's variables
		v.Digest = s.digest.render(g.key, events, g.idx, g.vars)
		target, h, body, err := s.request.build(&v, s.request.digest)
		if err != nil {
			err = sinks.Permanent(scrubbed(fmt.Errorf("digest request for group %q: %w", g.key, err), creds))
		} else {
			err = scrubbed(s.do(ctx, s.request.method, target, h, body), creds)
		}
		if s.logger.Enabled(ctx, slog.LevelDebug) {
			attrs := []any{"group", g.key, "events", len(g.idx), "bytes", len(body)}
			if err != nil {
				attrs = append(attrs, "error", err)
			}
			s.logger.Debug("digest sent", attrs...)
		}
		for _, i := range g.idx {
			errs[i] = err
		}
	}
	return sinks.Outcome(errs)
}

// groupFailed counts an event whose group could not be told, and logs it
// at most every 10 seconds.
func (s *Sink) groupFailed(ctx context.Context, e *event.Event, err error) {
	n := s.groupErrors.Add(1)
	now := s.now().UnixNano()
	if last := s.lastGroupErrLog.Load(); now-last > int64(10*time.Second) && s.lastGroupErrLog.CompareAndSwap(last, now) {
		s.logger.WarnContext(ctx, "digest.groupBy failed; the event is in the default group", "subject", e.Subject, "error", err, "failures", n)
	}
}

// DigestGroupErrors is how many events the sink's digest put in the
// default group because groupBy failed on them
// (kubebridge_sink_digest_group_errors_total).
func (s *Sink) DigestGroupErrors() int64 { return s.groupErrors.Load() }

// changeOrder lists what entered the view first, then what changed, then
// what left it.
var changeOrder = map[event.Change]int{event.Added: 0, event.Updated: 1, event.Deleted: 2}

// render is the template's digest for a group's events (events[idx],
// with their variables): {group, count, entered, left, changed, items
// (at most max, entered first, then changed, then left), more (the items
// not listed: delivered with it all the same), title, text (a line per
// item, "… and N more")}.
func (d *digest) render(key string, events []*event.Event, idx []int, vs []*celsandbox.TemplateVars) map[string]any {
	order := make([]int, len(idx)) // positions in idx
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return changeOrder[events[idx[a]].Change] - changeOrder[events[idx[b]].Change]
	})
	counts := map[event.Change]int64{}
	items := make([]any, 0, min(len(idx), d.max))
	lines := make([]string, 0, min(len(idx), d.max)+1)
	for n, k := range order {
		e, v := events[idx[k]], vs[k]
		counts[e.Change]++
		if n >= d.max {
			continue
		}
		line := itemLine(e, v)
		var changes any = ""
		if e.Change == event.Updated {
			changes = changesVar(e)["text"]
		}
		items = append(items, map[string]any{"change": string(e.Change), "line": line, "id": e.ID, "type": e.Type(),
			"subject": e.Subject, "rule": e.Rule(), "reason": e.Reason, "replay": e.Replay, "kind": e.Kind(),
			"namespace": e.Namespace(), "name": e.Name(), "uid": e.UID(), "changes": changes, "object": v.Object})
		lines = append(lines, "• "+line)
	}
	more := int64(len(idx) - len(items))
	if more > 0 {
		lines = append(lines, fmt.Sprintf("… and %d more", more))
	}
	title := "kubebridge digest"
	if key != "" {
		title += " for " + key
	}
	if len(vs) > 0 {
		title += " (cluster " + vs[0].Event["cluster"] + ", " + d.every.String() + ")"
	}
	title += fmt.Sprintf(": %d entered, %d changed, %d left", counts[event.Added], counts[event.Updated], counts[event.Deleted])
	return map[string]any{"group": key, "count": int64(len(idx)), "entered": counts[event.Added], "changed": counts[event.Updated],
		"left": counts[event.Deleted], "items": items, "more": more, "title": title, "text": strings.Join(lines, "\n")}
}

// itemLine is one object in a digest: "added Deployment team-a/web", an
// update with its first change ("…: spec.replicas: 2 → 3 (and 1 more)"),
// a Kubernetes Event as what it says ("Warning BackOff on Pod
// team-a/web-1: Back-off restarting failed container").
func itemLine(e *event.Event, v *celsandbox.TemplateVars) string {
	kind := e.Kind()
	if kind == "" {
		kind = "object"
	}
	line := string(e.Change) + " " + kind + " " + e.Subject
	if kind == "Event" && v.Object != nil {
		if s := eventSays(v.Object); s != "" {
			line = string(e.Change) + " Event: " + s
		}
	}
	if e.Change != event.Updated {
		return line
	}
	text, _ := changesVar(e)["text"].(string)
	if text == "" {
		return line
	}
	first, rest, _ := strings.Cut(text, "\n")
	if rest != "" {
		first += fmt.Sprintf(" (and %d more)", strings.Count(rest, "\n")+1)
	}
	return line + ": " + first
}

// eventSays is a core/v1 or events.k8s.io/v1 Event in a few words: its
// type and reason, the object it is about, its message.
func eventSays(obj map[string]any) string {
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	about, _ := obj["involvedObject"].(map[string]any)
	if about == nil {
		about, _ = obj["regarding"].(map[string]any)
	}
	msg := str(obj, "message")
	if msg == "" {
		msg = str(obj, "note")
	}
	if about == nil || str(obj, "reason") == "" {
		return ""
	}
	name := str(about, "name")
	if ns := str(about, "namespace"); ns != "" {
		name = ns + "/" + name
	}
	return strings.TrimSpace(str(obj, "type")+" "+str(obj, "reason")) + " on " + str(about, "kind") + " " + name + ": " + msg
}

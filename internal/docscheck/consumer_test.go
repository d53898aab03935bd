package docscheck

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/event"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// The consumer between the markers is the one docs/consumers.md shows:
// TestDocsShowTheTestedConsumer keeps them the same.

// consumer:begin

// Mirror holds one rule's view: its objects by uid, as its events say.
type Mirror struct {
	Rule    string                    // the rule mirrored (kbrule)
	Objects map[string]map[string]any // by metadata.uid
}

// Apply applies one event, a message's body (the structured CloudEvent).
func (m *Mirror) Apply(body []byte) error {
	var e struct {
		Rule   string `json:"kbrule"`
		Change string `json:"kbchange"` // added, updated or deleted
		Data   struct {
			Object map[string]any `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Rule != m.Rule {
		return err // nil for another rule's event
	}
	md, _ := e.Data.Object["metadata"].(map[string]any)
	uid, _ := md["uid"].(string)
	if e.Change == "deleted" { // deleted, or no longer matches (kbreason: unmatched)
		delete(m.Objects, uid)
	} else { // added (entered the view) or updated (a newer state)
		m.Objects[uid] = e.Data.Object
	}
	return nil
}

// Follow applies the stream's events to m, from its first message, until
// ctx ends. synced (may be nil) is called after each message that leaves
// none pending: m then holds the view as the stream has it now.
func Follow(ctx context.Context, js jetstream.JetStream, stream string, m *Mirror, synced func()) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return err
	}
	msgs, err := cons.Messages()
	if err != nil {
		return err
	}
	defer msgs.Stop()
	for {
		msg, err := msgs.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if err := m.Apply(msg.Data()); err != nil {
			return err
		}
		if md, err := msg.Metadata(); err == nil && md.NumPending == 0 && synced != nil {
			synced()
		}
	}
}

// consumer:end

// history is a rule's life, as the bridge sends it: creations, an update,
// an object leaving the view (unmatched), one deleted and re-created under
// its name (a new uid), a replay of an unchanged state (the same id, which
// the stream drops), a deletion found at a restart (built from the
// checkpoint's metadata), and another rule's events on the same objects.
// The view at the end: a at rv 3, c's second incarnation, and f, which
// the other rule matches too.
func history() (events []*event.Event, view map[string]string) {
	cms := &event.Rule{Name: "cms", Cluster: "dev", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}
	other := &event.Rule{Name: "team-cms", Cluster: "dev", GVR: cms.GVR, IncludeObject: true}
	cm := func(name, uid, rv string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"rv": rv}}}
		u.SetNamespace("demo")
		u.SetName(name)
		u.SetUID(types.UID(uid))
		u.SetResourceVersion(rv)
		return u
	}
	now := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	at := func(r *event.Rule, c event.Change, o, old *unstructured.Unstructured, reason, replay string) *event.Event {
		now = now.Add(time.Second)
		return event.Build(r, event.Transition{Change: c, Object: o, Old: old, Time: now, Entered: 1, Reason: reason, Replay: replay})
	}
	// What a restart rebuilds from a checkpoint: metadata only.
	e8 := &unstructured.Unstructured{Object: map[string]any{}}
	e8.SetNamespace("demo")
	e8.SetName("e")
	e8.SetUID("u-e")
	e8.SetResourceVersion("8")
	updatedA := at(cms, event.Updated, cm("a", "u-a", "3"), cm("a", "u-a", "1"), "", "")
	events = []*event.Event{
		at(cms, event.Added, cm("a", "u-a", "1"), nil, "", ""),
		at(cms, event.Added, cm("b", "u-b", "2"), nil, "", ""),
		at(other, event.Added, cm("a", "u-a", "1"), nil, "", ""),
		updatedA,
		at(cms, event.Deleted, cm("b", "u-b", "4"), nil, event.ReasonUnmatched, ""),
		at(other, event.Deleted, cm("a", "u-a", "3"), nil, event.ReasonUnmatched, ""),
		at(cms, event.Added, cm("c", "u-c1", "5"), nil, "", ""),
		at(cms, event.Deleted, cm("c", "u-c1", "6"), nil, "", ""),
		at(cms, event.Added, cm("c", "u-c2", "7"), nil, "", ""),
		updatedA.WithReplay(event.ReplayResync),
		at(cms, event.Added, cm("e", "u-e", "8"), nil, "", ""),
		at(cms, event.Deleted, e8, nil, "", event.ReplayCheckpoint),
		at(cms, event.Added, cm("f", "u-f", "9"), nil, "", ""),
		at(other, event.Added, cm("f", "u-f", "9"), nil, "", ""),
	}
	return events, map[string]string{"u-a": "3", "u-c2": "7", "u-f": "9"}
}

// The consumer of docs/consumers.md, fed by the real nats sink through
// JetStream, holds exactly the rule's view: from a stream that keeps
// everything, and from one that keeps only each subject's last message
// (MaxMsgsPerSubject 1) when the subjects name the object, the rule and
// the change, where a new consumer still finds every object's latest
// event. With the default layout, which has no {rule}, two rules on one
// resource share subjects: the other rule's added of f replaces the
// mirrored rule's, which then misses f (the pitfall docs/consumers.md
// warns of).
func TestConsumerHoldsTheView(t *testing.T) {
	for _, tc := range []struct {
		name       string
		subject    string // "": the default layout
		perSubject int64
		stored     int      // messages the stream ends with
		missed     []string // uids of the view the consumer misses
	}{
		{name: "everything kept", perSubject: -1, stored: 13}, // 14 sent, the replay dropped as a duplicate
		// a: added, updated; b: added, deleted; c: added (u-c2), deleted
		// (u-c1); e: added, deleted; f: added; team-cms's a: added,
		// deleted; f: added.
		{name: "one message per subject and rule", subject: "k8s.{cluster}.{group}.{resource}.{namespace}.{name}.{rule}.{type}", perSubject: 1, stored: 12},
		{name: "one message per subject, two rules in the default layout", perSubject: 1, stored: 10, missed: []string{"u-f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartNATS(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			nc, err := natsgo.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CONFIGMAPS", Subjects: []string{"k8s.>"}, MaxMsgsPerSubject: tc.perSubject, Duplicates: 10 * time.Minute}); err != nil {
				t.Fatal(err)
			}
			cfg := &natssink.Config{}
			cfg.SetDefaults()
			cfg.URL, cfg.JetStream = srv.ClientURL(), true
			if tc.subject != "" {
				cfg.Subject = tc.subject
			}
			sink, err := natssink.Connect(ctx, "bus", cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close(context.Background())
			events, view := history()
			for _, e := range events {
				if err := sink.Send(ctx, []*event.Event{e}); err != nil {
					t.Fatalf("sending %s: %v", e.ID, err)
				}
			}
			st, err := js.Stream(ctx, "CONFIGMAPS")
			if err != nil {
				t.Fatal(err)
			}
			if info, err := st.Info(ctx); err != nil || info.State.Msgs != uint64(tc.stored) {
				t.Errorf("the stream holds %v messages (%v), want %d", info.State.Msgs, err, tc.stored)
			}

			m := &Mirror{Rule: "cms", Objects: map[string]map[string]any{}}
			fctx, stop := context.WithCancel(ctx)
			if err := Follow(fctx, js, "CONFIGMAPS", m, stop); err != nil {
				t.Fatal(err)
			}
			if ctx.Err() != nil {
				t.Fatal("the consumer never caught up with the stream")
			}
			got := map[string]string{}
			for uid, o := range m.Objects {
				md, _ := o["metadata"].(map[string]any)
				got[uid], _ = md["resourceVersion"].(string)
				if o["apiVersion"] != "v1" || o["kind"] != "ConfigMap" {
					t.Errorf("%s: apiVersion %v, kind %v", uid, o["apiVersion"], o["kind"])
				}
			}
			for _, uid := range tc.missed {
				delete(view, uid)
			}
			if fmt.Sprint(got) != fmt.Sprint(view) {
				t.Errorf("the consumer holds %v, want the view %v", got, view)
			}
		})
	}
}

// docs/consumers.md shows the consumer this file runs.
func TestDocsShowTheTestedConsumer(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "consumers.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("consumer_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, code, _ := strings.Cut(string(src), "// consumer:begin\n\n")
	code, _, _ = strings.Cut(code, "\n// consumer:end")
	if code == "" || !strings.Contains(string(doc), "```go\n"+code+"```\n") {
		t.Errorf("docs/consumers.md does not show consumer_test.go's consumer:\n%s", code)
	}
	if lines := strings.Count(code, "\n"); lines > 80 {
		t.Errorf("the consumer is %d lines: keep it short enough to read", lines)
	}
}

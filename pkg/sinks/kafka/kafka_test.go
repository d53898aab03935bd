package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Each event is a record on the rule's change topic in the CloudEvents
// Kafka binding's binary mode: the key is the uid, the value the event's
// data, every attribute a ce_ header, content-type the data's; and, on
// the state topic, the structured event (content-type
// application/cloudevents+json) or, for a deletion, a tombstone.
func TestRecordsFollowTheBinding(t *testing.T) {
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.StateTopic = "state.{rule}" })
	add := ev(event.Added, "prod", "a", "uid-a", 1)
	upd := ev(event.Updated, "prod", "a", "uid-a", 2)
	gone := event.Build(testRule, event.Transition{Change: event.Deleted, Object: object("prod", "a", "uid-a", 3, nil), Time: time.Now(), Reason: event.ReasonUnmatched})
	mustSend(t, s, add, upd, gone)

	recs := readTopic(t, b.addrs(), "k8s.test.cms")
	if len(recs) != 3 {
		t.Fatalf("change topic holds %d records, want 3:%s", len(recs), describe(recs))
	}
	for i, e := range []*event.Event{add, upd, gone} {
		r := recs[i]
		if string(r.Key) != "uid-a" {
			t.Errorf("record %d: key %q, want the uid", i, r.Key)
		}
		data, _ := e.Data()
		if string(r.Value) != string(data) {
			t.Errorf("record %d: value %s, want the event's data %s", i, r.Value, data)
		}
		var want []string
		e.Attributes(func(name, value string) { want = append(want, "ce_"+name+"="+value) })
		want = append(want, "content-type=application/json")
		var got []string
		for _, h := range r.Headers {
			got = append(got, h.Key+"="+string(h.Value))
		}
		if !slices.Equal(got, want) {
			t.Errorf("record %d headers:\n got %v\nwant %v", i, got, want)
		}
	}
	if v, _ := header(recs[2], "ce_kbreason"); v != "unmatched" {
		t.Errorf("the unmatched deletion's ce_kbreason is %q", v)
	}
	if v, _ := header(recs[0], "ce_type"); v != "io.kubebridge.configmaps.core.added" {
		t.Errorf("ce_type %q", v)
	}

	state := readTopic(t, b.addrs(), "state.cms")
	if len(state) != 3 {
		t.Fatalf("state topic holds %d records, want 3:%s", len(state), describe(state))
	}
	for i, e := range []*event.Event{add, upd} {
		body, _ := e.Structured()
		if string(state[i].Value) != string(body) || string(state[i].Key) != "uid-a" {
			t.Errorf("state record %d: key %s value %s, want the uid and the structured event", i, state[i].Key, state[i].Value)
		}
		if ct, _ := header(state[i], "content-type"); ct != "application/cloudevents+json; charset=UTF-8" {
			t.Errorf("state record %d: content-type %q", i, ct)
		}
	}
	if state[2].Value != nil {
		t.Errorf("the deletion's state record has a value %q, want a tombstone", state[2].Value)
	}
	if _, ok := header(state[2], "content-type"); ok {
		t.Error("a tombstone carries a content-type, but it has no data")
	}
	if id, _ := header(state[2], "ce_id"); id != gone.ID {
		t.Errorf("the tombstone's ce_id is %q, want %q", id, gone.ID)
	}
}

// Concurrent Sends of many objects' changes (as the delivery makes them:
// an object in one batch at a time) keep each uid's order on its
// partition, and a batch with a deletion and a re-creation under one name
// puts the deletion first.
func TestOrderPerUIDUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.StateTopic = "state.{rule}" })
	const workers, objects, rounds = 6, 10, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rv := 0
			for range rounds {
				var batch []*event.Event
				for o := range objects {
					for range 3 {
						rv++
						name := fmt.Sprintf("w%d-o%d", w, o)
						batch = append(batch, ev(event.Updated, "prod", name, "uid-"+name, rv))
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				if err := s.Send(ctx, batch); err != nil {
					t.Errorf("Send: %v", err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	// Another incarnation under a name: the old one's deletion first.
	mustSend(t, s, ev(event.Deleted, "prod", "w0-o0", "uid-w0-o0", 100000), ev(event.Added, "prod", "w0-o0", "uid-new", 100001))

	recs := readTopic(t, b.addrs(), "k8s.test.cms")
	if len(recs) != workers*objects*3*rounds+2 {
		t.Errorf("%d records, want %d", len(recs), workers*objects*3*rounds+2)
	}
	last := map[string]int{}
	partition := map[string]int32{}
	for _, r := range recs {
		id, _ := header(r, "ce_id")
		parts := strings.Split(id, ".")
		rv, _ := strconv.Atoi(parts[2])
		uid := string(r.Key)
		if rv <= last[uid] {
			t.Fatalf("uid %s: resourceVersion %d after %d", uid, rv, last[uid])
		}
		last[uid] = rv
		if p, ok := partition[uid]; ok && p != r.Partition {
			t.Fatalf("uid %s on partitions %d and %d", uid, p, r.Partition)
		}
		partition[uid] = r.Partition
	}
	parts := map[int32]bool{}
	for _, p := range partition {
		parts[p] = true
	}
	if len(parts) < 2 {
		t.Errorf("every uid went to one partition of %d", len(parts))
	}
	var delAt, addAt time.Time
	for _, r := range recs {
		switch string(r.Key) {
		case "uid-new":
			addAt = r.Timestamp
		case "uid-w0-o0":
			if ty, _ := header(r, "ce_type"); strings.HasSuffix(ty, ".deleted") {
				delAt = r.Timestamp
			}
		}
	}
	if delAt.IsZero() || addAt.IsZero() || addAt.Before(delAt) {
		t.Errorf("the re-created object's addition (%s) is not after its predecessor's deletion (%s)", addAt, delAt)
	}
}

// A record that does not fit a batch alone is its event's, for good; its
// neighbours, of other objects and of the same one, are acknowledged.
func TestTooLargeIsThatEventsAlone(t *testing.T) {
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.MaxRecordBytes = 4096; c.MaxBufferedBytes = 1 << 20 })
	big := event.New(testRule, event.Updated, object("prod", "big", "uid-big", 2, map[string]string{"pad": strings.Repeat("x", 60)}), nil, time.Now())
	big.Object().Object["data"] = map[string]any{"pad": strings.Repeat("x", 8000)}
	batch := []*event.Event{ev(event.Added, "prod", "a", "uid-a", 1), big, ev(event.Updated, "prod", "big", "uid-big", 3), ev(event.Added, "prod", "c", "uid-c", 4)}
	err := s.Send(context.Background(), batch)
	var ee *sinks.EventErrors
	if !errors.As(err, &ee) {
		t.Fatalf("Send: %v, want per-event errors", err)
	}
	for i, err := range ee.Errs {
		switch {
		case i == 1 && !sinks.IsPermanent(err):
			t.Errorf("the large event: %v, want a permanent error", err)
		case i != 1 && err != nil:
			t.Errorf("event %d: %v, want acknowledged", i, err)
		}
	}
	if recs := readTopic(t, b.addrs(), "k8s.test.cms"); len(recs) != 3 {
		t.Errorf("%d records, want the 3 that fit:%s", len(recs), describe(recs))
	}
}

// With the broker down, a Send fails as the destination's (Unavailable),
// within the sink's timeout; once it is back the same events go through.
func TestBrokerDownIsUnavailable(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.Timeout = config.Duration(time.Second) })
	mustSend(t, s, ev(event.Added, "prod", "a", "uid-a", 1)) // topics made, connection up
	b.down.Store(true)
	start := time.Now()
	batch := []*event.Event{ev(event.Updated, "prod", "a", "uid-a", 2), ev(event.Added, "prod", "b", "uid-b", 3)}
	err := s.Send(context.Background(), batch)
	if !sinks.IsUnavailable(err) {
		t.Fatalf("Send with the broker down: %v, want Unavailable", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Send took %s to give up", d)
	}
	hc := s.(sinks.HealthChecker)
	if err := hc.Healthy(); err == nil {
		t.Error("Healthy after a failed delivery: nil, want the failure")
	}
	b.down.Store(false)
	eventuallySend(t, s, batch...)
	if err := hc.Healthy(); err != nil {
		t.Errorf("Healthy after a delivery: %v", err)
	}
}

// eventuallySend sends until the sink takes the events, as the delivery
// retries: a client reconnecting may time out once more.
func eventuallySend(t *testing.T, s sinks.Sink, events ...*event.Event) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if err = s.Send(context.Background(), events); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("Send: %v", err)
}

// A broker that is gone (closed) is Unavailable too.
func TestBrokerStoppedIsUnavailable(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.Timeout = config.Duration(time.Second) })
	mustSend(t, s, ev(event.Added, "prod", "a", "uid-a", 1))
	b.Close()
	err := s.Send(context.Background(), []*event.Event{ev(event.Updated, "prod", "a", "uid-a", 2)})
	if !sinks.IsUnavailable(err) {
		t.Fatalf("Send to a stopped broker: %v, want Unavailable", err)
	}
}

// Without createTopics a missing topic is the destination's (not_found).
func TestMissingTopicIsTheDestinations(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.CreateTopics = false; c.Timeout = config.Duration(time.Second) })
	err := s.Send(context.Background(), []*event.Event{ev(event.Added, "prod", "a", "uid-a", 1)})
	if r, ok := sinks.DestinationReason(err); !ok || r != sinks.ReasonNotFound {
		t.Fatalf("Send to a missing topic: %v, want the destination's not_found", err)
	}
}

// SASL with the password from a file: a right one produces; a wrong one
// is refused, retryably (kfake closes the connection where Kafka answers
// SASL_AUTHENTICATION_FAILED, which classify makes the destination's
// unauthorized), and the password shows nowhere.
func TestSASL(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			b := startBroker(t, kfake.EnableSASL(), kfake.Superuser(mech, "bridge", "s3cret"))
			dir := t.TempDir()
			good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
			if err := os.WriteFile(good, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bad, []byte("wrong\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			s := newSink(t, b, func(c *Config) { c.SASL = &SASL{Mechanism: mech, User: "bridge", PasswordFile: good} })
			mustSend(t, s, ev(event.Added, "prod", "a", "uid-a", 1))
			s2 := newSink(t, b, func(c *Config) {
				c.SASL = &SASL{Mechanism: mech, User: "bridge", PasswordFile: bad}
				c.Timeout = config.Duration(time.Second)
			})
			err := s2.Send(context.Background(), []*event.Event{ev(event.Updated, "prod", "a", "uid-a", 2)})
			if err == nil || sinks.IsPermanent(err) {
				t.Fatalf("Send with a wrong password: %v, want a retryable refusal", err)
			}
			if strings.Contains(err.Error(), "wrong") {
				t.Errorf("the error shows the password: %v", err)
			}
			recs := readTopic(t, b.addrs(), "k8s.test.cms", kgo.SASL(saslOf(t, mech, "bridge", good)))
			if len(recs) != 1 {
				t.Errorf("%d records, want 1", len(recs))
			}
		})
	}
}

func saslOf(t *testing.T, mech, user, file string) sasl.Mechanism {
	t.Helper()
	pw, err := sinks.OpenCredentialFile(file, sinks.TrimLine)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mechanism(mech, user, pw)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The state topic read back: the last record per uid, tombstoned uids
// left out, records that are no object's state skipped.
func TestHeld(t *testing.T) {
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.StateTopic = "state.{rule}" })
	h := s.(sinks.Holder)
	if got, err := h.Held(context.Background(), "cms"); err != nil || len(got) != 0 {
		t.Fatalf("Held before any write: %v, %v; want nothing", got, err)
	}
	mustSend(t, s,
		ev(event.Added, "prod", "a", "uid-a", 1),
		ev(event.Added, "prod", "b", "uid-b", 2),
		ev(event.Added, "prod", "c", "uid-c", 3),
		ev(event.Updated, "prod", "a", "uid-a", 4),
		ev(event.Deleted, "prod", "b", "uid-b", 5),
	)
	// Hostile records beside the sink's: garbage, another uid's state,
	// a huge key, and garbage as the last record of uid-c.
	raw, err := kgo.NewClient(kgo.SeedBrokers(b.addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, r := range []*kgo.Record{
		{Key: []byte("uid-x"), Value: []byte("{not json")},
		{Key: []byte("uid-y"), Value: []byte(`{"data":{"object":{"metadata":{"name":"y","uid":"uid-other"}}}}`)},
		{Key: []byte(strings.Repeat("k", 1000)), Value: []byte(`{}`)},
		{Key: []byte("uid-c"), Value: []byte(`[]`)},
		{Key: nil, Value: []byte(`{}`)},
	} {
		r.Topic = "state.cms"
		if err := raw.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	mustSend(t, s, ev(event.Added, "kube-system", "d", "uid-d", 6))

	check := func(when string) {
		t.Helper()
		got, err := h.Held(context.Background(), "cms")
		if err != nil {
			t.Fatalf("%s: Held: %v", when, err)
		}
		slices.SortFunc(got, func(a, b sinks.HeldObject) int { return strings.Compare(a.UID, b.UID) })
		want := []sinks.HeldObject{
			{Namespace: "prod", Name: "a", UID: "uid-a", ResourceVersion: "4", Labels: map[string]string{"app": "a"}},
			{Namespace: "kube-system", Name: "d", UID: "uid-d", ResourceVersion: "6", Labels: map[string]string{"app": "d"}},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: Held:\n got %+v\nwant %+v", when, got, want)
		}
	}
	check("before compaction")
	b.Compact()
	check("after compaction")
	if got, err := h.Held(context.Background(), "other"); err != nil || len(got) != 0 {
		t.Errorf("Held of a rule without a topic: %v, %v; want nothing", got, err)
	}
}

// A rule that includes no object (only the patch): Held takes the
// namespace and name from the subject and the resourceVersion from the id.
func TestHeldWithoutObject(t *testing.T) {
	b := startBroker(t)
	s := newSink(t, b, func(c *Config) { c.StateTopic = "state.{rule}" })
	r := &event.Rule{Name: "patches", Cluster: "test", GVR: testRule.GVR, IncludePatch: true}
	mustSend(t, s, event.New(r, event.Added, object("prod", "p", "uid-p", 7, nil), nil, time.Now()))
	got, err := s.(sinks.Holder).Held(context.Background(), "patches")
	if err != nil {
		t.Fatal(err)
	}
	want := []sinks.HeldObject{{Namespace: "prod", Name: "p", UID: "uid-p", ResourceVersion: "7"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Held: %+v, want %+v", got, want)
	}
}

// parseHeld never panics and names an object only from a value that does.
func FuzzParseHeld(f *testing.F) {
	body, _ := ev(event.Added, "prod", "a", "uid-a", 1).Structured()
	f.Add("uid-a", body)
	f.Add("u", []byte(`{"subject":"a/b/c","id":"u.x.1.added"}`))
	f.Add("u", []byte(`{"data":{"object":{"metadata":{"labels":{"a":1}}}}}`))
	f.Fuzz(func(t *testing.T, uid string, value []byte) {
		o, ok := parseHeld(uid, value)
		if ok && (o.Name == "" || o.UID != uid || strings.Contains(o.Name, "/")) {
			t.Fatalf("parsed %+v from %q", o, value)
		}
		var v any
		if ok && json.Unmarshal(value, &v) != nil {
			t.Fatalf("parsed %+v from a value that is not JSON", o)
		}
	})
}

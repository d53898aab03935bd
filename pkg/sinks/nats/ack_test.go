package nats

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// startServer runs an embedded nats-server with JetStream on a random
// loopback port, with maxPayload (0: the default).
func startServer(t *testing.T, maxPayload int32) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), MaxPayload: maxPayload, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// wire records, in order, every message published under k8s.> (stored by a
// stream or not), as a core subscriber sees them. It answers JetStream
// publishes to namespace "other" as a stream short of quorum does: with a
// 503 API error, retryable; and those to namespace "void" with an empty
// message.
type wire struct {
	mu  sync.Mutex
	ids []string
}

func watchWire(t *testing.T, url string) *wire {
	t.Helper()
	nc, err := natsgo.Connect(url)
	must(t, err)
	t.Cleanup(nc.Close)
	w := &wire{}
	_, err = nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
		w.mu.Lock()
		w.ids = append(w.ids, m.Header.Get("ce-id"))
		w.mu.Unlock()
		switch {
		case m.Reply == "":
		case strings.Contains(m.Subject, ".other."):
			_ = m.Respond([]byte(`{"error":{"code":503,"err_code":10074,"description":"no suitable peers for placement"}}`))
		case strings.Contains(m.Subject, ".void."):
			_ = m.Respond(nil) // a body-less answer
		}
	})
	must(t, err)
	must(t, nc.Flush())
	return w
}

// saw waits up to a second for n messages and returns what was seen.
func (w *wire) saw(n int) []string {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		ids := append([]string(nil), w.ids...)
		w.mu.Unlock()
		if len(ids) >= n || time.Now().After(deadline) {
			return ids
		}
	}
}

var testRule = &event.Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, IncludeObject: true}

// ev is an update of namespace/name at resourceVersion rv with pad bytes of payload.
func ev(ns, name string, rv, pad int) *event.Event {
	u := &unstructured.Unstructured{Object: map[string]any{"kind": "Deployment", "spec": map[string]any{"pad": strings.Repeat("x", pad)}}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion(strconv.Itoa(rv))
	return event.New(testRule, event.Updated, u, nil, time.Now())
}

func eventErrors(t *testing.T, err error, n int) []error {
	t.Helper()
	var ee *sinks.EventErrors
	if !errors.As(err, &ee) || len(ee.Errs) != n {
		t.Fatalf("Send = %v, want *sinks.EventErrors for %d events", err, n)
	}
	return ee.Errs
}

// An event over the server's max_payload is refused alone, permanently,
// before it is published (the server would drop the connection); the rest
// of its batch is acknowledged, with core NATS and with JetStream.
func TestOversizeEventRefusedAlone(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run("jetstream="+strconv.FormatBool(js), func(t *testing.T) {
			srv := startServer(t, 4096)
			w := watchWire(t, srv.ClientURL())
			s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), js), nil)
			must(t, err)
			defer s.Close(context.Background())
			batch := []*event.Event{ev("prod", "a", 1, 100), ev("prod", "b", 2, 8000), ev("prod", "c", 3, 100), ev("prod", "a", 4, 100)}
			errs := eventErrors(t, s.Send(context.Background(), batch), len(batch))
			if errs[0] != nil || errs[2] != nil || errs[3] != nil {
				t.Errorf("neighbours of the oversize event failed: %v", errs)
			}
			if !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "max_payload") {
				t.Errorf("oversize event: %v, want a permanent max_payload error", errs[1])
			}
			want := []string{batch[0].ID, batch[2].ID, batch[3].ID}
			if got := w.saw(3); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("published %v, want %v", got, want)
			}
			if !s.Conn().IsConnected() {
				t.Error("the connection was dropped")
			}
		})
	}
}

// A JetStream batch partly refused: acknowledged events (a duplicate too)
// are reported nil; an event refused for good (over the stream's
// max_msg_size) fails alone; an event that got no PubAck (a 503 error
// instead) fails, and the later events of its object are reported failed
// and never published, so an object never has two events in flight and
// the stream never holds a later event before an earlier one.
func TestJetStreamPartialFailureKeepsOrderPerObject(t *testing.T) {
	srv := startServer(t, 0)
	url := srv.ClientURL()
	ctx := context.Background()
	nc, err := natsgo.Connect(url)
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.*.apps.deployments.prod.>"}, MaxMsgSize: 3000, Duplicates: 10 * time.Minute})
	must(t, err)
	w := watchWire(t, url)
	c := sinkConfig(url, true)
	c.Stream = nil // the stream above
	s, err := Connect(ctx, "bus", c, nil)
	must(t, err)
	defer s.Close(ctx)

	a1 := ev("prod", "a", 1, 100)
	must(t, s.Send(ctx, []*event.Event{a1}))
	batch := []*event.Event{
		a1,                       // 0: stored already: a duplicate PubAck, a delivery
		ev("other", "x", 2, 100), // 1: refused for now: no PubAck
		ev("prod", "b", 3, 5000), // 2: over the stream's max_msg_size
		ev("prod", "a", 4, 100),  // 3
		ev("other", "x", 5, 100), // 4: after a failed x: held back
		ev("prod", "b", 6, 100),  // 5: b's refusal was permanent: goes
		ev("prod", "a", 7, 100),  // 6
		ev("other", "x", 8, 100), // 7: held back
		ev("void", "v", 9, 100),  // 8: a body-less answer is no PubAck
	}
	errs := eventErrors(t, s.Send(ctx, batch), len(batch))
	for _, i := range []int{0, 3, 5, 6} {
		if errs[i] != nil {
			t.Errorf("event %d: %v, want acknowledged", i, errs[i])
		}
	}
	if !sinks.IsPermanent(errs[2]) {
		t.Errorf("event 2 (too large for the stream): %v, want permanent", errs[2])
	}
	for _, i := range []int{1, 4, 7, 8} {
		if errs[i] == nil || sinks.IsPermanent(errs[i]) {
			t.Errorf("event %d (object x or v): %v, want a retryable error", i, errs[i])
		}
	}
	for _, id := range w.saw(1 << 10) {
		if id == batch[4].ID || id == batch[7].ID {
			t.Errorf("event %s was published after an earlier event of its object failed", id)
		}
	}
	info, err := stream.Info(ctx)
	must(t, err)
	if info.State.Msgs != 4 {
		t.Errorf("stream holds %d messages, want 4 (a1 once, a4, b6, a7)", info.State.Msgs)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	must(t, err)
	var got []string
	for range info.State.Msgs {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		must(t, err)
		got = append(got, m.Headers().Get("ce-id"))
	}
	pos := map[string]int{}
	for i, id := range got {
		pos[id] = i
	}
	if !(pos[batch[0].ID] < pos[batch[3].ID] && pos[batch[3].ID] < pos[batch[6].ID]) {
		t.Errorf("stream order %v breaks a's order", got)
	}
}

package nats

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

func sinkConfig(url string, js bool) *Config {
	c := &Config{URL: url, Subject: DefaultSubject, JetStream: js, Fence: js}
	if js {
		c.Stream = &Stream{Name: "K8S", Storage: "file", DuplicateWindow: config.Duration(10 * time.Minute)}
	}
	return c
}

// jsRemote reads a JetStream stream through a durable pull consumer.
type jsRemote struct {
	srv  *testenv.NATS
	nc   *natsgo.Conn
	cons jetstream.Consumer
	mu   sync.Mutex
	got  []sinkstest.Received
}

func newJSRemote(t testing.TB, srv *testenv.NATS, filter string) *jsRemote {
	nc, err := natsgo.Connect(srv.ClientURL(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.CreateOrUpdateConsumer(ctx, "K8S", jetstream.ConsumerConfig{Durable: "reader", FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	return &jsRemote{srv: srv, nc: nc, cons: cons}
}

func (r *jsRemote) Received(t testing.TB) []sinkstest.Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		batch, err := r.cons.FetchNoWait(500)
		if err != nil {
			break
		}
		n := 0
		for m := range batch.Messages() {
			n++
			got, err := sinkstest.ParseIDs([][]byte{m.Data()})
			if err != nil {
				t.Errorf("message on %s: %v", m.Subject(), err)
			}
			r.got = append(r.got, got...)
			_ = m.Ack()
		}
		if n == 0 {
			break
		}
	}
	return append([]sinkstest.Received(nil), r.got...)
}

func (r *jsRemote) Down(t testing.TB)    { r.srv.Stop() }
func (r *jsRemote) Up(t testing.TB)      { r.srv.Start(t) }
func (r *jsRemote) Restart(t testing.TB) { r.srv.Restart(t) }
func (r *jsRemote) Refuse(t testing.TB)  { t.Fatal("NATS cannot refuse") }

func TestContractJetStream(t *testing.T) {
	t.Parallel() // a NATS server of its own
	sinkstest.Run(t, sinkstest.Harness{
		Config:   config.Sink{Name: "bus"},
		Outages:  true,
		PerEvent: true,
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			srv := testenv.StartNATS(t)
			s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), true), nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, newJSRemote(t, srv, "k8s.>")
		},
	})
}

// Core NATS keeps nothing for absent subscribers, so only delivery while
// both ends are up is promised; that much must hold.
func TestContractCore(t *testing.T) {
	sinkstest.Run(t, sinkstest.Harness{
		Config:   config.Sink{Name: "bus"},
		PerEvent: true,
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			srv := testenv.StartNATS(t)
			r := &coreRemote{}
			nc, err := natsgo.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			if _, err := nc.Subscribe("k8s.>", r.add); err != nil {
				t.Fatal(err)
			}
			must(t, nc.Flush())
			s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), false), nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, r
		},
	})
}

type coreRemote struct {
	mu  sync.Mutex
	got []sinkstest.Received
}

func (r *coreRemote) add(m *natsgo.Msg) {
	got, _ := sinkstest.ParseIDs([][]byte{m.Data})
	r.mu.Lock()
	r.got = append(r.got, got...)
	r.mu.Unlock()
}
func (r *coreRemote) Received(testing.TB) []sinkstest.Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sinkstest.Received(nil), r.got...)
}
func (r *coreRemote) Down(t testing.TB)    { t.Fatal("not supported") }
func (r *coreRemote) Up(t testing.TB)      { t.Fatal("not supported") }
func (r *coreRemote) Restart(t testing.TB) { t.Fatal("not supported") }
func (r *coreRemote) Refuse(t testing.TB)  { t.Fatal("not supported") }

// The NATS server is stopped and restarted mid-stream; afterwards the
// stream holds every event id exactly once (replays deduped by
// Nats-Msg-Id), each object's in order, and the final state of every object.
func TestJetStreamRestartMidStreamExactlyOnceInStream(t *testing.T) {
	t.Parallel() // a NATS server of its own
	srv := testenv.StartNATS(t)
	s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), true), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Sink{Name: "bus", Workers: 2, Queue: config.Queue{Capacity: 100000},
		Retry: config.Retry{InitialInterval: config.Duration(10 * time.Millisecond), MaxInterval: config.Duration(200 * time.Millisecond)}}
	d := sinkstest.Start(t, cfg, s, nil)
	src := sinkstest.NewSource(100)
	var offered []string
	for i := range 3000 {
		e := src.Next(i % 300)
		offered = append(offered, e.ID)
		d.Offer(e)
		if i == 1500 {
			srv.Restart(t)
		}
	}
	// Replay everything once more, as a resync would: same ids.
	remote := newJSRemote(t, srv, "k8s.>")
	got := sinkstest.WaitFor(t, src, remote, 60*time.Second)
	sinkstest.Check(t, src, got)
	count := map[string]int{}
	for _, r := range got {
		count[r.ID]++
	}
	for _, id := range offered {
		if count[id] != 1 {
			t.Fatalf("event %s is in the stream %d times, want exactly once", id, count[id])
		}
	}
	if len(got) != len(offered) {
		t.Errorf("stream holds %d messages for %d events", len(got), len(offered))
	}
	t.Logf("stats %+v", d.Stats())
}

// A resync replays events with the same ids: the stream drops them.
func TestJetStreamDedupesReplays(t *testing.T) {
	srv := testenv.StartNATS(t)
	s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), true), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	src := sinkstest.NewSource(10)
	evs := []*event.Event{src.Next(0), src.Next(1)}
	ctx := context.Background()
	must(t, s.Send(ctx, evs))
	must(t, s.Send(ctx, []*event.Event{evs[0].WithReplay(event.ReplayResync), evs[1].WithReplay(event.ReplayResync)}))
	js, _ := jetstream.New(s.Conn())
	st, err := js.Stream(ctx, "K8S")
	must(t, err)
	info, err := st.Info(ctx)
	must(t, err)
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages after a replay of 2, want 2", info.State.Msgs)
	}
}

// A downstream durable consumer selects by wildcard subject; headers carry
// the CloudEvents attributes; tokens are sanitized reversibly.
func TestWildcardConsumerAndSubjects(t *testing.T) {
	srv := testenv.StartNATS(t)
	s, err := Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), true), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	mk := func(group, resource, ns, name string) *event.Event {
		u := &unstructured.Unstructured{Object: map[string]any{"kind": "X"}}
		u.SetNamespace(ns)
		u.SetName(name)
		u.SetUID(types.UID("u-" + name))
		u.SetResourceVersion("1")
		return event.New(&event.Rule{Name: "r", Cluster: "prod-eu-1", GVR: schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}, IncludeObject: true}, event.Added, u, nil, time.Now())
	}
	evs := []*event.Event{
		mk("apps", "deployments", "prod", "web"),
		mk("apps", "deployments", "staging", "web"),
		mk("", "configmaps", "prod", "cfg"),
		mk("example.io", "widgets", "prod", "w.1"),
		mk("", "nodes", "", "node-1"),
	}
	must(t, s.Send(context.Background(), evs))
	r := newJSRemote(t, srv, "k8s.*.apps.deployments.prod.>")
	got := r.Received(t)
	if len(got) != 1 || got[0].Subject != "prod/web" {
		t.Fatalf("wildcard consumer got %v, want only prod/web", got)
	}
	nc, _ := natsgo.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(context.Background(), "K8S")
	must(t, err)
	for subject, want := range map[string]string{
		"k8s.prod-eu-1.core.configmaps.prod.cfg.added":        "prod/cfg",
		"k8s.prod-eu-1.example%2Eio.widgets.prod.w%2E1.added": "prod/w.1",
		"k8s.prod-eu-1.core.nodes._.node-1.added":             "node-1",
	} {
		m, err := stream.GetLastMsgForSubject(context.Background(), subject)
		if err != nil {
			t.Errorf("%s: %v", subject, err)
			continue
		}
		var body map[string]any
		must(t, json.Unmarshal(m.Data, &body))
		if body["subject"] != want || m.Header.Get("ce-subject") != want || m.Header.Get("ce-specversion") != "1.0" || m.Header.Get("ce-id") != body["id"] {
			t.Errorf("%s: body subject %v, headers %v", subject, body["subject"], m.Header)
		}
	}
}

func TestTokenRoundTrip(t *testing.T) {
	for _, v := range []string{"", "apps", "example.io", "a*b>c", "50%", "sp ace", "_x", "%2E", "new\nline", "tab\tnul\x00", "del\x7f", "esc\x1b[31m", "ünï", "_", "__"} {
		tok := Token(v)
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c == '.' || c == '*' || c == '>' || c < 0x21 || c == 0x7f {
				t.Errorf("Token(%q) = %q has %q", v, tok, c)
			}
		}
		if tok == "" || Untoken(tok) != v {
			t.Errorf("Untoken(Token(%q)) = %q (token %q)", v, Untoken(tok), tok)
		}
	}
}

func FuzzToken(f *testing.F) {
	for _, s := range []string{"", "a.b", "%", "%zz", "_"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		tok := Token(v)
		if got := Untoken(tok); got != v {
			t.Fatalf("Untoken(Token(%q)) = %q", v, got)
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c == '.' || c == '*' || c == '>' || c < 0x21 || c == 0x7f {
				t.Fatalf("Token(%q) = %q has %q", v, tok, c)
			}
		}
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

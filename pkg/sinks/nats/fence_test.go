package nats

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// lastOf returns the ce-id of the stream's last message of ns/name's
// subjects, 0 messages: "".
func lastOf(t *testing.T, url, ns, name string) (id string, seq uint64) {
	t.Helper()
	nc, err := natsgo.Connect(url)
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	st, err := js.Stream(context.Background(), "K8S")
	must(t, err)
	m, err := st.GetLastMsgForSubject(context.Background(), "k8s.c.apps.deployments."+ns+"."+name+".*")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", 0
	}
	must(t, err)
	return m.Header.Get("ce-id"), m.Sequence
}

// twoReplicas starts a nats-server and connects two fenced JetStream sinks
// to it, as two replicas' sinks.
func twoReplicas(t *testing.T) (srv *server.Server, a, b *Sink) {
	t.Helper()
	srv = startServer(t, 0)
	for _, s := range []**Sink{&a, &b} {
		var err error
		*s, err = Connect(context.Background(), "bus", sinkConfig(srv.ClientURL(), true), nil)
		must(t, err)
		t.Cleanup(func() { (*s).Close(context.Background()) })
	}
	return srv, a, b
}

// A replica that gave an object up may still have bytes in flight (a
// stalled link, a buffer). They carry the sequence of the object's last
// message as that replica knew it, and the stream refuses them once the
// successor wrote the object: the stream's last message of the object
// stays the successor's. The successor, which never published the object,
// adopts the stream's sequence on its first publish and goes on.
func TestStaleOwnersLateWriteIsRefusedByTheStream(t *testing.T) {
	srv, a, b := twoReplicas(t)
	ctx := context.Background()

	must(t, a.Send(ctx, []*event.Event{ev("prod", "x", 1, 10)}))
	// What a has in flight when it gives x up: an update, rendered with the
	// expectation a holds, not yet landed.
	late := a.getMsg()
	var filter []byte
	filter = a.subject.appendFilterTo(filter, ev("prod", "x", 2, 10))
	if _, err := a.fill(late, ev("prod", "x", 2, 10), nil, 0, &expectation{filter: filter, seq: a.fence.get(a.fence.hash(filter))}); err != nil {
		t.Fatal(err)
	}

	// The successor sends x's update and deletion.
	deleted := ev("prod", "x", 3, 10)
	deleted.Change = event.Deleted
	must(t, b.Send(ctx, []*event.Event{ev("prod", "x", 3, 10)}))
	must(t, b.Send(ctx, []*event.Event{deleted}))
	if got := b.refused.Load(); got != 1 {
		t.Errorf("the successor's expectation was refused %d times, want once (it had never published x, then adopted)", got)
	}
	wantID, wantSeq := lastOf(t, srv.ClientURL(), "prod", "x")
	if wantID != deleted.ID {
		t.Fatalf("last message of x = %s, want the successor's deletion %s", wantID, deleted.ID)
	}

	// a's bytes land now.
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	_, err = js.PublishMsg(ctx, late)
	found, known, ok := fenceRefused(err)
	if !ok || !known || found != wantSeq {
		t.Fatalf("the late write: %v; want refused by the stream, naming sequence %d", err, wantSeq)
	}
	if id, _ := lastOf(t, srv.ClientURL(), "prod", "x"); id != deleted.ID {
		t.Fatalf("after the late write, the last message of x is %s, want the deletion %s", id, deleted.ID)
	}

	// A Send of a, now that its fence opened again (it owns x again):
	// it adopts the stream's sequence and is stored after the deletion.
	again := ev("prod", "x", 4, 10)
	must(t, a.Send(ctx, []*event.Event{again}))
	if id, _ := lastOf(t, srv.ClientURL(), "prod", "x"); id != again.ID {
		t.Fatalf("last message of x = %s, want %s", id, again.ID)
	}
}

// A Send whose ownership's fence fails when a refusal arrives does not
// adopt, even with its context still live (a process frozen past its
// lease, resumed before its watchdog cut the context): the event fails as
// fenced, retryable, never delivered, and the stream keeps the other
// writer's message.
func TestRefusedWithoutFenceIsNotRetried(t *testing.T) {
	srv, a, b := twoReplicas(t)
	ctx := context.Background()
	must(t, a.Send(ctx, []*event.Event{ev("prod", "y", 1, 10)}))
	must(t, b.Send(ctx, []*event.Event{ev("prod", "y", 2, 10)}))
	_, before := lastOf(t, srv.ClientURL(), "prod", "y")
	refused := a.FenceRefusals()

	lapsed := sinks.WithFence(ctx, sinks.Fence{Shard: 1, Shards: 2, Epoch: 3, Valid: func() error { return errors.New("lease last renewed 12s ago") }})
	err := a.Send(lapsed, []*event.Event{ev("prod", "y", 3, 10)})
	if err == nil {
		t.Fatal("a Send whose fence failed wrote on top of another writer's message")
	}
	if !sinks.IsFenced(err) || sinks.IsPermanent(err) {
		t.Errorf("err = %v: want fenced, retryable, never dead-lettered", err)
	}
	if _, after := lastOf(t, srv.ClientURL(), "prod", "y"); after != before {
		t.Errorf("the stream took a write from a Send whose fence had failed")
	}
	if got := a.FenceRefusals() - refused; got != 1 {
		t.Errorf("refusals = %d, want 1: the event was published once, refused, and not again", got)
	}

	// The same Send with its fence holding adopts and lands.
	valid := sinks.WithFence(ctx, sinks.Fence{Shard: 1, Shards: 2, Epoch: 3, Valid: func() error { return nil }})
	must(t, a.Send(valid, []*event.Event{ev("prod", "y", 4, 10)}))
}

// Two rules' events of one object in one batch go one after the other: in
// flight together they would expect the same sequence, and one would be
// refused.
func TestOneObjectsEventsOfTwoRulesAreNotRefused(t *testing.T) {
	srv := startServer(t, 0)
	ctx := context.Background()
	s, err := Connect(ctx, "bus", sinkConfig(srv.ClientURL(), true), nil)
	must(t, err)
	defer s.Close(ctx)
	other := &event.Rule{Name: "r2", Cluster: testRule.Cluster, GVR: testRule.GVR, IncludeObject: true}
	u := ev("prod", "z", 1, 10)
	e2 := event.New(other, event.Updated, u.Object(), nil, time.Now())
	must(t, s.Send(ctx, []*event.Event{u, e2, ev("prod", "z2", 1, 10)}))
	if got := s.FenceRefusals(); got != 0 {
		t.Errorf("%d refusals, want none", got)
	}
}

// The stream can fence an object only if its subjects are its own and the
// per-event tokens are whole tokens ("*" is a wildcard only as a whole
// token); otherwise the sink is not fenced, rather than expecting 0 from a
// filter that matches nothing.
func TestFenceableTemplates(t *testing.T) {
	for tmpl, want := range map[string]bool{
		DefaultSubject: true,
		"k8s.{cluster}.{rule}.{namespace}.{name}": true,
		"{type}.{namespace}.{name}":               true,
		"k8s.{namespace}.{name}-{type}":           false,
		"k8s.{namespace}.{name}.x{rule}":          false,
		"k8s.{namespace}.{name}.{type}{rule}":     false,
		"k8s.{cluster}.{namespace}.{type}":        false, // no {name}: objects share subjects
	} {
		c := &Config{JetStream: true, Fence: true, Subject: tmpl}
		if got := c.fenced(); got != want {
			t.Errorf("%s: fenced = %v, want %v", tmpl, got, want)
		}
	}
}

// The memory of sequences is bounded, however many objects pass.
func TestFenceMemoryIsBounded(t *testing.T) {
	l := newLastSeqs()
	for i := uint64(1); i <= maxRemembered+5000; i++ {
		l.set(i*0x9E3779B97F4A7C15, i)
	}
	if got := l.len(); got > maxRemembered {
		t.Fatalf("remembers %d sequences, over the bound %d", got, maxRemembered)
	}
}

// Objects the sink deleted are forgotten: the memory is bounded by the
// objects that exist.
func TestFenceForgetsDeletedObjects(t *testing.T) {
	srv := startServer(t, 0)
	ctx := context.Background()
	s, err := Connect(ctx, "bus", sinkConfig(srv.ClientURL(), true), nil)
	must(t, err)
	defer s.Close(ctx)
	var batch []*event.Event
	for _, n := range []string{"a", "b", "c"} {
		batch = append(batch, ev("prod", n, 1, 10))
	}
	must(t, s.Send(ctx, batch))
	if got := s.fence.len(); got != 3 {
		t.Fatalf("remembered %d objects, want 3", got)
	}
	del := ev("prod", "b", 2, 10)
	del.Change = event.Deleted
	must(t, s.Send(ctx, []*event.Event{del}))
	if got := s.fence.len(); got != 2 {
		t.Fatalf("remembered %d objects after a deletion, want 2", got)
	}
	// Re-created under the same name: the first publish adopts the
	// deletion's sequence.
	must(t, s.Send(ctx, []*event.Event{ev("prod", "b", 3, 10)}))
}

// A NATS server not reachable when the bridge starts is waited for: the
// sink's stream and the checkpoint's bucket are made once it is up,
// instead of the start failing with "outbound buffer limit exceeded".
func TestStartWaitsForNATS(t *testing.T) {
	t.Parallel() // a NATS server of its own
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	type result struct {
		s   *Sink
		err error
	}
	done := make(chan result, 1)
	kvDone := make(chan error, 1)
	go func() {
		s, err := Connect(context.Background(), "bus", sinkConfig(url, true), nil)
		done <- result{s, err}
	}()
	go func() { // the checkpoint's bucket, over a connection of its own
		opts, err := Options("bus", sinkConfig(url, true), nil)
		if err != nil {
			kvDone <- err
			return
		}
		nc, err := natsgo.Connect(url, opts...)
		if err != nil {
			kvDone <- err
			return
		}
		defer nc.Close()
		kv, err := OpenKV(context.Background(), nc, "views")
		if err == nil {
			_, err = kv.Put(context.Background(), "k", []byte("v"), 0)
		}
		kvDone <- err
	}()
	select {
	case r := <-done:
		t.Fatalf("Connect returned before the server was up: %v", r.err)
	case err := <-kvDone:
		t.Fatalf("OpenKV returned before the server was up: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	must(t, err)
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	select {
	case r := <-done:
		must(t, r.err)
		defer r.s.Close(context.Background())
		must(t, r.s.Send(context.Background(), []*event.Event{ev("prod", "a", 1, 10)}))
	case <-time.After(20 * time.Second):
		t.Fatal("Connect still waits 20 s after the server came up")
	}
	select {
	case err := <-kvDone:
		must(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("OpenKV still waits 20 s after the server came up")
	}
}

package checkpoint_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// bucket opens the bucket "views" over a connection of its own (each
// replica has its own) to srv.
func bucket(t *testing.T, srv *server.Server) *natssink.KV {
	t.Helper()
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	kv, err := natssink.OpenKV(context.Background(), nc, "views")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// A checkpoint write that a replica sent before it gave its shard up, and
// that lands after the shard's new owner wrote the key, is refused by the
// bucket: the key keeps the new owner's entry. The new owner itself,
// which loaded the view after taking the shard, writes on; a write whose
// expected revision is stale while its writer may still write adopts the
// bucket's revision and lands.
func TestKVCheckpointFencesStaleWrites(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx := context.Background()
	kvA, kvB := bucket(t, srv), bucket(t, srv)
	a, b := checkpoint.NewKV(kvA), checkpoint.NewKV(kvB)

	put := func(s *checkpoint.KV, rv string) {
		t.Helper()
		if err := s.Apply(ctx, []checkpoint.Change{{Sink: "bus.shard-1", Rule: "cms", Key: "ns/x", Entry: &checkpoint.Entry{UID: "u1", ResourceVersion: rv, Name: "x"}}}); err != nil {
			t.Fatal(err)
		}
	}
	held := func() string {
		t.Helper()
		v, err := b.Load(ctx, "bus.shard-1", "cms")
		if err != nil {
			t.Fatal(err)
		}
		return v["ns/x"].ResourceVersion
	}
	put(a, "1")
	// The write a has in flight when it gives the shard up: the key at the
	// revision a knows.
	key := "bus.shard-1.cms.bnMveA" // kvKey: base64url("ns/x")
	e, ok, err := kvA.Get(ctx, key)
	if err != nil || !ok {
		t.Fatalf("a's entry: %v %v", ok, err)
	}

	// b takes the shard: loads, then writes x's entry.
	if rv := held(); rv != "1" {
		t.Fatalf("b loaded rv %q, want 1", rv)
	}
	put(b, "3")

	// a's write lands now, and is refused.
	_, err = kvA.Put(ctx, key, []byte(`{"uid":"u1","rv":"2","name":"x"}`), e.Revision)
	var re *sinks.RevisionError
	if !errors.As(err, &re) || !sinks.IsFenced(err) {
		t.Fatalf("a's late write: %v, want a *sinks.RevisionError (fenced)", err)
	}
	if rv := held(); rv != "3" {
		t.Fatalf("after a's late write the checkpoint holds rv %q, want b's 3", rv)
	}

	// A deletion at a stale revision is refused alike.
	if _, err := kvA.Delete(ctx, key, e.Revision); !errors.As(err, &re) {
		t.Fatalf("a's late deletion: %v, want refused", err)
	}
	if rv := held(); rv != "3" {
		t.Fatalf("after a's late deletion the checkpoint holds rv %q, want b's 3", rv)
	}

	// a owns the shard again (b gave it back): its memory of the key is
	// stale, its write adopts the bucket's revision and lands; so does a
	// deletion only while the entry is the incarnation named.
	put(a, "4")
	if rv := held(); rv != "4" {
		t.Fatalf("a's write as the owner again: checkpoint holds rv %q, want 4", rv)
	}
	if err := a.Apply(ctx, []checkpoint.Change{{Sink: "bus.shard-1", Rule: "cms", Key: "ns/x", IfUID: "other"}}); err != nil {
		t.Fatal(err)
	}
	if rv := held(); rv != "4" {
		t.Fatalf("a deletion for another incarnation removed the entry")
	}
	if err := b.Apply(ctx, []checkpoint.Change{{Sink: "bus.shard-1", Rule: "cms", Key: "ns/x", IfUID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if rv := held(); rv != "" {
		t.Fatalf("the entry survived its deletion: rv %q", rv)
	}
}

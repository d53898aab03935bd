package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

func natsSinkCfg(name, url, subject string) config.Sink {
	return config.Sink{Name: name, Type: "nats", Spec: &natssink.Config{URL: url, Subject: subject}}
}

func natsDeadLetter(sink string) *config.DeadLetter {
	return &config.DeadLetter{NATS: &config.DeadLetterNATS{Sink: sink, Subject: "dead"}}
}

// hostConn returns the connection of the NATS dead-letter into sink.
func hostConn(t *testing.T, h *host, cfg *config.Config, sink string) (*natssink.DeadLetter, error) {
	t.Helper()
	dl, closeDL, err := h.deadLetter(context.Background(), cfg, natsDeadLetter(sink))
	if err != nil {
		return nil, err
	}
	if closeDL != nil {
		t.Error("a NATS dead-letter has a closer: the host owns its connection")
	}
	return dl.(*natssink.DeadLetter), nil
}

// The KV checkpoint and NATS dead-letters use a connection the host owns
// (the nats type keeps it in the host's pool): sinks that connect alike
// (whatever they publish) share one, which outlives the sinks and closes
// with the host; other settings get their own.
func TestNATSConnectionsAreSharedByConnectionSettings(t *testing.T) {
	srv := testenv.StartNATS(t)
	other := testenv.StartNATS(t)
	ctx := context.Background()
	cfg := &config.Config{Sinks: []config.Sink{
		natsSinkCfg("a", srv.ClientURL(), "a.{name}"),
		natsSinkCfg("b", srv.ClientURL(), "b.{type}.{name}"),
		natsSinkCfg("c", other.ClientURL(), "a.{name}"),
		{Name: "w", Type: "webhook"},
	}}
	h := newHost(discard, components.SinkRegistry())
	da, err := hostConn(t, h, cfg, "a")
	if err != nil {
		t.Fatal(err)
	}
	db, err := hostConn(t, h, cfg, "b")
	if err != nil {
		t.Fatal(err)
	}
	dc, err := hostConn(t, h, cfg, "c")
	if err != nil {
		t.Fatal(err)
	}
	ca, cc := da.NC, dc.NC
	if ca != db.NC {
		t.Error("sinks a and b connect alike but got two connections")
	}
	if ca == cc {
		t.Error("sink c connects elsewhere but shares a's connection")
	}
	if da.Subject != "dead" {
		t.Errorf("subject = %q", da.Subject)
	}
	// The checkpoint's bucket is on the same connection: after the host
	// closes, it cannot be used either.
	cfg.Checkpoint.NATSKV = &config.NATSKVCheckpoint{Sink: "b", Bucket: "views"}
	store, ok, err := h.checkpointStore(ctx, cfg)
	if !ok || err != nil {
		t.Fatalf("checkpoint store: ok %v, err %v", ok, err)
	}
	if err := store.Apply(ctx, []checkpoint.Change{{Sink: "a", Rule: "r", Key: "ns/x", Entry: &checkpoint.Entry{UID: "u", ResourceVersion: "1", Name: "x"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := hostConn(t, h, cfg, "w"); err == nil || err.Error() != `sink "w" is not a nats sink` {
		t.Errorf("webhook sink: err = %v", err)
	}
	if _, err := hostConn(t, h, cfg, "nope"); err == nil {
		t.Error("unknown sink: no error")
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.close(ctx); err != nil {
		t.Fatal(err)
	}
	if !ca.IsClosed() || !cc.IsClosed() {
		t.Error("the host's connections are still open after close")
	}
	if _, err := store.Load(ctx, "a", "r"); err == nil {
		t.Error("the checkpoint's bucket works after the host closed its connection")
	}
}

// An embedded server is the host's: the sink and the host's own connection
// (KV checkpoint, dead-letters) are its clients, so closing or replacing
// the sink (a reload) leaves the host's connection working, and the sink
// built again connects to the same server; the server stops when the host
// closes, after its clients.
func TestEmbeddedServerIsTheHosts(t *testing.T) {
	ctx := context.Background()
	t.Setenv("KUBEBRIDGE_DATA_DIR", t.TempDir())
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort())
	sc := config.Sink{Name: "bus", Type: "nats", Spec: &natssink.Config{Embedded: true, URL: "nats://" + addr, Subject: natssink.DefaultSubject, JetStream: true}}
	cfg := &config.Config{Sinks: []config.Sink{sc}}
	h := newHost(discard, components.SinkRegistry())
	set, _, err := buildSinkSet(ctx, h.sinks, cfg.Sinks, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	if set.order[0].cfg.Spec.(*natssink.Config) != sc.Spec {
		t.Error("the bridge rewrote the sink's config")
	}
	dl, err := hostConn(t, h, cfg, "bus")
	if err != nil {
		t.Fatal(err)
	}
	nc := dl.NC
	sinkConn := set.order[0].sink.(*natssink.Sink).Conn()
	if nc == sinkConn {
		t.Fatal("the host borrows the sink's connection")
	}
	server := sinkConn.ConnectedServerId()
	if nc.ConnectedServerId() != server {
		t.Error("the host's connection and the sink's are to different servers")
	}
	if err := set.order[0].close(ctx); err != nil { // as a reload retires it
		t.Fatal(err)
	}
	if !sinkConn.IsClosed() {
		t.Error("the sink's connection is open after its close")
	}
	if err := nc.Publish("k8s.test", []byte("x")); err != nil || nc.Flush() != nil || !nc.IsConnected() {
		t.Errorf("the host's connection does not work after the sink closed: %v", err)
	}
	// Built again (a reload): a client of the same server.
	again, _, err := buildSinkSet(ctx, h.sinks, cfg.Sinks, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.order[0].sink.(*natssink.Sink).Conn().ConnectedServerId(); got != server {
		t.Errorf("a second server was started for the same settings: %s, was %s", got, server)
	}
	if err := again.order[0].close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.close(ctx); err != nil {
		t.Fatal(err)
	}
	if !nc.IsClosed() {
		t.Error("the host's connection is open after close")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the embedded server still listens after the host closed")
	}
}

// An embedded sink that also holds the KV checkpoint and takes another
// sink's dead letters runs one server, the host's: the deliverer starts it
// as a client, the checkpoint and the dead-letter connect to it through
// the host, a reload with the same config keeps both runs, and it stops
// with the host.
func TestEmbeddedSinkHoldsCheckpointAndDeadLetters(t *testing.T) {
	ctx := context.Background()
	t.Setenv("KUBEBRIDGE_DATA_DIR", t.TempDir())
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort())
	delivered := func(name string, spec *natssink.Config) config.Sink {
		return config.Sink{Name: name, Type: "nats", Spec: spec, Workers: 1, Queue: config.Queue{Capacity: 100},
			Retry: config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(10 * time.Millisecond)}}
	}
	bus := delivered("bus", &natssink.Config{Embedded: true, URL: "nats://" + addr, Subject: natssink.DefaultSubject, JetStream: true})
	cp := delivered("copy", &natssink.Config{URL: "nats://" + addr, Subject: "copy.{name}"})
	cp.DeadLetter = natsDeadLetter("bus")
	cfg := &config.Config{Sinks: []config.Sink{bus, cp},
		Checkpoint: config.Checkpoint{NATSKV: &config.NATSKVCheckpoint{Sink: "bus", Bucket: "views"}}}

	h := newHost(discard, components.SinkRegistry())
	d := newDeliverer(delivererOptions{Registry: h.sinks, Host: h, Logger: discard, CheckpointInterval: time.Hour,
		Source: func() ([]*filters.Rule, source) { return nil, nil },
		OpenStore: func(ctx context.Context) (checkpoint.Store, func() error, error) {
			store, _, err := h.checkpointStore(ctx, cfg)
			if err != nil {
				return nil, nil, err
			}
			return store, store.Close, nil
		}})
	if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
		t.Fatal(err)
	}
	nc, err := natsgo.Connect("nats://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.KeyValue(ctx, "views"); err != nil {
		t.Errorf("the checkpoint's bucket is not on the embedded server: %v", err)
	}
	if next, retired, err := buildSinkSet(ctx, h.sinks, cfg.Sinks, d.currentSet(), discard); err != nil || len(retired) != 0 || len(next.order) != 2 {
		t.Errorf("a reload with the same config: retired %d, err %v", len(retired), err)
	}
	if _, err := d.stop(cancelled(), true); err != nil {
		t.Fatal(err)
	}
	if !nc.IsConnected() {
		t.Error("the embedded server stopped with the sinks")
	}
	if err := h.close(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the embedded server still listens after the host closed")
	}
}

// memStore is what a third-party sink type, mem, keeps in the host for its
// capabilities: one per sink, shared by its dead-letter and its bucket.
type memStore struct {
	mu     sync.Mutex
	kv     map[string][]byte
	revs   map[string]uint64 // a key's last revision, a deletion's too
	seq    uint64
	dead   []string // subject: event id
	closed bool
}

func (m *memStore) Put(_ context.Context, _ string, evs []*event.Event, _ error) error { // a dead-letter
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range evs {
		m.dead = append(m.dead, e.ID)
	}
	return nil
}

type memBucket struct{ *memStore }

func (b memBucket) Get(_ context.Context, key string) (sinks.KVEntry, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.kv[key]
	return sinks.KVEntry{Value: v, Revision: b.revs[key]}, ok, nil
}

// write applies a write expecting last, as a bucket that fences does.
func (b memBucket) write(key string, last uint64, apply func()) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errors.New("closed")
	}
	if b.revs[key] != last {
		return 0, &sinks.RevisionError{Key: key, Current: b.revs[key], Err: errors.New("wrong last revision")}
	}
	apply()
	b.seq++
	b.revs[key] = b.seq
	return b.seq, nil
}

func (b memBucket) Put(_ context.Context, key string, value []byte, last uint64) (uint64, error) {
	return b.write(key, last, func() { b.kv[key] = value })
}

func (b memBucket) Delete(_ context.Context, key string, last uint64) (uint64, error) {
	return b.write(key, last, func() { delete(b.kv, key) })
}

func (b memBucket) List(_ context.Context, prefix string) (map[string]sinks.KVEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]sinks.KVEntry{}
	for k, v := range b.kv {
		if strings.HasPrefix(k, prefix) {
			out[k] = sinks.KVEntry{Value: v, Revision: b.revs[k]}
		}
	}
	return out, nil
}

func (memBucket) Close() error { return nil }

type memConfig struct {
	Note string `yaml:"note"`
}

type memSink struct{}

func (memSink) Send(context.Context, []*event.Event) error { return nil }
func (memSink) Close(context.Context) error                { return nil }

// memFactory is a sink type from outside the core that provides
// dead-letters and the checkpoint's bucket.
func memFactory(opened *int) sinks.Factory {
	store := func(ctx context.Context, s sinks.Settings) (*memStore, error) {
		v, err := s.Host.Shared(ctx, "mem."+s.Name, func(context.Context) (any, func(context.Context) error, error) {
			*opened++
			m := &memStore{kv: map[string][]byte{}, revs: map[string]uint64{}}
			return m, func(context.Context) error { m.mu.Lock(); m.closed = true; m.mu.Unlock(); return nil }, nil
		})
		if err != nil {
			return nil, err
		}
		return v.(*memStore), nil
	}
	return sinks.Factory{
		Type:      "mem",
		NewConfig: func() any { return &memConfig{} },
		Create:    func(context.Context, sinks.Settings) (sinks.Sink, error) { return memSink{}, nil },
		DeadLetter: func(ctx context.Context, s sinks.Settings, target string) (sinks.DeadLetter, error) {
			if target != "dead.letters" {
				return nil, errors.New("target = " + target)
			}
			return store(ctx, s)
		},
		KV: func(ctx context.Context, s sinks.Settings, bucket string) (sinks.KV, error) {
			if bucket != "views" {
				return nil, errors.New("bucket = " + bucket)
			}
			m, err := store(ctx, s)
			return memBucket{m}, err
		},
	}
}

// A sink type registered with the dead-letter and key-value capabilities
// can be named by another sink's deadLetter and by the checkpoint with no
// change to the core: the config's validation asks the registry, and the
// host asks the type's factory, whose resources it closes.
func TestThirdPartyTypeProvidesDeadLetterAndCheckpoint(t *testing.T) {
	ctx := context.Background()
	opened := 0
	reg, err := sinks.NewRegistry(append(components.Sinks(), memFactory(&opened))...)
	if err != nil {
		t.Fatal(err)
	}
	doc := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: test
checkpoint: {natsKV: {sink: store, bucket: views}}
sinks:
  - name: store
    mem: {note: x}
  - name: hook
    webhook: {url: "https://hooks.example.com/k8s"}
    deadLetter: {nats: {sink: store, subject: dead.letters}}
rules:
  - name: cms
    resource: v1/configmaps
    sinks: [store, hook]
`
	cfg, _, err := config.Parse("c.yaml", []byte(doc), reg)
	if err != nil {
		t.Fatal(err)
	}
	h := newHost(discard, reg)
	store, ok, err := h.checkpointStore(ctx, cfg)
	if !ok || err != nil {
		t.Fatalf("checkpoint store: ok %v, err %v", ok, err)
	}
	if err := store.Apply(ctx, []checkpoint.Change{{Sink: "hook", Rule: "cms", Key: "ns/x", Entry: &checkpoint.Entry{UID: "u", ResourceVersion: "7", Name: "x"}}}); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Load(ctx, "hook", "cms"); err != nil || got["ns/x"].ResourceVersion != "7" {
		t.Errorf("checkpoint: %v, %v", got, err)
	}
	dl, closeDL, err := h.deadLetter(ctx, cfg, cfg.Sinks[1].DeadLetter)
	if err != nil || closeDL != nil {
		t.Fatalf("dead-letter: closer %v, err %v", closeDL != nil, err)
	}
	if err := dl.Put(ctx, "hook", []*event.Event{{ID: "e1"}}, errors.New("refused")); err != nil {
		t.Fatal(err)
	}
	m := dl.(*memStore)
	if opened != 1 || len(m.dead) != 1 || m.dead[0] != "e1" {
		t.Errorf("opened %d stores, dead letters %v", opened, m.dead)
	}
	if err := h.close(ctx); err != nil {
		t.Fatal(err)
	}
	if !m.closed {
		t.Error("the host did not close what the type shared through it")
	}

	// A type that does not provide it is refused by name, at its path.
	bad := strings.Replace(doc, "{nats: {sink: store,", "{nats: {sink: hook,", 1)
	if _, _, err := config.Parse("c.yaml", []byte(bad), reg); err == nil || !strings.Contains(err.Error(), `sinks[1].deadLetter.nats.sink: sink "hook" is not a mem or nats sink`) {
		t.Errorf("deadLetter into a webhook: err = %v", err)
	}
	bad = strings.Replace(doc, "{natsKV: {sink: store,", "{natsKV: {sink: hook,", 1)
	if _, _, err := config.Parse("c.yaml", []byte(bad), reg); err == nil || !strings.Contains(err.Error(), `checkpoint.natsKV.sink: sink "hook" is not a mem or nats sink`) {
		t.Errorf("checkpoint in a webhook: err = %v", err)
	}
}

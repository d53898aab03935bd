package bridge

import (
	"context"
	"net"
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

func natsSinkCfg(name, url, subject string) config.Sink {
	return config.Sink{Name: name, Type: "nats", Spec: &natssink.Config{URL: url, Subject: subject}}
}

// The KV checkpoint and NATS dead-letters use a connection the bridge
// owns: sinks that connect alike (whatever they publish) share one, which
// outlives the sinks and closes with the bridge; other settings get their
// own.
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
	h := newHost(discard)
	ca, err := h.natsConn(ctx, cfg, "a")
	if err != nil {
		t.Fatal(err)
	}
	cb, err := h.natsConn(ctx, cfg, "b")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := h.natsConn(ctx, cfg, "c")
	if err != nil {
		t.Fatal(err)
	}
	if ca != cb {
		t.Error("sinks a and b connect alike but got two connections")
	}
	if ca == cc {
		t.Error("sink c connects elsewhere but shares a's connection")
	}
	if _, err := h.natsConn(ctx, cfg, "w"); err == nil || err.Error() != `sink "w" is not a nats sink` {
		t.Errorf("webhook sink: err = %v", err)
	}
	if _, err := h.natsConn(ctx, cfg, "nope"); err == nil {
		t.Error("unknown sink: no error")
	}
	if err := h.close(ctx); err != nil {
		t.Fatal(err)
	}
	if !ca.IsClosed() || !cc.IsClosed() {
		t.Error("the bridge's connections are still open after closeAll")
	}
}

// An embedded server is the bridge's: the sink and the bridge's own
// connection (KV checkpoint, dead-letters) are its clients, so closing or
// replacing the sink (a reload) leaves the bridge's connection working;
// the server stops at closeAll, after its clients.
func TestEmbeddedServerIsTheBridges(t *testing.T) {
	ctx := context.Background()
	t.Setenv("KUBEBRIDGE_DATA_DIR", t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	sc := config.Sink{Name: "bus", Type: "nats", Spec: &natssink.Config{Embedded: true, URL: "nats://" + addr, Subject: natssink.DefaultSubject, JetStream: true}}
	cfg := &config.Config{Sinks: []config.Sink{sc}}
	h := newHost(discard)
	cfgs, err := h.sinkConfigs(cfg.Sinks)
	if err != nil {
		t.Fatal(err)
	}
	set, _, err := buildSinkSet(ctx, components.SinkRegistry(), cfgs, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := h.natsConn(ctx, cfg, "bus")
	if err != nil {
		t.Fatal(err)
	}
	sinkConn := set.order[0].sink.(*natssink.Sink).Conn()
	if nc == sinkConn {
		t.Fatal("the bridge borrows the sink's connection")
	}
	if err := set.order[0].close(ctx); err != nil { // as a reload retires it
		t.Fatal(err)
	}
	if !sinkConn.IsClosed() {
		t.Error("the sink's connection is open after its close")
	}
	if err := nc.Publish("k8s.test", []byte("x")); err != nil || nc.Flush() != nil || !nc.IsConnected() {
		t.Errorf("the bridge's connection does not work after the sink closed: %v", err)
	}
	// Built again (a reload): the same server.
	again, err := h.sinkConfigs(cfg.Sinks)
	if err != nil {
		t.Fatal(err)
	}
	if again[0].Spec.(*natssink.Config).URL != cfgs[0].Spec.(*natssink.Config).URL {
		t.Error("a second server was started for the same settings")
	}
	if err := h.close(ctx); err != nil {
		t.Fatal(err)
	}
	if !nc.IsClosed() {
		t.Error("the bridge's connection is open after closeAll")
	}
}

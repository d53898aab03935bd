package bridge

import (
	"context"
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
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
	b := New(Options{Config: cfg, Logger: discard})
	ca, err := b.natsConn(ctx, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.natsConn(ctx, "b", nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := b.natsConn(ctx, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ca != cb {
		t.Error("sinks a and b connect alike but got two connections")
	}
	if ca == cc {
		t.Error("sink c connects elsewhere but shares a's connection")
	}
	if _, err := b.natsConn(ctx, "w", nil); err == nil || err.Error() != `sink "w" is not a nats sink` {
		t.Errorf("webhook sink: err = %v", err)
	}
	if _, err := b.natsConn(ctx, "nope", nil); err == nil {
		t.Error("unknown sink: no error")
	}
	if err := b.closeAll(ctx); err != nil {
		t.Fatal(err)
	}
	if !ca.IsClosed() || !cc.IsClosed() {
		t.Error("the bridge's connections are still open after closeAll")
	}
}

// An embedded server lives inside its sink: its connection is borrowed
// from the running sink, and there is none while the sink does not run.
func TestNATSConnectionOfAnEmbeddedServerIsBorrowed(t *testing.T) {
	ctx := context.Background()
	sc := config.Sink{Name: "bus", Type: "nats", Spec: &natssink.Config{Embedded: true, Subject: natssink.DefaultSubject}}
	b := New(Options{Config: &config.Config{Sinks: []config.Sink{sc}}, Logger: discard})
	if _, err := b.natsConn(ctx, "bus", nil); err == nil || err.Error() != `sink "bus" is not running` {
		t.Errorf("err = %v", err)
	}
	set, _, err := buildSinkSet(ctx, b.opts.Sinks, []config.Sink{sc}, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	defer set.order[0].close(ctx)
	nc, err := b.natsConn(ctx, "bus", set)
	if err != nil {
		t.Fatal(err)
	}
	if nc != set.order[0].sink.(*natssink.Sink).Conn() {
		t.Error("not the sink's own connection")
	}
}

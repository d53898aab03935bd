package sinks

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// nopSink takes everything.
type nopSink struct{}

func (nopSink) Send(context.Context, []*event.Event) error { return nil }
func (nopSink) Close(context.Context) error                { return nil }

func TestRegistryRejectsDuplicates(t *testing.T) {
	f := Factory{Type: "x", NewConfig: func() any { return &struct{}{} }, Create: func(context.Context, Settings) (Sink, error) { return nopSink{}, nil }}
	if _, err := NewRegistry(f, f); err == nil || err.Error() != `sinks: duplicate factory for type "x"` {
		t.Errorf("err = %v", err)
	}
	r, err := NewRegistry(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(context.Background(), config.Sink{Name: "n", Type: "file"}, nil); err == nil || err.Error() != `sink "n": type "file" is not available in this build (have: [x])` {
		t.Errorf("err = %v", err)
	}
}

// A factory gets the sink's own part of the config: its name, its decoded
// type block, how the delivery calls it, and a logger even when none was
// given.
func TestRegistryHandsTheSinksOwnSettings(t *testing.T) {
	type myConfig struct{ Prefix string }
	var got Settings
	r, err := NewRegistry(Factory{Type: "mine", NewConfig: func() any { return &myConfig{} },
		Create: func(_ context.Context, s Settings) (Sink, error) { got = s; return nopSink{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	spec := &myConfig{Prefix: "p"}
	sc := config.Sink{Name: "audit", Type: "mine", Spec: spec, Workers: 4, Retry: config.Retry{MaxInterval: config.Duration(7 * time.Second)}}
	if _, err := r.Create(context.Background(), sc, nil); err != nil {
		t.Fatal(err)
	}
	if got.Name != "audit" || got.Config != spec || got.InFlight != 4 || got.MaxRetryInterval != 7*time.Second || got.Logger == nil || got.Host != nil {
		t.Errorf("settings %+v", got)
	}
}

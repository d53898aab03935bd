package sinks

import (
	"context"
	"testing"

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
	if _, err := r.Create(context.Background(), Settings{Config: config.Sink{Name: "n", Type: "file"}}); err == nil || err.Error() != `sink "n": type "file" is not available in this build (have: [x])` {
		t.Errorf("err = %v", err)
	}
}

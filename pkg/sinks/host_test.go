package sinks

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// A pool opens each key once, however many ask at once; keeps no failed
// open; closes the last opened first (a connection before the server its
// open asked for), and is empty and usable again after Close.
func TestPoolSharesByKeyAndClosesInReverse(t *testing.T) {
	ctx := context.Background()
	p := NewPool()
	var closed []string
	opener := func(name string, opens *atomic.Int32) OpenFunc {
		return func(context.Context) (any, func(context.Context) error, error) {
			opens.Add(1)
			return name, func(context.Context) error { closed = append(closed, name); return nil }, nil
		}
	}
	var serverOpens, connOpens atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := p.Shared(ctx, "t.conn", func(ctx context.Context) (any, func(context.Context) error, error) {
				if _, err := p.Shared(ctx, "t.server", opener("server", &serverOpens)); err != nil {
					return nil, nil, err
				}
				return opener("conn", &connOpens)(ctx)
			})
			if err != nil || v != "conn" {
				t.Errorf("Shared = %v, %v", v, err)
			}
		}()
	}
	wg.Wait()
	if serverOpens.Load() != 1 || connOpens.Load() != 1 {
		t.Errorf("opened the server %d times, the connection %d times", serverOpens.Load(), connOpens.Load())
	}

	failing := errors.New("refused")
	if _, err := p.Shared(ctx, "t.flaky", func(context.Context) (any, func(context.Context) error, error) { return nil, nil, failing }); !errors.Is(err, failing) {
		t.Errorf("failed open: err = %v", err)
	}
	var flakyOpens atomic.Int32
	if v, err := p.Shared(ctx, "t.flaky", opener("flaky", &flakyOpens)); err != nil || v != "flaky" {
		t.Errorf("after a failed open: %v, %v", v, err)
	}
	if v, err := p.Shared(ctx, "t.none", func(context.Context) (any, func(context.Context) error, error) { return 1, nil, nil }); err != nil || v != 1 {
		t.Errorf("no closer: %v, %v", v, err)
	}

	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"flaky", "conn", "server"}; !reflect.DeepEqual(closed, want) {
		t.Errorf("closed %v, want %v", closed, want)
	}
	if _, err := p.Shared(ctx, "t.server", opener("server", &serverOpens)); err != nil || serverOpens.Load() != 2 {
		t.Errorf("after Close: err %v, opens %d (want a new open)", err, serverOpens.Load())
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// The registry says which types provide what, from their factories, and
// hands its host to the factories of a registry WithHost.
func TestRegistryCapabilitiesAndHost(t *testing.T) {
	var got Host
	create := func(_ context.Context, s Settings) (Sink, error) { got = s.Host; return nil, nil }
	newConfig := func() any { return &struct{}{} }
	dl := func(_ context.Context, s Settings, target string) (DeadLetter, error) {
		got = s.Host
		return nil, fmt.Errorf("dead letters to %s", target)
	}
	r, err := NewRegistry(
		Factory{Type: "plain", NewConfig: newConfig, Create: create},
		Factory{Type: "bus", NewConfig: newConfig, Create: create, DeadLetter: dl},
		Factory{Type: "queue", NewConfig: newConfig, Create: create, DeadLetter: dl},
	)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Provides("bus", config.DeadLetterSink) || r.Provides("bus", config.CheckpointKV) || r.Provides("plain", config.DeadLetterSink) || r.Provides("nope", config.DeadLetterSink) {
		t.Error("Provides does not follow the factories")
	}
	ctx := context.Background()
	_, err = r.DeadLetter(ctx, config.Sink{Name: "p", Type: "plain"}, nil, "x")
	if err == nil || err.Error() != `sink "p" is not a bus or queue sink` {
		t.Errorf("a type without the capability: err = %v", err)
	}
	_, err = r.KV(ctx, config.Sink{Name: "b", Type: "bus"}, nil, "views")
	if err == nil || err.Error() != `sink "b" cannot provide the checkpoint's key-value bucket: no sink type of this build does` {
		t.Errorf("a capability no type provides: err = %v", err)
	}

	pool := NewPool()
	hosted := r.WithHost(pool)
	if _, err := hosted.Create(ctx, config.Sink{Name: "p", Type: "plain"}, nil); err != nil || got != pool {
		t.Errorf("Create got host %v (err %v), want the pool", got, err)
	}
	if _, err := hosted.DeadLetter(ctx, config.Sink{Name: "b", Type: "bus"}, nil, "dead"); err == nil || err.Error() != "dead letters to dead" || got != pool {
		t.Errorf("DeadLetter got host %v, err %v", got, err)
	}
	if _, err := r.Create(ctx, config.Sink{Name: "p", Type: "plain"}, nil); err != nil || got != nil {
		t.Error("the registry without a host handed one")
	}
}

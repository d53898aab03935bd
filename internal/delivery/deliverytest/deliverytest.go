// Package deliverytest runs a sink behind the bridge's own delivery
// engine in kubebridge's tests, where what is tested is the engine with a
// real sink (adaptive concurrency into a slow receiver, a drain, a
// benchmark of the whole path). A sink's contract needs no engine of the
// bridge: pkg/sinks/sinkstest drives it with a loop of its own.
package deliverytest

import (
	"context"
	"testing"

	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Start runs a delivery for sink until the test ends, then closes the
// sink. dl may be nil.
func Start(t testing.TB, cfg config.Sink, sink sinks.Sink, dl sinks.DeadLetter) *delivery.Delivery {
	d := delivery.New(delivery.Options{Config: cfg, Sink: sink, DeadLetter: dl})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = sink.Close(context.Background())
	})
	return d
}

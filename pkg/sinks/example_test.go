package sinks_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// printSink shows the whole contract of a sink: Send gets batches in
// delivery order from one goroutine and returns nil only once every event is
// acknowledged; it classifies failures (sinks.Permanent for what a retry
// cannot fix) and never retries itself; Close releases resources.
type printSink struct{}

func (printSink) Send(_ context.Context, events []*event.Event) error {
	for _, e := range events {
		if e.Name == "" {
			return sinks.Permanent(fmt.Errorf("event %s has no object name", e.ID))
		}
		fmt.Println(e.Type, e.Subject, e.UID, e.Object().GetResourceVersion())
	}
	return nil // acknowledged: the delivery loop moves on
}

func (printSink) Close(context.Context) error { return nil }

// Example_writeASink registers a sink type and runs it behind the delivery
// loop every sink shares (queue, batching, retry with backoff).
func Example_writeASink() {
	registry, err := sinks.NewRegistry(sinks.Factory{
		Type:   "file", // the config block that selects it; here it stands in for a new one
		Create: func(context.Context, sinks.Settings) (sinks.Sink, error) { return printSink{}, nil },
	})
	if err != nil {
		panic(err)
	}
	cfg := config.Sink{Name: "demo", File: &config.FileSink{Path: "-"}, Queue: config.Queue{Capacity: 10},
		Retry: config.Retry{InitialInterval: config.Duration(10 * time.Millisecond), MaxInterval: config.Duration(time.Second)}}
	sink, err := registry.Create(context.Background(), sinks.Settings{Config: cfg})
	if err != nil {
		panic(err)
	}
	d := sinks.NewDelivery(cfg, sink, nil, slog.New(slog.DiscardHandler))

	obj := &unstructured.Unstructured{}
	obj.SetNamespace("prod")
	obj.SetName("web")
	obj.SetUID("1234")
	obj.SetResourceVersion("7")
	rule := &event.Rule{Name: "r", Cluster: "dev", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}}
	d.Offer(event.New(rule, event.Added, obj, nil, time.Now()))

	d.Close() // no more events: Run drains the queue and returns
	d.Run(context.Background())
	// Output: io.kubebridge.deployments.apps.added prod/web 1234 7
}

package sinks_test

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// printConfig is the config of the new sink type: the block under its key
// (print:) is decoded into it strictly; SetDefaults and Validate make it
// own its defaults and checks, reported with paths and lines by the loader.
type printConfig struct {
	// Prefix starts every printed line. Default ">".
	Prefix string `yaml:"prefix"`
}

func (c *printConfig) SetDefaults() { c.Prefix = ">" }

func (c *printConfig) Validate() error {
	if c.Prefix == "" {
		return config.ErrorAt("prefix", "must not be empty")
	}
	return nil
}

// printSink shows the whole contract of a sink: Send gets batches in
// delivery order and returns nil only once every event is acknowledged; it
// classifies failures (sinks.Permanent for what a retry cannot fix) and
// never retries itself; Close releases resources.
type printSink struct{ prefix string }

func (p printSink) Send(_ context.Context, events []*event.Event) error {
	for _, e := range events {
		if e.Name() == "" {
			return sinks.Permanent(fmt.Errorf("event %s has no object name", e.ID))
		}
		fmt.Println(p.prefix, e.Type(), e.Subject, e.UID(), e.Object().GetResourceVersion())
	}
	return nil // acknowledged: the delivery loop moves on
}

func (printSink) Close(context.Context) error { return nil }

// printFactory is the whole component: in a real build it is exported by
// its own package and listed in pkg/components (one line), or in the main
// of a bridge of one's own (cmd/bridgecmd, docs/sdk.md).
var printFactory = sinks.Factory{
	Type:      "print",
	NewConfig: func() any { c := &printConfig{}; c.SetDefaults(); return c },
	Create: func(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
		return printSink{prefix: s.Config.(*printConfig).Prefix}, nil
	},
}

// Example_writeASink adds a sink type, loads a config that uses it, builds
// the sink as the bridge does and sends it an event, as the delivery loop
// every sink shares does (queue, batching, retry: the bridge's;
// sinkstest.Start runs one in tests).
func Example_writeASink() {
	registry, err := sinks.NewRegistry(append(components.Sinks(), printFactory)...)
	if err != nil {
		panic(err)
	}
	cfg, _, err := config.Parse("example.yaml", []byte(`
apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: screen
    print: {prefix: "event:"}
rules:
  - name: deployments
    resource: apps/v1/deployments
    sinks: [screen]
`), registry)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	sink, err := registry.Create(ctx, cfg.Sinks[0], nil)
	if err != nil {
		panic(err)
	}

	obj := &unstructured.Unstructured{}
	obj.SetNamespace("prod")
	obj.SetName("web")
	obj.SetUID("1234")
	obj.SetResourceVersion("7")
	rule := &event.Rule{Name: "r", Cluster: "dev", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}}
	if err := sink.Send(ctx, []*event.Event{event.New(rule, event.Added, obj, nil, time.Now())}); err != nil {
		panic(err)
	}
	if err := sink.Close(ctx); err != nil {
		panic(err)
	}
	// Output: event: io.kubebridge.deployments.apps.added prod/web 1234 7
}

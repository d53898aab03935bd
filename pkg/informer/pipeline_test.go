package informer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/file"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/sinks/webhook"
)

// nullSink acknowledges everything; with encode it first renders each
// event as a byte-sink would.
type nullSink struct {
	encode bool
	n      atomic.Int64
}

func (s *nullSink) Send(_ context.Context, evs []*event.Event) error {
	if s.encode {
		for _, e := range evs {
			if _, err := e.Structured(); err != nil {
				return err
			}
		}
	}
	s.n.Add(int64(len(evs)))
	return nil
}

func (s *nullSink) Close(context.Context) error { return nil }

// BenchmarkPipeline drives the informer handler with updates of 1,000
// ~1 KiB ConfigMaps under a rule with a label selector and a namespace
// (the rule filters, builds the event, and offers it to the sink's queue),
// and waits until the sink's worker has taken every event: the in-process
// cost per notification, after client-go handed the object over. Run it
// with -cpu 1 for one core.
func BenchmarkPipeline(b *testing.B) {
	for _, bc := range []struct {
		name string
		sink func(b *testing.B) (sinks.Sink, string) // and its config block
	}{
		{"null", func(*testing.B) (sinks.Sink, string) { return &nullSink{}, "file: {path: unused}" }},
		{"null-encoded", func(*testing.B) (sinks.Sink, string) { return &nullSink{encode: true}, "file: {path: unused}" }},
		{"file", func(b *testing.B) (sinks.Sink, string) {
			return nil, "file: {path: " + filepath.Join(b.TempDir(), "out.jsonl") + ", maxSizeMB: 100000}"
		}},
		{"nats", func(b *testing.B) (sinks.Sink, string) {
			return nil, "nats: {url: " + testenv.StartNATS(b).ClientURL() + "}"
		}},
		{"webhook-batch", func(b *testing.B) (sinks.Sink, string) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNoContent)
			}))
			b.Cleanup(srv.Close)
			return nil, "webhook: {url: " + srv.URL + ", batch: {maxEvents: 100}}"
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			sink, block := bc.sink(b)
			cfg, _, err := config.Parse("bench.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: bench
sinks:
  - name: out
    `+block+`
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [bench]
    labelSelector: app=bench
    sinks: [out]
`))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if sink == nil {
				f := map[string]sinks.Factory{"file": file.Factory, "nats": natssink.Factory, "webhook": webhook.Factory}[strings.SplitN(block, ":", 2)[0]]
				if sink, err = f.Create(ctx, sinks.Settings{Config: cfg.Sinks[0], Logger: slog.New(slog.DiscardHandler)}); err != nil {
					b.Fatal(err)
				}
			}
			r, err := filters.Compile(cfg, 0, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			d := sinks.NewDelivery(cfg.Sinks[0], sink, nil, slog.New(slog.DiscardHandler))
			var acked atomic.Int64
			d.OnAck = func(evs []*event.Event) { acked.Add(int64(len(evs))) }
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); d.Run(runCtx) }()
			in := &Informers{emit: func(ev *event.Event, _ []string) { d.Offer(ev) }, now: time.Now, logger: slog.New(slog.DiscardHandler)}
			h := (&running{Planned: Planned{Rules: []*filters.Rule{r}}}).handler(in, map[*filters.Rule][]string{r: {"out"}}, "")

			const objects = 1000
			revs := [2][]*unstructured.Unstructured{}
			for rev := range revs {
				for i := range objects {
					revs[rev] = append(revs[rev], benchObject(i, rev))
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				o := i % objects
				flip := (i / objects) % 2
				h.OnUpdate(revs[flip][o], revs[1-flip][o])
				if i%256 == 0 { // let the sink keep up: coalescing would skip its work
					for d.Pending() > 4096 {
						time.Sleep(10 * time.Microsecond)
					}
				}
			}
			for acked.Load() < int64(b.N) {
				if c := d.Stats().Queue.Coalesced; c > 0 {
					b.Fatalf("%d events coalesced", c)
				}
				time.Sleep(10 * time.Microsecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "notifications/s")
			cancel()
			<-done
			_ = sink.Close(ctx)
		})
	}
}

func benchObject(i, rev int) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"data": map[string]any{"payload": strings.Repeat(string(rune('a'+rev)), 1000)}}}
	u.SetNamespace("bench")
	u.SetName(fmt.Sprintf("cm-%04d", i))
	u.SetUID(types.UID(fmt.Sprintf("uid-%04d", i)))
	u.SetResourceVersion(fmt.Sprint(2*i + rev + 1))
	u.SetLabels(map[string]string{"app": "bench", "shard": fmt.Sprint(i % 16)})
	return u
}

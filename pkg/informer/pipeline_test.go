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
	"github.com/kubebridge/kubebridge/pkg/view"
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
// ~1 KiB ConfigMaps under a rule with a label selector and a namespace:
// the handler notifies the key, the receiver (as the bridge's: a view.Sink
// per sink) reads the cache's current state, diffs it with what the sink
// was handed, builds the event and offers it to the sink's queue; the
// benchmark waits until the sink's worker has taken every event. It is the
// in-process cost per notification, after client-go handed the object over
// (plus the cache write client-go makes before calling the handler, which
// is what Current reads). Run it with -cpu 1 for one core.
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
			views := map[string]*view.Sink{"out": view.NewSink("out", d.Offer)}
			views["out"].Start()

			// The receiver: the bridge's notify, checking that Current shows
			// the state the handler was notified of.
			var want *unstructured.Unstructured
			var notified, sent int
			notify := func(n Notification) {
				notified++
				if u, ok := n.Current(); !ok || u != want {
					b.Fatalf("%s: Current() = %v, %v; want the notified state", n.Key, u, ok)
				}
				t := view.Trigger{Gone: n.Gone, Now: time.Now()}
				for r, names := range n.Targets {
					s := 0
					for _, name := range names {
						if v := views[name]; v != nil {
							s += v.Sync(r, n.Key, n.Current, t)
						}
					}
					r.Count(s > 0)
					sent += s
				}
			}
			in, err := New(nil, []Planned{{Spec: Spec{GVR: r.GVR, Namespace: "bench", LabelSelector: "app=bench"}, Rules: []*filters.Rule{r}}},
				notify, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			run := in.running[0]
			store := run.informer.GetIndexer()
			h := run.handler(in, map[*filters.Rule][]string{r: {"out"}}, false)

			const objects = 1000
			revs := [2][]*unstructured.Unstructured{}
			for rev := range revs {
				for i := range objects {
					revs[rev] = append(revs[rev], benchObject(i, rev))
				}
			}
			for _, o := range revs[0] {
				if err := store.Add(o); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				o := i % objects
				flip := (i / objects) % 2
				want = revs[1-flip][o]
				if err := store.Update(want); err != nil {
					b.Fatal(err)
				}
				h.OnUpdate(revs[flip][o], want)
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
			if notified != b.N || sent != b.N {
				b.Fatalf("%d notifications, %d events to send; want %d of each", notified, sent, b.N)
			}
			if received, matched := r.Counts(); received != uint64(b.N) || matched != uint64(b.N) {
				b.Fatalf("rule counts %d received, %d matched; want %d", received, matched, b.N)
			}
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

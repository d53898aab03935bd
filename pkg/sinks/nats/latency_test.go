package nats

import (
	"context"
	"runtime/trace"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/internal/delivery/deliverytest"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// The paced benchmarks reproduce the latency run of hack/bench on the sink
// alone: one event every millisecond (1,000 changes/s) into NATS core, each
// timed from the moment it is handed over (Send, or Offer to the delivery
// loop) to its arrival at a subscriber on another connection. They report
// p50, p99 and max; take a trace with
//
//	go test -run '^$' -bench CorePaced -benchtime 3000x -trace /tmp/core.trace ./pkg/sinks/nats
//
// b.N is the number of events, so -benchtime 3000x is a 3 s run. The
// trace logs "sent" and "recv" with each event's index (user annotations in
// go tool trace), to line an event's journey up with GC and scheduling.

// pacedReceiver records when each event id arrives.
type pacedReceiver struct {
	index map[string]int // id -> position, read-only once built
	mu    sync.Mutex
	got   []time.Time
	n     int
	all   chan struct{}
}

func newPacedReceiver(b *testing.B, url string, evs []*event.Event) *pacedReceiver {
	r := &pacedReceiver{index: make(map[string]int, len(evs)), got: make([]time.Time, len(evs)), all: make(chan struct{})}
	for i, e := range evs {
		r.index[e.ID] = i
	}
	nc, err := natsgo.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	if _, err := nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
		now := time.Now()
		i, ok := r.index[m.Header.Get("ce-id")]
		if !ok {
			return
		}
		trace.Log(context.Background(), "recv", strconv.Itoa(i))
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.got[i].IsZero() {
			r.got[i] = now
			if r.n++; r.n == len(r.got) {
				close(r.all)
			}
		}
	}); err != nil {
		b.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	return r
}

// pacedEvents are n distinct updates of 1,000 objects, encoded on first use
// as in the bridge (by the first sink that sends them).
func pacedEvents(n int) []*event.Event {
	src := sinkstest.NewSource(700)
	evs := make([]*event.Event, n)
	for i := range evs {
		evs[i] = src.Next(i % 1000)
	}
	return evs
}

// pace hands evs over one per millisecond and returns when each was.
func pace(evs []*event.Event, hand func(*event.Event)) []time.Time {
	sent := make([]time.Time, len(evs))
	start := time.Now()
	for i, e := range evs {
		if d := time.Until(start.Add(time.Duration(i) * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
		sent[i] = time.Now()
		trace.Log(context.Background(), "sent", strconv.Itoa(i))
		hand(e)
	}
	return sent
}

func reportLatency(b *testing.B, r *pacedReceiver, sent []time.Time) {
	select {
	case <-r.all:
	case <-time.After(30 * time.Second):
		b.Fatalf("only %d of %d events arrived", r.n, len(sent))
	}
	r.mu.Lock()
	lat := make([]time.Duration, len(sent))
	for i := range sent {
		lat[i] = r.got[i].Sub(sent[i])
	}
	r.mu.Unlock()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCorePacedSend calls Send with each event alone, as the delivery
// loop does when events arrive one at a time; it also reports how long
// Send takes (the flush's round trip included).
func BenchmarkCorePacedSend(b *testing.B) {
	srv := testenv.StartNATS(b)
	s, err := Connect(context.Background(), "bench", sinkConfig(srv.ClientURL(), false), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	evs := pacedEvents(b.N)
	r := newPacedReceiver(b, srv.ClientURL(), evs)
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	sent := pace(evs, func(e *event.Event) {
		start := time.Now()
		if err := s.Send(context.Background(), []*event.Event{e}); err != nil {
			b.Error(err)
		}
		took = append(took, time.Since(start))
	})
	reportLatency(b, r, sent)
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "send-p99-ms")
}

// BenchmarkCorePacedDelivery goes through the delivery loop with a sink's
// default settings: Offer to subscriber.
func BenchmarkCorePacedDelivery(b *testing.B) {
	srv := testenv.StartNATS(b)
	s, err := Connect(context.Background(), "bench", sinkConfig(srv.ClientURL(), false), nil)
	if err != nil {
		b.Fatal(err)
	}
	cfg := config.Sink{Name: "bench"}
	cfg.SetDefaults()
	d := deliverytest.Start(b, cfg, s, nil)
	evs := pacedEvents(b.N)
	r := newPacedReceiver(b, srv.ClientURL(), evs)
	b.ResetTimer()
	sent := pace(evs, d.Offer)
	reportLatency(b, r, sent)
}

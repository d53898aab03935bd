package nats

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// Each benchmark publishes batches of 256 events of a ~1 KiB object to an
// embedded server (in the same process: it shares the 2 cores) and reports
// events/s. The Raw* baselines publish the same messages (subject, ce-*
// headers, body) prepared in advance, with nats.go directly, so the ratio is
// the sink's own cost: rendering subjects and headers, checks, acks.

const benchBatch = 256

func benchEvents(n int) []*event.Event {
	src := sinkstest.NewSource(700)
	out := make([]*event.Event, n)
	for i := range out {
		out[i] = src.Next(i % 1000)
	}
	return out
}

func report(b *testing.B, events int, start time.Time) {
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
}

func BenchmarkSinkCore(b *testing.B) {
	srv := testenv.StartNATS(b)
	s, err := Connect(context.Background(), "bench", sinkConfig(srv.ClientURL(), false), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	evs := benchEvents(benchBatch)
	b.ResetTimer()
	start, n := time.Now(), 0
	for b.Loop() {
		if err := s.Send(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
		n += len(evs)
	}
	report(b, n, start)
}

func BenchmarkRawCore(b *testing.B) {
	srv := testenv.StartNATS(b)
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	msgs := rawMessages(b, nc, benchEvents(benchBatch))
	b.ResetTimer()
	start, n := time.Now(), 0
	for b.Loop() {
		for _, m := range msgs {
			if err := nc.PublishMsg(m); err != nil {
				b.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		n += len(msgs)
	}
	report(b, n, start)
}

// BenchmarkSinkJetStream is the sink into a file stream, fenced at the
// stream (fence.go, the default) and not; "fence=restart" is a sink with
// no memory publishing objects the stream holds, as after a restart: each
// first publish is refused, and adopts the stream's sequence.
func BenchmarkSinkJetStream(b *testing.B) {
	for _, mode := range []string{"false", "true", "restart"} {
		b.Run("fence="+mode, func(b *testing.B) {
			srv := testenv.StartNATS(b)
			c := sinkConfig(srv.ClientURL(), true)
			c.Stream.Storage = "file"
			c.Fence = mode != "false"
			s, err := Connect(context.Background(), "bench", c, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			evs := benchEvents(benchBatch)
			if mode == "restart" {
				if err := s.Send(context.Background(), evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start, n := time.Now(), 0
			for i := 0; b.Loop(); i++ {
				if mode == "restart" {
					s.fence = newLastSeqs() // forgets every object, as a new process
				}
				if err := s.Send(context.Background(), evs); err != nil { // the same ids: deduped after the first
					b.Fatal(err)
				}
				n += len(evs)
			}
			report(b, n, start)
		})
	}
}

// BenchmarkSinkJetStreamStored publishes a new change of each of 256
// objects per batch (every event is stored, none a duplicate), fenced and
// not: the stream checks each fenced publish against the object's last
// message. Only Send is timed.
func BenchmarkSinkJetStreamStored(b *testing.B) {
	for _, fence := range []bool{false, true} {
		b.Run(fmt.Sprintf("fence=%v", fence), func(b *testing.B) {
			srv := testenv.StartNATS(b)
			c := sinkConfig(srv.ClientURL(), true)
			c.Stream.Storage = "file"
			c.Fence = fence
			s, err := Connect(context.Background(), "bench", c, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			src := sinkstest.NewSource(700)
			evs := make([]*event.Event, benchBatch)
			var sending time.Duration
			n := 0
			for b.Loop() {
				b.StopTimer()
				for i := range evs {
					evs[i] = src.Next(i)
				}
				b.StartTimer()
				start := time.Now()
				if err := s.Send(context.Background(), evs); err != nil {
					b.Fatal(err)
				}
				sending += time.Since(start)
				n += len(evs)
			}
			b.ReportMetric(float64(n)/sending.Seconds(), "events/s")
		})
	}
}

func BenchmarkRawJetStream(b *testing.B) {
	srv := testenv.StartNATS(b)
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	evs := benchEvents(benchBatch)
	msgs := rawMessages(b, nc, evs)
	b.ResetTimer()
	start, n := time.Now(), 0
	for b.Loop() {
		futures := make([]jetstream.PubAckFuture, len(msgs))
		for i, m := range msgs {
			if futures[i], err = js.PublishMsgAsync(m, jetstream.WithMsgID(evs[i].ID)); err != nil {
				b.Fatal(err)
			}
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
		n += len(msgs)
	}
	report(b, n, start)
}

// rawMessages prepares the messages the sink would send, once.
func rawMessages(b *testing.B, nc *natsgo.Conn, evs []*event.Event) []*natsgo.Msg {
	s := &Sink{}
	s.subject, _ = parseTemplate("k8s.{cluster}.{group}.{resource}.{namespace}.{name}.{type}")
	out := make([]*natsgo.Msg, len(evs))
	for i, e := range evs {
		out[i] = natsgo.NewMsg("")
		if _, err := s.fill(out[i], e, nil, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// BenchmarkSinkJetStreamWindow sends from 4 goroutines at once (as the
// delivery loop's concurrent batches do), each its own objects' batches
// of 256, through windows of several sizes: what the default of 256 gives
// up against a deeper window, and what a shallow one costs. The stream's
// duplicate window is short (100 ms) and each sender cycles through 16
// batches, so the events are stored each time, not dropped as repeats.
func BenchmarkSinkJetStreamWindow(b *testing.B) {
	for _, window := range []int{16, 64, 256, 1024} {
		b.Run("maxPending="+strconv.Itoa(window), func(b *testing.B) {
			srv := testenv.StartNATS(b)
			c := sinkConfig(srv.ClientURL(), true)
			c.MaxPending = window
			c.Stream.Storage = "memory"
			c.Stream.DuplicateWindow = config.Duration(100 * time.Millisecond)
			s, err := Connect(context.Background(), "bench", c, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			const senders, cycle = 4, 16
			src := sinkstest.NewSource(700)
			batches := make([][][]*event.Event, senders)
			for w := range batches {
				batches[w] = make([][]*event.Event, cycle)
				for k := range cycle {
					for i := range benchBatch {
						batches[w][k] = append(batches[w][k], src.Next(w*benchBatch+i))
					}
				}
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			var n atomic.Int64
			for w := range senders {
				wg.Go(func() {
					for k := 0; n.Add(benchBatch) <= int64(b.N)*benchBatch; k++ {
						if err := s.Send(context.Background(), batches[w][k%cycle]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			report(b, b.N*benchBatch, start)
		})
	}
}

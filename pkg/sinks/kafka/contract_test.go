package kafka

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// The shared sink contract, through the bridge's own delivery loop,
// against kfake: delivery in order, an outage (every request refused), a
// restart of the broker on its data directory, a dead broker under load
// with bounded memory, a bad event alone.
func TestContract(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the contract takes a while")
	}
	sinkstest.Run(t, sinkstest.Harness{
		Config:   config.Sink{Name: "kafka", Type: "kafka"},
		Outages:  true,
		PerEvent: true,
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			b := startBroker(t)
			c := &Config{}
			c.SetDefaults()
			c.Brokers = b.addrs()
			c.CreateTopics = true
			c.Timeout = config.Duration(time.Second)
			cfg.Spec = c
			s, err := Factory.Create(context.Background(), sinks.SettingsFor(cfg, nil))
			if err != nil {
				t.Fatal(err)
			}
			return s, newRemote(t, b, "k8s.test.contract")
		},
	})
}

// remote is the change topic as a consumer reads it, from its start.
type remote struct {
	b     *broker
	topic string
	cl    *kgo.Client
	mu    sync.Mutex
	got   []sinkstest.Received
	next  map[int32]int64 // per partition, the offset after the last record read
}

func newRemote(t testing.TB, b *broker, topic string) *remote {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &remote{b: b, topic: topic, cl: cl, next: map[int32]int64{}}
}

func (r *remote) Received(testing.TB) []sinkstest.Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		fs := r.cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(rec *kgo.Record) {
			// A consumer whose fetches fail during an outage may reset
			// and read records again: the topic holds each once.
			if rec.Offset < r.next[rec.Partition] {
				return
			}
			r.next[rec.Partition] = rec.Offset + 1
			id, _ := header(rec, "ce_id")
			subject, _ := header(rec, "ce_subject")
			r.got = append(r.got, sinkstest.Received{ID: id, Subject: subject})
			n++
		})
		if n == 0 {
			break
		}
	}
	return append([]sinkstest.Received(nil), r.got...)
}

func (r *remote) Down(testing.TB)      { r.b.down.Store(true) }
func (r *remote) Up(testing.TB)        { r.b.down.Store(false) }
func (r *remote) Restart(t testing.TB) { r.b.Restart(t) }
func (r *remote) Refuse(t testing.TB)  { t.Fatal("kfake refuses nothing for good") }

package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Every goroutine has an owner that waits for it: after the package's
// tests none of theirs, nor of the franz-go clients they drive, runs.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// broker is an in-process kfake cluster on a loopback port: the broker
// the tests produce to and read back from. Down makes every request fail
// (the connection is closed) until Up; Restart closes it and starts it
// again on the same port and data directory.
type broker struct {
	*kfake.Cluster
	opts []kfake.Opt
	down atomic.Bool
}

func startBroker(t testing.TB, opts ...kfake.Opt) *broker {
	t.Helper()
	port := freePort(t)
	b := &broker{opts: append([]kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.DefaultNumPartitions(4),
		kfake.DataDir(t.TempDir()), kfake.SyncWrites()}, opts...)}
	b.start(t)
	t.Cleanup(func() { b.Close() })
	return b
}

func (b *broker) start(t testing.TB) {
	t.Helper()
	var c *kfake.Cluster
	var err error
	for range 50 { // the port may linger a moment after a Close
		if c, err = kfake.NewCluster(b.opts...); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl() // this cluster's: Restart replaces b.Cluster
		if b.down.Load() {
			return nil, errors.New("down"), true
		}
		return nil, nil, false
	})
	b.Cluster = c
}

func (b *broker) Restart(t testing.TB) {
	b.Close()
	b.start(t)
}

func (b *broker) addrs() []string { return b.ListenAddrs() }

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newSink builds a sink as the bridge does (Factory.Create) from c, with
// the brokers of b.
func newSink(t testing.TB, b *broker, edit func(c *Config)) sinks.Sink {
	t.Helper()
	c := &Config{}
	c.SetDefaults()
	c.Brokers = b.addrs()
	c.CreateTopics = true
	c.Timeout = config.Duration(2 * time.Second)
	if edit != nil {
		edit(c)
	}
	s, err := Factory.Create(context.Background(), sinks.SettingsFor(config.Sink{Name: "kafka", Type: "kafka", Spec: c}, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// readTopic reads every record of topic from its start to its end.
func readTopic(t testing.TB, addrs []string, topic string, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("listing offsets of %s: %v", topic, err)
	}
	from := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			from[o.Partition] = kgo.NewOffset().AtStart()
			left[o.Partition] = o.Offset
		}
	})
	if len(from) == 0 {
		return nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: from})
	var out []*kgo.Record
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v (partitions left %v)", topic, ctx.Err(), left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset < end {
				out = append(out, r)
				if r.Offset+1 >= end {
					delete(left, r.Partition)
				}
			}
		})
	}
	return out
}

var testRule = &event.Rule{Name: "cms", Cluster: "test", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}

// object is a ConfigMap ns/name with uid and resourceVersion rv.
func object(ns, name, uid string, rv int, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"v": strconv.Itoa(rv)}}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion(strconv.Itoa(rv))
	if labels != nil {
		u.SetLabels(labels)
	}
	return u
}

func ev(change event.Change, ns, name, uid string, rv int) *event.Event {
	return event.New(testRule, change, object(ns, name, uid, rv, map[string]string{"app": name}), nil, time.Now())
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func mustSend(t testing.TB, s sinks.Sink, events ...*event.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Send(ctx, events); err != nil {
		t.Fatalf("Send: %v", err)
	}
}

func describe(rs []*kgo.Record) string {
	s := ""
	for _, r := range rs {
		id, _ := header(r, "ce_id")
		s += fmt.Sprintf("\n  %s[%d]@%d key=%s id=%s", r.Topic, r.Partition, r.Offset, r.Key, id)
	}
	return s
}

// kfakeSeed creates topics at start, with one partition each.
func kfakeSeed(topics ...string) kfake.Opt { return kfake.SeedTopics(1, topics...) }

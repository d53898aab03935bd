package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A rule of ConfigMaps delivered to a kafka sink with a state topic,
// under churn, while the broker (kfake in a process of its own, synced to
// disk) is restarted twice and the bridge is SIGKILLed once. In the end
// the state topic (the last record per uid, tombstones removed) holds
// exactly the rule's view as the apiserver has it, and the change topic
// holds every object's changes in order per uid, ending with its current
// state (or its deletion). Last, the bridge is stopped, its checkpoint
// deleted and the state topic written behind its back (an object in no
// view, a tombstone for one in the view): started again, it reads what
// the topic holds and makes it the view again.
//
// Here the broker stops cleanly (SIGTERM): kfake then keeps each
// producer's sequence numbers, as Kafka does through any restart (it
// rebuilds them from the log). TestKafkaBrokerSIGKILL kills it.
func TestKafkaStateTopicConvergesThroughFaults(t *testing.T) {
	t.Parallel()
	kafkaFaults(t, false)
}

// As TestKafkaStateTopicConvergesThroughFaults, with the broker SIGKILLed
// the first time. kfake persists each producer's sequence numbers only at
// a clean stop (Kafka rebuilds them from the log), so after a SIGKILL it
// takes any first sequence from the idempotent producer (KIP-360) and two
// batches that were in flight may land in either order: the state topic
// must still converge and nothing be lost, while an inversion of a uid's
// changes is reported, not failed (docs/kafka.md, "What was tested").
//
// Not parallel: in one of four parallel runs of the package on a loaded
// machine, three objects' last changes were missing from the change topic
// (2026-11-27, main at 67ddfe3); run twice more beside
// TestKafkaStateTopicConvergesThroughFaults, it lost nothing. Until that
// is understood it runs alone.
func TestKafkaBrokerSIGKILL(t *testing.T) {
	kafkaFaults(t, true)
}

func kafkaFaults(t *testing.T, sigkill bool) {
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"kafka-a", "kafka-b"}
	if sigkill {
		namespaces = []string{"kafka-kill-a", "kafka-kill-b"}
	}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	k := testenv.StartKafka(t)
	brokers := strings.Join(k.Brokers(), ",")
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: bus
    kafka:
      brokers: [` + brokers + `]
      topic: "kb.{cluster}.{rule}"
      stateTopic: "kb.e2e.state.{rule}"
      createTopics: true
      timeout: 2s
    retry: {initialInterval: 50ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + strings.Join(namespaces, ", ") + `]
    sinks: [bus]
`
	l := startLoad(t, cp, namespaces, false)
	checkpoint := filepath.Join(t.TempDir(), "state.db")
	b := startBridge(t, cp, cfg, withRestartFlags(), withCheckpointFile(checkpoint))
	pause := func() { time.Sleep(time.Duration(600+rand.IntN(600)) * time.Millisecond) }

	pause()
	if sigkill {
		k.Kill() // mid-stream: what it acknowledged is on disk
	} else {
		k.Stop()
	}
	pause()
	k.Start(t)
	pause()
	b.kill() // the bridge, once, on its checkpoint
	time.Sleep(300 * time.Millisecond)
	b.start()
	pause()
	k.Restart(t) // a clean stop and start
	pause()
	l.stop()

	// The view as the apiserver has it: uid -> ns/name@resourceVersion.
	cs := cp.Clientset(t)
	truth := map[string]string{}
	var live []string
	for _, ns := range namespaces {
		list, err := cs.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			truth[string(cm.UID)] = ns + "/" + cm.Name + "@" + cm.ResourceVersion
			live = append(live, string(cm.UID))
		}
	}

	// The checkpoint lost, and the state topic written behind the
	// bridge's back: an object that is in no view, and a tombstone for one
	// that is. The bridge starts from what the topic holds (sinks.Holder).
	b.stop()
	must(t, os.Remove(checkpoint))
	ghost := `{"specversion":"1.0","id":"uid-ghost.0.1.added","source":"kubebridge/e2e","type":"io.kubebridge.configmaps.core.added","subject":"` +
		namespaces[0] + `/ghost","data":{"object":{"metadata":{"namespace":"` + namespaces[0] + `","name":"ghost","uid":"uid-ghost","resourceVersion":"1"}}}}`
	produceRaw(t, k.Brokers(), "kb.e2e.state.cms", &kgo.Record{Key: []byte("uid-ghost"), Value: []byte(ghost)}, &kgo.Record{Key: []byte(live[0])})
	b.start()

	var state map[string]string
	var stateRecords int
	converged := poll(90*time.Second, func() bool {
		recs := readKafkaTopic(t, k.Brokers(), "kb.e2e.state.cms")
		stateRecords = len(recs)
		state = heldState(t, recs)
		return fmt.Sprint(state) == fmt.Sprint(truth)
	})
	if !converged {
		t.Errorf("the state topic (%d records) does not hold the view:\n%s\nbroker log:\n%s\nbridge log:\n%s", stateRecords, diffViews(state, truth), k.Log(), b.runLogTail())
	}

	changes := readKafkaTopic(t, k.Brokers(), "kb.e2e.cms")
	checkChangeOrder(t, changes, !sigkill)
	fault := "kafka restart, bridge SIGKILL, kafka restart"
	if sigkill {
		fault = "kafka SIGKILL, bridge SIGKILL, kafka restart"
	}
	verifyAgainstTruth(t, cp, namespaces, l, fault, func() []ce {
		return changeEvents(readKafkaTopic(t, k.Brokers(), "kb.e2e.cms"))
	})
	t.Logf("state topic: %d records for %d objects; change topic: %d records", stateRecords, len(truth), len(changes))
}

// produceRaw writes records to topic as another client of the topic would.
func produceRaw(t *testing.T, brokers []string, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	must(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

// heldState reads a state topic as a consumer does: the last record per
// key (uid), tombstones removing it; each as ns/name@resourceVersion.
func heldState(t *testing.T, recs []*kgo.Record) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range recs {
		uid := string(r.Key)
		if r.Value == nil {
			delete(out, uid)
			continue
		}
		var e struct {
			Data struct {
				Object struct {
					Metadata struct{ Namespace, Name, UID, ResourceVersion string }
				}
			}
		}
		if err := json.Unmarshal(r.Value, &e); err != nil {
			t.Fatalf("state record %s@%d: %v: %q", r.Topic, r.Offset, err, r.Value)
		}
		md := e.Data.Object.Metadata
		if md.UID != uid {
			t.Fatalf("state record %s@%d: key %s holds object %s", r.Topic, r.Offset, uid, md.UID)
		}
		out[uid] = md.Namespace + "/" + md.Name + "@" + md.ResourceVersion
	}
	return out
}

func diffViews(got, want map[string]string) string {
	var lines []string
	for uid, w := range want {
		if g := got[uid]; g != w {
			lines = append(lines, fmt.Sprintf("  %s: holds %q, view %q", uid, g, w))
		}
	}
	for uid, g := range got {
		if _, ok := want[uid]; !ok {
			lines = append(lines, fmt.Sprintf("  %s: holds %q, not in the view", uid, g))
		}
	}
	sort.Strings(lines)
	if len(lines) > 30 {
		lines = append(lines[:30], fmt.Sprintf("  ... %d more", len(lines)-30))
	}
	return strings.Join(lines, "\n")
}

// checkChangeOrder checks the change topic per uid: every record on one
// partition, content-type application/json, and resourceVersions that
// never go back among first deliveries (a batch re-sent after a lost
// acknowledgement repeats ids, and a bridge restarted after a SIGKILL
// sends again, with the checkpoint's resourceVersion, a deletion its
// predecessor had sent but not yet recorded); without strict, an
// inversion is logged.
func checkChangeOrder(t *testing.T, recs []*kgo.Record, strict bool) {
	t.Helper()
	last := map[string]int{}
	part := map[string]int32{}
	seen := map[string]bool{}
	dups, inversions := 0, 0
	deleted := map[string]bool{} // the uid's last first delivery was its deletion
	for _, r := range recs {
		uid := string(r.Key)
		if p, ok := part[uid]; ok && p != r.Partition {
			t.Errorf("uid %s on partitions %d and %d", uid, p, r.Partition)
		}
		part[uid] = r.Partition
		if ct := kafkaHeader(r, "content-type"); ct != "application/json" {
			t.Errorf("record %d@%d: content-type %q", r.Partition, r.Offset, ct)
		}
		id := kafkaHeader(r, "ce_id")
		del := strings.HasSuffix(id, ".deleted")
		if seen[id] || del && deleted[uid] {
			dups++
			continue
		}
		seen[id] = true
		deleted[uid] = del
		parts := strings.Split(id, ".")
		if len(parts) != 4 || parts[0] != uid {
			t.Errorf("record %d@%d: id %q is not <uid>.<tag>.<rv>.<type> of key %s", r.Partition, r.Offset, id, uid)
			continue
		}
		if parts[2] == "" && del && kafkaHeader(r, "ce_kbreplay") == "checkpoint" {
			// A deletion found at a start of an object whose last send was
			// never acknowledged: the checkpoint knows it from its intent,
			// which keeps no resourceVersion (docs/consumers.md: do not
			// compare resourceVersions). Not an inversion.
			continue
		}
		rv, _ := strconv.Atoi(parts[2])
		if rv < last[uid] {
			var hist []string
			for _, h := range recs {
				if string(h.Key) == uid {
					hist = append(hist, fmt.Sprintf("%d@%d %s replay=%s t=%s", h.Partition, h.Offset, kafkaHeader(h, "ce_id"), kafkaHeader(h, "ce_kbreplay"), h.Timestamp.Format("15:04:05.000")))
				}
			}
			inversions++
			report := t.Errorf
			if !strict {
				report = t.Logf
			}
			report("uid %s: resourceVersion %d after %d; its records:\n  %s", uid, rv, last[uid], strings.Join(hist, "\n  "))
		}
		last[uid] = max(last[uid], rv)
	}
	t.Logf("change topic: %d records, %d uids, %d duplicates, %d inversions", len(recs), len(last), dups, inversions)
}

// changeEvents are the change topic's records as CloudEvents (binary
// mode: the attributes are ce_ headers).
func changeEvents(recs []*kgo.Record) []ce {
	out := make([]ce, 0, len(recs))
	for _, r := range recs {
		out = append(out, ce{SpecVersion: kafkaHeader(r, "ce_specversion"), ID: kafkaHeader(r, "ce_id"), Source: kafkaHeader(r, "ce_source"),
			Type: kafkaHeader(r, "ce_type"), Subject: kafkaHeader(r, "ce_subject"), Time: kafkaHeader(r, "ce_time"),
			Rule: kafkaHeader(r, "ce_kbrule"), Cluster: kafkaHeader(r, "ce_kbcluster"), Replay: kafkaHeader(r, "ce_kbreplay"),
			Reason: kafkaHeader(r, "ce_kbreason"), raw: r.Value})
	}
	return out
}

func kafkaHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// readKafkaTopic reads every record of topic, from its start to the end
// offsets it has now, in order per partition (none if it does not exist).
func readKafkaTopic(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	must(t, err)
	defer cl.Close()
	var ends kadm.ListedOffsets
	ok := poll(20*time.Second, func() bool {
		ends, err = kadm.NewClient(cl).ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		return err == nil
	})
	if !ok {
		t.Logf("listing the end offsets of %s: %v", topic, err)
		return nil
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
	// In order per partition (EachRecord is), partitions one after another.
	sort.SliceStable(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out
}

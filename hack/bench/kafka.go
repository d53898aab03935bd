package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The kafka consumers: the bridge delivering to the kafka sink on a kfake
// broker that runs in the bench's process, as the nats-server does, for
// the same reason: the bridge's process is measured alone (its CPU and
// RSS), and the broker shares the bench's cores and GC with the load
// generator and the receiver in both cases. kfake stores under the work
// directory without an fsync per batch (Kafka's default, and JetStream's:
// it syncs every 2 minutes), so neither broker waits for the disk. (The
// e2e tests' kfakecmd syncs every batch: right for crash tests, a disk
// benchmark here.) Each measurement gets topics of its own (4 partitions,
// kfakecmd's default; the state topic compacted), created before the
// bridge starts and deleted after.

// kafkaPartitions is the partition count of the bench's topics.
const kafkaPartitions = 4

// isKafka says whether consumer delivers to the kafka sink.
func isKafka(consumer string) bool { return consumer == "kafka" || consumer == "kafka-state" }

// kafkaTopics are one measurement's change topic and, for kafka-state,
// the state topic's template and name (the rule is "bench"), named after
// key (the measurement's namespace, or a cold run's name).
func kafkaTopics(consumer, key string) (change, stateTemplate, state string) {
	change = "bench." + key
	if consumer == "kafka-state" {
		stateTemplate = "bench-state." + key + ".{rule}"
		state = strings.ReplaceAll(stateTemplate, "{rule}", "bench")
	}
	return change, stateTemplate, state
}

// kafkaBroker is the bench's in-process kfake cluster (one broker).
type kafkaBroker struct {
	cluster *kfake.Cluster
	admin   *kadm.Client
	client  *kgo.Client
}

// startKafka starts a one-broker kfake cluster storing in dir.
func startKafka(dir string) (*kafkaBroker, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(filepath.Join(dir, "kafka")), kfake.DefaultNumPartitions(kafkaPartitions))
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &kafkaBroker{cluster: c, admin: kadm.NewClient(cl), client: cl}, nil
}

// kafkaBroker is the bench's broker, started on first use (and closed
// when run returns).
func (b *bed) kafkaBroker() (*kafkaBroker, error) {
	if b.kafka == nil {
		k, err := startKafka(b.dir)
		if err != nil {
			return nil, fmt.Errorf("kfake: %w", err)
		}
		b.kafka = k
	}
	return b.kafka, nil
}

func (k *kafkaBroker) brokers() []string { return k.cluster.ListenAddrs() }

func (k *kafkaBroker) close() {
	k.client.Close()
	k.cluster.Close()
}

// createTopics creates a measurement's topics: the change topic, and the
// state topic compacted.
func (k *kafkaBroker) createTopics(ctx context.Context, change, state string) error {
	if _, err := k.admin.CreateTopic(ctx, kafkaPartitions, 1, nil, change); err != nil {
		return fmt.Errorf("creating %s: %w", change, err)
	}
	if state != "" {
		policy := "compact"
		if _, err := k.admin.CreateTopic(ctx, kafkaPartitions, 1, map[string]*string{"cleanup.policy": &policy}, state); err != nil {
			return fmt.Errorf("creating %s: %w", state, err)
		}
	}
	return nil
}

// deleteTopics deletes a measurement's topics (keeping the broker small).
func (k *kafkaBroker) deleteTopics(ctx context.Context, topics ...string) {
	var ts []string
	for _, t := range topics {
		if t != "" {
			ts = append(ts, t)
		}
	}
	_, _ = k.admin.DeleteTopics(ctx, ts...)
}

// kafkaSink is the bridge's kafka sink block for one measurement.
func kafkaSink(brokers []string, topic, stateTemplate string) string {
	s := "kafka: {brokers: [" + strings.Join(brokers, ", ") + "], topic: " + topic
	if stateTemplate != "" {
		s += `, stateTopic: "` + stateTemplate + `"`
	}
	return s + "}"
}

// kafkaReceiver consumes topic from its start with a franz-go consumer
// (no group) and records every record's ce_id and ce_time. An object's
// records are on one partition (keyed by uid) and a partition's records
// come in order, so the collector's per-uid order check holds as it does
// for NATS.
func kafkaReceiver(brokers []string, topic string, c *collector) (func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var id, at string
				for _, h := range r.Headers {
					switch h.Key {
					case "ce_id":
						id = string(h.Value)
					case "ce_time":
						at = string(h.Value)
					}
				}
				t, _ := time.Parse(time.RFC3339Nano, at)
				c.record(id, t, now)
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }, nil
}

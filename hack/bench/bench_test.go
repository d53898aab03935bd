package main

import (
	"log"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// The bench re-executes its own binary as the baseline watcher; in tests
// that binary is the test's.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "watch" {
		if err := watchMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == "mirrorwatch" {
		if err := mirrorWatchMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A small bench runs end to end: every consumer receives every change, the
// report has a row for each, the memory runs see the objects cached, a
// cold start delivers every object and its warm restart none, the slow
// sinks get everything in order, and after an outage the webhook's
// consumer holds exactly the cluster's objects.
func TestBenchSmoke(t *testing.T) {
	t.Parallel() // beside TestShardsSmoke: each run has its own control plane, NATS and directory
	if _, err := testenv.ToolsDir(); err != nil {
		testenv.SkipOrFail(t, err)
	}
	o := options{n: 100, runs: 1, workers: 8, consumers: "baseline,baseline-cbor,nats,jetstream,webhook,file,kafka,kafka-state", latencyRate: 300, latencyN: 50, memory: "300",
		cold: "200", coldConsumers: "baseline,nats,jetstream,kafka-state", slow: "5ms,2ms>20ms,nats", slowRate: 1000, slowN: 50, slowMax: time.Minute, slowSample: 100 * time.Millisecond,
		outage: 6 * time.Second, outageRate: 30, outageLive: 100, outageSample: 2 * time.Second, mirror: "200", mirrorConsumers: "1,2", mirrorShared: true,
		owners: 100, ownersUpdates: 50}
	res, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	// owners: both rules delivered every Pod and update (the run waits for
	// them), every chain complete.
	if len(res.Owners) != len(ownersConsumers) {
		t.Errorf("%d owners measurements, want %d", len(res.Owners), len(ownersConsumers))
	}
	for _, r := range res.Owners {
		if r.ColdCPU <= 0 || r.HeapBytes <= 0 || r.UpdateSeconds <= 0 || r.Incomplete != 0 {
			t.Errorf("owners: %v", r)
		}
	}
	all, mem := res.Runs, res.Memory
	for _, r := range all {
		if r.Events != r.Changes || r.Seconds <= 0 || r.CPU <= 0 || r.MaxRSS <= 0 || r.OutOfOrder != 0 {
			t.Errorf("%s (rate %d): %d of %d events in %.2fs, cpu %.2fs, maxrss %d, %d out of order", r.Consumer, r.Rate, r.Events, r.Changes, r.Seconds, r.CPU, r.MaxRSS, r.OutOfOrder)
		}
		if !isBaseline(r.Consumer) && (len(r.Latency) != r.Events || r.P50 <= 0 || r.Max < r.P99) {
			t.Errorf("%s: latency p50 %v p99 %v max %v over %d samples", r.Consumer, r.P50, r.P99, r.Max, len(r.Latency))
		}
	}
	if want := 8 + 6; len(all) != want {
		t.Errorf("%d measurements, want %d", len(all), want)
	}
	if want := 2 * len(memConsumers); len(mem) != want {
		t.Errorf("%d memory measurements, want %d", len(mem), want)
	}
	for _, m := range mem {
		if m.HeapBytes <= 0 || m.RSSBytes <= 0 {
			t.Errorf("memory %s at %d: heap %d, rss %d", m.Consumer, m.Objects, m.HeapBytes, m.RSSBytes)
		}
	}

	// baseline cold, then each sink cold and warm.
	if len(res.Cold) != 7 {
		t.Errorf("%d cold measurements, want 7: %v", len(res.Cold), res.Cold)
	}
	for _, r := range res.Cold {
		want := 200
		if r.Phase == "restart" {
			want = 0 // nothing changed
		}
		if r.Events != want || r.Duplicates != 0 || r.Seconds <= 0 || r.CPU <= 0 || r.PeakRSS <= 0 {
			t.Errorf("%s %s: %d events (want %d), %d duplicates, %.2fs, cpu %.2fs, peak rss %d", r.Phase, r.Consumer, r.Events, want, r.Duplicates, r.Seconds, r.CPU, r.PeakRSS)
		}
	}

	if len(res.Slow) != 3 {
		t.Errorf("%d slow measurements, want 3", len(res.Slow))
	}
	for _, r := range res.Slow {
		if !r.Complete || r.Events != r.Changes || r.OutOfOrder != 0 || len(r.Series) == 0 {
			t.Errorf("slow %s: %d of %d events, complete %v, %d out of order, %d samples", r.Name, r.Events, r.Changes, r.Complete, r.OutOfOrder, len(r.Series))
		}
		if r.Sink == "webhook" && (r.MaxInFlight < 1 || r.Requests < int64(r.Changes)) {
			t.Errorf("slow %s: max in flight %d, %d requests for %d events one per request", r.Name, r.MaxInFlight, r.Requests, r.Changes)
		}
		if r.Delay2 > 0 && r.Series[len(r.Series)-1].DelayMs != 20 {
			t.Errorf("slow %s: the receiver never slowed down: %+v", r.Name, r.Series[len(r.Series)-1])
		}
	}

	if len(res.Outage) != 1 {
		t.Fatalf("%d outage measurements, want 1", len(res.Outage))
	}
	out := res.Outage[0]
	last := out.Samples[len(out.Samples)-1]
	if !out.ok() || len(out.Samples) < 3 || last.Churned < 60 || last.HeapLive <= 0 || last.RSS <= 0 {
		t.Errorf("outage: %v, %d samples, last %+v", out, len(out.Samples), last)
	}

	// The mirror: the bucket filled, both consumers listed every object,
	// and the memory runs saw them cached.
	if mr := res.Mirror; mr == nil || len(mr.Fill) != 1 || len(mr.Starts) != 2 || len(mr.Memory) != 5 {
		t.Errorf("mirror measurements: %+v", mr)
	} else {
		if f := mr.Fill[0]; f.Keys != 200 || f.Seconds <= 0 {
			t.Errorf("mirror fill: %s", f)
		}
		for _, r := range mr.Starts {
			if r.Events != 200 || r.Seconds <= 0 || r.CPU <= 0 || r.PeakRSS <= 0 {
				t.Errorf("mirror: %s", r)
			}
		}
		for _, m := range mr.Memory {
			if m.HeapBytes <= 0 || m.RSSBytes <= 0 {
				t.Errorf("mirror: %s", m)
			}
		}
	}

	rep := report(o, res)
	for _, c := range append(strings.Split(o.consumers, ","), memConsumers...) {
		if !strings.Contains(rep, "| "+c+" |") {
			t.Errorf("report has no row for %s:\n%s", c, rep)
		}
	}
	for _, s := range []string{"### Cold start: 200", "### Warm restart: 200", "| 2ms>20ms |", "#### 2ms>20ms, run 1", "#### Memory during the outage", "machine: ",
		"### The view from the bus: 200 ConfigMaps", "| mirror | 2 |", "| mirror, one NATS connection | 2 |", "| baseline, managedFields stripped | 1 |", "Against jetstream"} {
		if !strings.Contains(rep, s) {
			t.Errorf("report has no %q:\n%s", s, rep)
		}
	}
	t.Log(rep)
}

// A small sharded phase runs end to end: every replica count delivers
// every object on both apiservers, the replicas end in fair shares (the
// apiserver filtering only where its gate is on), the churn is delivered
// in full, and after the handovers the consumer holds the cluster's
// objects.
func TestShardsSmoke(t *testing.T) {
	t.Parallel()
	if _, err := testenv.ToolsDir(); err != nil {
		testenv.SkipOrFail(t, err)
	}
	o := options{runs: 1, workers: 8, shards: 300, shardReplicas: "1,2", shardGates: "on,off", shardChurnN: 100,
		shardHandovers: 1, shardHandoverRate: 30}
	res, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	sr := res.Shards
	if len(sr.Cold) != 4 || len(sr.Baseline) != 2 || len(sr.Churn) != 2 || len(sr.Handover) != 1 || sr.Final == nil {
		t.Fatalf("%d cold, %d baseline, %d churn, %d handover measurements, final %v", len(sr.Cold), len(sr.Baseline), len(sr.Churn), len(sr.Handover), sr.Final)
	}
	for _, r := range sr.Cold {
		held := make([]int, len(r.Members))
		for i, m := range r.Members {
			held[i] = m.Shards
			if m.CPU <= 0 || m.PeakRSS <= 0 || m.Filtered != (r.Gate == "on") {
				t.Errorf("%s: %s: cpu %.2f, peak rss %d, apiserver filtered %v", r, m.Identity, m.CPU, m.PeakRSS, m.Filtered)
			}
		}
		if r.Types["added"] < r.Objects || r.Seconds <= 0 || !fairShares(held) {
			t.Errorf("%s: held %v", r, held)
		}
	}
	for _, r := range sr.Churn {
		if r.Events != r.Changes || r.OutOfOrder != 0 || r.cpu() <= 0 {
			t.Errorf("%s", r)
		}
	}
	h, f := sr.Handover[0], sr.Final
	if h.DeliverSeconds <= 0 || h.OwnedSeconds <= 0 || h.JoinSeconds <= 0 || len(h.Shards) != benchShards/2 {
		t.Errorf("%s", h)
	}
	if f.Missing+f.Extra+f.Stale+f.OutOfOrder != 0 {
		t.Errorf("after the handovers: %+v", *f)
	}
	rep := report(o, res)
	for _, s := range []string{"### Sharding: cold start on 300", "| on | 2 |", "| off | bare informer |", "### Sharding: live churn", "| **median** |"} {
		if !strings.Contains(rep, s) {
			t.Errorf("report has no %q:\n%s", s, rep)
		}
	}
	t.Log(rep)
}

// The bridge configs of the kafka consumers and of the mirror phase pass
// the bridge's own validation, and name the measurement's topics.
func TestBenchConfigsValidate(t *testing.T) {
	b := &bed{natsURL: "nats://127.0.0.1:4222", kafka: &kafkaBroker{}}
	brokers := []string{"127.0.0.1:9092"}
	for _, c := range []string{"kafka", "kafka-state"} {
		change, tmpl, state := kafkaTopics(c, "bench-"+c+"-0-1")
		cfg := ruleConfig(kafkaSink(brokers, change, tmpl), "bench-"+c+"-0-1")
		if _, _, err := config.Parse(c, []byte(cfg), components.SinkRegistry()); err != nil {
			t.Errorf("%s: %v\n%s", c, err, cfg)
		}
		if change != "bench.bench-"+c+"-0-1" || (c == "kafka-state") != (state == "bench-state.bench-"+c+"-0-1.bench") {
			t.Errorf("%s: topics %q, %q", c, change, state)
		}
	}
	cfg := ruleConfig("nats: {url: "+b.natsURL+", mirror: {}}", mirrorNamespace)
	if _, _, err := config.Parse("mirror", []byte(cfg), components.SinkRegistry()); err != nil {
		t.Errorf("mirror: %v\n%s", err, cfg)
	}
}

// The mirror report takes ratios within each run and their median, and
// memory per informer against the baseline of the same run.
func TestMirrorReport(t *testing.T) {
	mr := mirrorResults{Fill: []mirrorFill{{Objects: 100, Keys: 100, Seconds: 2, Ready: 1, CPU: 1, PeakRSS: 50 << 20}}}
	for run, secs := range []float64{1, 0.5, 2} { // mirror/baseline: 0.5, 0.25, 1
		mr.Starts = append(mr.Starts,
			startResult{Phase: "mirror", Consumer: "baseline", Objects: 100, Run: run + 1, Seconds: 2, CPU: 1, PeakRSS: 40 << 20, Events: 100},
			startResult{Phase: "mirror", Consumer: "mirror", Objects: 100, Run: run + 1, Seconds: secs, CPU: 0.5, PeakRSS: 20 << 20, Events: 100})
		mr.Memory = append(mr.Memory,
			memResult{Consumer: "informer", Objects: 100, Run: run + 1, Informers: 1, HeapBytes: 10 << 20, RSSBytes: 40 << 20},
			memResult{Consumer: "mirror", Objects: 100, Run: run + 1, Informers: 1, HeapBytes: 8 << 20, RSSBytes: 30 << 20},
			memResult{Consumer: "mirror", Objects: 100, Run: run + 1, Informers: 3, HeapBytes: 24 << 20, RSSBytes: 60 << 20})
	}
	rep := mirrorReport(options{runs: 3}, mr)
	for _, s := range []string{
		"| 1 | 2.00 s | 1.00 s | 0.50 |",
		"| 2 | 2.00 s | 0.50 s | 0.25 |",
		"| 3 | 2.00 s | 2.00 s | 1.00 |",
		"| **median** | 2.00 s | 1.00 s | **0.50** | 1.00 | 0.50 | **0.50** | 40 MiB | 20 MiB | **0.50** |",
		"| baseline (apiserver) | 1 | 10.0 MiB | 10.0 MiB | 1.00 |",
		"| mirror | 3 | 24.0 MiB | 8.0 MiB | 0.80 | 60.0 MiB | 20.0 MiB | 0.50 |",
		"3 informers: heap 8.0 MiB, RSS 15.0 MiB",
	} {
		if !strings.Contains(rep, s) {
			t.Errorf("report has no %q:\n%s", s, rep)
		}
	}
}

// Kafka against JetStream is taken run by run.
func TestPairRatio(t *testing.T) {
	by := map[string][]result{
		"jetstream": {{Run: 1, Events: 100, Seconds: 1}, {Run: 2, Events: 100, Seconds: 2}},
		"kafka":     {{Run: 1, Events: 100, Seconds: 2}, {Run: 2, Events: 100, Seconds: 1}, {Run: 3, Events: 1, Seconds: 1}},
	}
	if got := pairRatio(by, "kafka", "jetstream"); got != "1.25" { // 0.5 and 2, run 3 unpaired
		t.Errorf("kafka / jetstream: %s, want 1.25", got)
	}
	if got := pairRatio(by, "kafka-state", "jetstream"); got != "" {
		t.Errorf("no kafka-state: %q", got)
	}
}

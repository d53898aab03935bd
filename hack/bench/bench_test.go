package main

import (
	"log"
	"os"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
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
	os.Exit(m.Run())
}

// A small bench runs end to end: every consumer receives every change, the
// report has a row for each, and the memory runs see the objects cached.
func TestBenchSmoke(t *testing.T) {
	if _, err := testenv.ToolsDir(); err != nil {
		testenv.SkipOrFail(t, err)
	}
	o := options{n: 100, runs: 1, workers: 8, consumers: "baseline,nats,jetstream,webhook,file", latencyRate: 300, latencyN: 50, memory: "300"}
	all, mem, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Events != r.Changes || r.Seconds <= 0 || r.CPU <= 0 || r.MaxRSS <= 0 {
			t.Errorf("%s (rate %d): %d of %d events in %.2fs, cpu %.2fs, maxrss %d", r.Consumer, r.Rate, r.Events, r.Changes, r.Seconds, r.CPU, r.MaxRSS)
		}
		if r.Consumer != "baseline" && (len(r.Latency) != r.Events || r.P50 <= 0 || r.Max < r.P99) {
			t.Errorf("%s: latency p50 %v p99 %v max %v over %d samples", r.Consumer, r.P50, r.P99, r.Max, len(r.Latency))
		}
	}
	if want := 5 + 4; len(all) != want {
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
	rep := report(o, all, mem)
	for _, c := range append(strings.Split(o.consumers, ","), memConsumers...) {
		if !strings.Contains(rep, "| "+c+" |") {
			t.Errorf("report has no row for %s:\n%s", c, rep)
		}
	}
	t.Log(rep)
}

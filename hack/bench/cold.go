package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// restartSettle is how long a warm restart is watched after it is ready
// for events it should not send.
const restartSettle = 3 * time.Second

// startResult is one consumer's start on objects that exist already: a
// cold start (nothing known: the whole list is delivered) or a warm
// restart (the checkpoint is current: nothing is delivered).
type startResult struct {
	Phase    string `json:"phase"` // cold or restart
	Consumer string `json:"consumer"`
	Objects  int    `json:"objects"`
	Run      int    `json:"run"`
	// Seconds is from the process start until every object was delivered
	// (cold: the baseline's handler got the last initial add, the
	// bridge's subscriber the last event) or, for restart, until ready.
	Seconds float64 `json:"seconds"`
	// ReadySeconds is the bridge's time from process start to /readyz.
	ReadySeconds float64 `json:"readySeconds,omitempty"`
	// Events is, cold, the unique events delivered; restart, every event
	// received from the restart to restartSettle after ready (must be 0).
	Events     int     `json:"events"`
	Duplicates int     `json:"duplicates"`
	CPU        float64 `json:"cpuSeconds"` // until delivered (cold) or ready (restart)
	PeakRSS    int64   `json:"peakRSSBytes"`
	// ServerCPU is, in the mirror phase, what serving the consumer cost
	// from its start to its report: the apiserver's CPU for the baseline,
	// the bench process's (the embedded nats-server's, and the bench's
	// own little) for the mirror.
	ServerCPU float64 `json:"serverCPUSeconds,omitempty"`
}

func (r startResult) String() string {
	s := fmt.Sprintf("%s run %d %-13s %7d objects: %6.2fs, cpu %.2fs, peak rss %d MiB, %d events", r.Phase, r.Run, r.Consumer, r.Objects,
		r.Seconds, r.CPU, r.PeakRSS>>20, r.Events)
	if r.ReadySeconds > 0 {
		s += fmt.Sprintf(", ready after %.2fs", r.ReadySeconds)
	}
	return s
}

// coldConsumers are the cold runs' consumers: baseline, baseline-cbor,
// nats, nats-json, jetstream, kafka, kafka-state.
var coldKinds = []string{"baseline", "baseline-cbor", "nats", "nats-json", "jetstream", "kafka", "kafka-state"}

func coldConsumers(o options) ([]string, error) {
	spec := o.coldConsumers
	if spec == "" {
		spec = "baseline,nats"
		if o.cbor {
			spec = "baseline,baseline-cbor,nats,nats-json"
		}
	}
	cs := strings.Split(spec, ",")
	for _, c := range cs {
		if !slices.Contains(coldKinds, c) {
			return nil, fmt.Errorf("-cold-consumers: %q is not one of %s", c, strings.Join(coldKinds, ", "))
		}
	}
	return cs, nil
}

// parseCounts parses a comma-separated list of object counts, ascending.
func parseCounts(flagName, spec string) ([]int, error) {
	var ns []int
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive count", flagName, s)
		}
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return slices.Compact(ns), nil
}

// coldRuns fills one namespace to each count in turn and, runs times at
// each, starts every consumer fresh on it; each bridge is then restarted
// from its checkpoint with nothing changed.
func (b *bed) coldRuns(o options) ([]startResult, error) {
	ns, err := parseCounts("cold", o.cold)
	if err != nil {
		return nil, err
	}
	consumers, err := coldConsumers(o)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	const namespace = "bench-cold"
	if err := b.namespace(ctx, namespace); err != nil {
		return nil, err
	}
	var out []startResult
	have := 0
	for _, n := range ns {
		log.Printf("cold: creating ConfigMaps %d to %d", have, n)
		if err := fill(ctx, b.cs, namespace, have, n, b.workers); err != nil {
			return nil, fmt.Errorf("cold: fill: %w", err)
		}
		have = n
		for r := 1; r <= o.runs; r++ {
			for _, c := range consumers {
				var rs []startResult
				if isBaseline(c) {
					var m startResult
					m, err = b.coldBaseline(c, namespace, n, r)
					rs = append(rs, m)
				} else {
					rs, err = b.coldBridge(c, namespace, n, r)
				}
				if err != nil {
					return nil, fmt.Errorf("cold run %d, %s at %d: %w", r, c, n, err)
				}
				for _, m := range rs {
					log.Print(m)
				}
				out = append(out, rs...)
			}
		}
	}
	return out, nil
}

// coldBaseline starts a bare watch on the namespace and times it until its
// handler got all n objects of the initial list.
func (b *bed) coldBaseline(consumer, ns string, n, run int) (startResult, error) {
	res := startResult{Phase: "cold", Consumer: consumer, Objects: n, Run: run}
	cmd := exec.Command(b.self, "watch", "-kubeconfig", b.kubeconfig, "-namespace", ns, "-initial", strconv.Itoa(n))
	if b.profile != "" {
		cmd.Args = append(cmd.Args, "-cpuprofile", filepath.Join(b.profile, fmt.Sprintf("%s-%s-%s-%d-%d.pprof", ns, consumer, "initial", n, run)))
	}
	cmd.Stderr, cmd.Env = os.Stderr, watchEnv(consumer)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	stall := time.AfterFunc(5*time.Minute, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
	defer stall.Stop()
	var rep watchReport
	lines := bufio.NewScanner(out)
	if lines.Scan() {
		err = json.Unmarshal(lines.Bytes(), &rep)
	}
	_, _ = io.Copy(io.Discard, out)
	if werr := cmd.Wait(); werr != nil {
		return res, fmt.Errorf("baseline watch: %w", werr)
	}
	if err != nil {
		return res, fmt.Errorf("baseline watch report: %w", err)
	}
	res.Events = int(rep.Events)
	res.Seconds = time.Unix(0, rep.LastNanos).Sub(started).Seconds()
	res.CPU, res.PeakRSS = rep.CPUSeconds, rep.PeakRSSBytes
	return res, nil
}

// coldBridge starts the bridge with a fresh checkpoint, one rule on the
// namespace and the consumer's sink (NATS core; JetStream on a stream
// deleted first; Kafka on topics of this run's own), and times it until the subscriber has
// all n events; then it stops it (SIGTERM: the checkpoint is written) and
// starts it again from that checkpoint, timing it until ready and counting
// what it delivers (nothing changed, so nothing should arrive).
func (b *bed) coldBridge(consumer, ns string, n, run int) ([]startResult, error) {
	c := newCollector()
	name := fmt.Sprintf("cold-%s-%d-%d", consumer, n, run)
	defer os.Remove(filepath.Join(b.dir, name+".checkpoint"))
	cfg := b.bridgeConfig(consumer, ns, "", "")
	var closeSub func()
	var err error
	if isKafka(consumer) {
		k, err := b.kafkaBroker()
		if err != nil {
			return nil, err
		}
		change, tmpl, state := kafkaTopics(consumer, name) // this run's own
		if err := k.createTopics(context.Background(), change, state); err != nil {
			return nil, err
		}
		defer k.deleteTopics(context.Background(), change, state)
		cfg = ruleConfig(kafkaSink(k.brokers(), change, tmpl), ns)
		closeSub, err = kafkaReceiver(k.brokers(), change, c)
	} else {
		if consumer == "jetstream" {
			// A fresh stream: no message of an earlier run to adopt, no
			// ids in its duplicate window.
			_ = b.js.DeleteStream(context.Background(), "BENCH")
		}
		closeSub, err = natsReceiver(b.natsURL, c)
	}
	if err != nil {
		return nil, err
	}
	defer closeSub()
	args := bridgeArgs(consumer)
	var profiled chan struct{}
	if b.profile != "" {
		// From the first moment: startBridge returns only once ready, when
		// most of a cold start is over.
		addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort())
		args = append(args, "--profiling", "--profiling-addr", addr)
		profiled = make(chan struct{})
		go func() {
			defer close(profiled)
			if err := profileFromStart("http://"+addr, filepath.Join(b.profile, name+".pprof")); err != nil {
				log.Printf("cold profile: %v", err)
			}
		}()
	}
	p, err := b.startBridge(name, cfg, false, args...)
	if err != nil {
		return nil, err
	}
	defer p.kill()
	if !c.waitFor(n, time.Minute, time.Time{}) {
		log.Printf("cold %s: stalled at %d of %d events", consumer, c.unique(), n)
	}
	pid := p.cmd.Process.Pid
	cold := startResult{Phase: "cold", Consumer: consumer, Objects: n, Run: run,
		ReadySeconds: p.ready.Sub(p.started).Seconds(), CPU: procCPU(pid), PeakRSS: procStatus(pid, "VmHWM:")}
	c.mu.Lock()
	cold.Events, cold.Duplicates = len(c.ids), c.dups
	cold.Seconds = c.lastNew.Sub(p.started).Seconds()
	c.mu.Unlock()
	if profiled != nil {
		<-profiled // a stop cuts the profile short: its request fails
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	if cold.Events < n {
		return []startResult{cold}, nil // no restart from an incomplete checkpoint
	}

	before := c.receipts()
	p, err = b.startBridge(name, cfg, false, bridgeArgs(consumer)...)
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	defer p.kill()
	pid = p.cmd.Process.Pid
	warm := startResult{Phase: "restart", Consumer: consumer, Objects: n, Run: run,
		Seconds: p.ready.Sub(p.started).Seconds(), CPU: procCPU(pid)}
	warm.ReadySeconds = warm.Seconds
	time.Sleep(restartSettle)
	warm.Events, warm.PeakRSS = c.receipts()-before, procStatus(pid, "VmHWM:")
	if err := p.stop(); err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	return []startResult{cold, warm}, nil
}

// profileFromStart takes a 5 s CPU profile of a bridge starting up: it
// asks for it as soon as the profiling listener answers.
func profileFromStart(base, path string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/debug/pprof/profile?seconds=5")
		if err == nil {
			return saveBody(resp, path)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

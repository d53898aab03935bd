// Command bench measures kubebridge end to end on the test bed: a real
// etcd and kube-apiserver (built by hack/tools/build.sh) and an embedded
// nats-server, all on loopback, on this machine.
//
// Throughput: a load generator writes N ConfigMaps of ~1 KiB (create,
// update, delete: 3N changes) as fast as the apiserver takes them, once per
// consumer: the baseline, a bare client-go informer in its own process
// that only counts events, and the bridge binary delivering to NATS core,
// JetStream, a batched webhook and a file. Each run takes every consumer in
// turn; the figures are medians over runs, and ratios are taken within a
// run. Latency: the same, paced at a fixed rate. Memory: heap and RSS with
// 0, 10k and 50k ConfigMaps cached, bridge against plain informers.
//
// Phases off unless their flag is set: -owners (owners.go: a rule on N
// Pods without and with include: [owners], cold start, memory and CPU per
// update); -cold (a fresh start on N existing
// ConfigMaps, and a warm restart from the checkpoint), -slow (paced load
// into a slow webhook with the default sink config: throughput, in-flight
// requests, per-object order), -outage (memory while a webhook answers
// 503 under create/delete churn, then the final state checked). -cbor
// starts the apiserver serving CBOR and adds the consumers baseline-cbor
// and nats-json. -shards (shards.go): replicas sharing 8 shards, each
// apiserver setting of ShardedListAndWatch on a control plane of its own:
// cold starts of 1, 2, 4 replicas, and with the gate on the churn's rate
// and the handover after a SIGKILL. -mirror (mirror.go): a client-go
// informer over the bridge's NATS KV mirror of a rule's view (pkg/mirror)
// against one over the apiserver: time to the whole initial list, CPU,
// peak RSS, and memory per informer with -mirror-consumers of them in one
// process. The consumers kafka and kafka-state (kafka.go) deliver to the
// kafka sink on an in-process kfake broker, without and with a state
// topic.
//
//	go run ./hack/bench -runs 5            # or: make bench
//	go run ./hack/bench -n 300 -runs 1 -memory 1000 -latency-n 300   # smoke
//	go run ./hack/bench -runs 1 -n 0 -consumers baseline,nats -latency-rate 0 -memory "" -cold 2000
//	go run ./hack/bench -runs 1 -n 0 -latency-rate 0 -memory "" -shards 2000 -shard-churn-n 1000 -shard-handovers 2
//	go run ./hack/bench -runs 3 -n 5000 -consumers baseline,jetstream,kafka,kafka-state -latency-rate 0 -memory "" \
//		-cold 20000 -cold-consumers baseline,jetstream,kafka,kafka-state -mirror 20000 -mirror-consumers 1,20 -mirror-shared-conn
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

func main() {
	log.SetFlags(log.Ltime)
	if len(os.Args) > 1 && os.Args[1] == "watch" {
		if err := watchMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "mirrorwatch" {
		if err := mirrorWatchMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	var o options
	flag.IntVar(&o.n, "n", 10000, "ConfigMaps per throughput run (3 changes each)")
	flag.IntVar(&o.runs, "runs", 5, "runs; every consumer is measured once per run")
	flag.StringVar(&o.consumers, "consumers", "baseline,nats,jetstream,webhook,file", "consumers of the throughput and latency runs; also jetstream-unfenced (fence: false), webhook-ce (one CloudEvent per request) and webhook-shaped (one request per event shaped by CEL), kafka and kafka-state (the kafka sink on an in-process kfake broker, without and with a state topic), baseline-cbor (the bare watch asking for CBOR) and nats-json (the bridge with --kube-cbor=false), both added by -cbor")
	flag.IntVar(&o.workers, "workers", 32, "concurrent writers of the load generator")
	flag.IntVar(&o.latencyRate, "latency-rate", 1000, "changes per second of the latency runs (0: no latency runs)")
	flag.IntVar(&o.latencyN, "latency-n", 3000, "ConfigMaps per latency run")
	flag.StringVar(&o.memory, "memory", "10000,50000", "cached object counts of the memory runs (empty: none)")
	flag.StringVar(&o.jsonOut, "json", "", "also write every measurement to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, checkpoint, sink files)")
	flag.StringVar(&o.profile, "profile", "", "write a 10s CPU profile of each bridge throughput run into this directory (and with -mirror, a profile of each consumer's start)")
	flag.StringVar(&o.cold, "cold", "", "object counts of the cold start and warm restart runs, e.g. 20000,100000 (empty: none)")
	flag.StringVar(&o.coldConsumers, "cold-consumers", "", "consumers of the cold runs: baseline, baseline-cbor, nats, nats-json, jetstream, kafka, kafka-state (default baseline,nats; with -cbor also baseline-cbor,nats-json)")
	flag.StringVar(&o.slow, "slow", "", "slow sink cases, comma-separated: a webhook delay per request (20ms), a step (20ms>200ms: the delay changes halfway through the load), or nats (NATS core); empty: none")
	flag.IntVar(&o.slowRate, "slow-rate", 1000, "changes per second offered in the slow runs")
	flag.IntVar(&o.slowN, "slow-n", 2000, "ConfigMaps per slow run (3 changes each)")
	flag.DurationVar(&o.slowMax, "slow-max", 2*time.Minute, "a slow run waits at most this long after its load for the rest (it reports what arrived)")
	flag.DurationVar(&o.slowSample, "slow-sample", 500*time.Millisecond, "interval of the in-flight samples of the slow runs")
	flag.DurationVar(&o.outage, "outage", 0, "duration of the sink outage run (0: none)")
	flag.IntVar(&o.outageRate, "outage-rate", 30, "names created and then deleted per second during the outage")
	flag.StringVar(&o.outageEvents, "outage-events", "", "the outage rule's events, e.g. deleted (default: all; with a partial set the final state check is left out: its consumer holds no view)")
	flag.IntVar(&o.outageLive, "outage-live", 1000, "ConfigMaps that stay in place during the outage")
	flag.DurationVar(&o.outageSample, "outage-sample", 15*time.Second, "interval of the outage's memory samples")
	flag.BoolVar(&o.cbor, "cbor", false, "start the apiserver with CBORServingAndStorage=true")
	flag.IntVar(&o.shards, "shards", 0, "ConfigMaps of the sharded cold starts (0: no -shards phase)")
	flag.StringVar(&o.shardReplicas, "shard-replicas", "1,2,4", "replica counts of the sharded cold starts (ratios are to 1)")
	flag.StringVar(&o.shardGates, "shard-gates", "on,off", "apiserver settings of ShardedListAndWatch, each on a control plane of its own (churn and handovers: on only)")
	flag.IntVar(&o.shardChurnN, "shard-churn-n", 5000, "ConfigMaps per sharded churn run, 1 and 2 replicas (3 changes each; 0: none)")
	flag.IntVar(&o.shardHandovers, "shard-handovers", 5, "SIGKILLs of one of two replicas under churn (0: none)")
	flag.IntVar(&o.shardHandoverRate, "shard-handover-rate", 100, "names created (and deleted 1s later) per second during the handovers")
	flag.StringVar(&o.mirror, "mirror", "", "ConfigMap counts of the mirror phase, e.g. 20000: an informer over the bridge's KV mirror against one over the apiserver (empty: none)")
	flag.StringVar(&o.mirrorConsumers, "mirror-consumers", "1,20", "informers in one process of the mirror phase's memory runs (empty: none)")
	flag.BoolVar(&o.mirrorShared, "mirror-shared-conn", false, "also run the most -mirror-consumers informers on one NATS connection")
	flag.IntVar(&o.owners, "owners", 0, "Pods of the owners phase (owners.go): a rule on them without and with include: [owners], the Pods in Deployment -> ReplicaSet chains made by hand (0: none)")
	flag.IntVar(&o.ownersUpdates, "owners-updates", 5000, "Pod updates per owners run (CPU per notification)")
	flag.Parse()
	o.command = commandLine(os.Args)
	consumersSet := false
	flag.Visit(func(f *flag.Flag) { consumersSet = consumersSet || f.Name == "consumers" })
	if o.cbor && !consumersSet { // the bridge against both bare watches, and with CBOR off
		o.consumers = "baseline,baseline-cbor,nats,nats-json,jetstream,webhook,file"
	}
	res, err := run(o)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(report(o, res))
	if o.jsonOut != "" {
		out, _ := json.MarshalIndent(map[string]any{"machine": machine(), "command": o.command,
			"runs": res.Runs, "memory": res.Memory, "cold": res.Cold, "slow": res.Slow, "outage": res.Outage, "shards": res.Shards, "mirror": res.Mirror, "owners": res.Owners}, "", "  ")
		if err := os.WriteFile(o.jsonOut, out, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

type options struct {
	n, runs, workers      int
	consumers, memory     string
	latencyRate, latencyN int
	jsonOut, profile      string
	keep                  bool

	cold, coldConsumers string
	slow                string
	slowRate, slowN     int
	slowMax, slowSample time.Duration
	outage              time.Duration
	outageRate          int
	outageEvents        string
	outageLive          int
	outageSample        time.Duration
	cbor                bool
	shards              int
	shardReplicas       string
	shardGates          string
	shardChurnN         int
	shardHandovers      int
	shardHandoverRate   int
	mirror              string
	mirrorConsumers     string
	mirrorShared        bool
	owners              int
	ownersUpdates       int
	command             string // as typed, for the report
}

// results is every measurement of one bench.
type results struct {
	Runs   []result
	Memory []memResult
	Cold   []startResult
	Slow   []slowResult
	Outage []outageResult
	Shards *shardResults
	Mirror *mirrorResults
	Owners []ownersResult
}

// commandLine renders the bench's own command line, quoted for a shell.
func commandLine(args []string) string {
	out := []string{"go run ./hack/bench"}
	for _, a := range args[1:] {
		if a == "" || strings.ContainsAny(a, " \t'\"$`\\*?;&|<>()") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// bed is the test bed one bench runs on.
type bed struct {
	dir        string
	kubeconfig string
	bridge     string
	self       string
	cs         kubernetes.Interface
	natsURL    string
	js         jetstream.JetStream
	workers    int
	profile    string
	kafka      *kafkaBroker // started when a consumer needs it
	natsServer *testenv.NATS
	cpDir      string // the control plane's directory (its apiserver is found by it)
}

// isBaseline says whether consumer is a bare client-go watch.
func isBaseline(consumer string) bool { return consumer == "baseline" || consumer == "baseline-cbor" }

// bridgeArgs are a consumer's extra flags of bridge run.
func bridgeArgs(consumer string) []string {
	if consumer == "nats-json" {
		return []string{"--kube-cbor=false"}
	}
	return nil
}

// watchEnv is the environment of a baseline consumer's process: the CBOR
// one has client-go advertise and prefer CBOR.
func watchEnv(consumer string) []string {
	env := os.Environ()
	if consumer == "baseline-cbor" {
		env = append(env, "KUBE_FEATURE_ClientsAllowCBOR=true", "KUBE_FEATURE_ClientsPreferCBOR=true")
	}
	return env
}

// run sets up the test bed and measures; it returns every measurement.
func run(o options) (res results, err error) {
	tools, err := testenv.ToolsDir()
	if err != nil {
		return res, fmt.Errorf("%w (run hack/tools/build.sh)", err)
	}
	dir, err := os.MkdirTemp("", "kubebridge-bench-")
	if err != nil {
		return res, err
	}
	if o.keep {
		log.Printf("work directory: %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	log.Printf("building the bridge and starting etcd, kube-apiserver and nats-server")
	bin, err := testenv.BuildBridge(dir, false)
	if err != nil {
		return res, err
	}
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	if err := os.Mkdir(filepath.Join(dir, "cp"), 0o755); err != nil {
		return res, err
	}
	var cpOpts testenv.ControlPlaneOptions
	if o.cbor {
		cpOpts.FeatureGates = []string{"CBORServingAndStorage=true"}
	}
	cp, err := testenv.NewControlPlaneWithOptions(tools, filepath.Join(dir, "cp"), cpOpts)
	if err != nil {
		return res, err
	}
	defer cp.Stop()
	kc, err := cp.Kubeconfig(dir)
	if err != nil {
		return res, err
	}
	ns, err := testenv.NewNATS(filepath.Join(dir, "nats"))
	if err != nil {
		return res, err
	}
	defer ns.Stop()
	rc := cp.RESTConfig()
	rc.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter() // as fast as the apiserver takes it
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return res, err
	}
	nc, err := natsgo.Connect(ns.ClientURL())
	if err != nil {
		return res, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	b := &bed{dir: dir, kubeconfig: kc, bridge: bin, self: self, cs: cs, natsURL: ns.ClientURL(), js: js, workers: o.workers, profile: o.profile, natsServer: ns, cpDir: filepath.Join(dir, "cp")}

	var consumers []string
	if o.consumers != "" {
		consumers = strings.Split(o.consumers, ",")
	}
	defer func() {
		if b.kafka != nil {
			b.kafka.close()
		}
	}()
	for r := 1; r <= o.runs && o.n > 0; r++ {
		for _, c := range consumers {
			m, err := b.measure(c, r, o.n, 0)
			if err != nil {
				return res, fmt.Errorf("run %d, %s: %w", r, c, err)
			}
			log.Print(m)
			res.Runs = append(res.Runs, m)
		}
	}
	if o.latencyRate > 0 {
		for r := 1; r <= o.runs; r++ {
			for _, c := range consumers {
				if isBaseline(c) {
					continue
				}
				m, err := b.measure(c, r, o.latencyN, o.latencyRate)
				if err != nil {
					return res, fmt.Errorf("latency run %d, %s: %w", r, c, err)
				}
				log.Print(m)
				res.Runs = append(res.Runs, m)
			}
		}
	}
	if o.memory != "" {
		if res.Memory, err = b.memoryRuns(o.memory, o.runs); err != nil {
			return res, err
		}
	}
	if o.cold != "" {
		if res.Cold, err = b.coldRuns(o); err != nil {
			return res, err
		}
	}
	if o.slow != "" {
		if res.Slow, err = b.slowRuns(o); err != nil {
			return res, err
		}
	}
	if o.outage > 0 {
		for r := 1; r <= o.runs; r++ {
			m, err := b.outageRun(o, r)
			if err != nil {
				return res, fmt.Errorf("outage run %d: %w", r, err)
			}
			res.Outage = append(res.Outage, m)
		}
	}
	if o.mirror != "" {
		mr, err := b.mirrorRuns(o)
		res.Mirror = &mr
		if err != nil {
			return res, err
		}
	}
	if o.owners > 0 {
		if res.Owners, err = b.ownersRuns(o); err != nil {
			return res, err
		}
	}
	if o.shards > 0 {
		sr, err := b.shardRuns(o)
		res.Shards = &sr
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// result is one consumer's measurement in one run.
type result struct {
	Consumer  string `json:"consumer"`
	Run       int    `json:"run"`
	Rate      int    `json:"rate"` // paced changes/s; 0: as fast as possible
	Changes   int    `json:"changes"`
	Events    int    `json:"events"`     // unique events delivered (baseline: notifications)
	Duplicate int    `json:"duplicates"` // events delivered more than once
	// OutOfOrder counts first deliveries older than an earlier one of
	// their object (must be 0).
	OutOfOrder int     `json:"outOfOrder"`
	Seconds    float64 `json:"seconds"` // first write to last event
	// Tail is from the load's last acknowledged write to the last event:
	// how far behind the apiserver's writes the consumer ended.
	Tail    float64         `json:"tailSeconds"`
	CPU     float64         `json:"cpuSeconds"` // user+system of the consumer process
	MaxRSS  int64           `json:"maxRSSBytes"`
	Latency []time.Duration `json:"-"`
	// P99ByType is the p99 latency of added, updated and deleted events:
	// only first deliveries of an object wait for the write-ahead intent.
	P99ByType map[string]time.Duration `json:"p99ByType,omitempty"`
	P50       time.Duration            `json:"p50"`
	P99       time.Duration            `json:"p99"`
	Max       time.Duration            `json:"max"`
}

func (r result) perSecond() float64 { return float64(r.Events) / r.Seconds }

func (r result) String() string {
	s := fmt.Sprintf("run %d %-13s %6d/%d events in %6.2fs = %7.0f/s (tail %.2fs), cpu %.2fs, maxrss %d MiB",
		r.Run, r.Consumer, r.Events, r.Changes, r.Seconds, r.perSecond(), r.Tail, r.CPU, r.MaxRSS>>20)
	if r.Rate > 0 {
		s = fmt.Sprintf("paced %d/s: ", r.Rate) + s
	}
	if len(r.Latency) > 0 {
		s += fmt.Sprintf(", latency p50 %v p99 %v max %v (p99 added %v, updated %v, deleted %v)", r.P50, r.P99, r.Max,
			r.P99ByType["added"], r.P99ByType["updated"], r.P99ByType["deleted"])
	}
	return s
}

// measure runs the load once against one consumer in a fresh namespace.
func (b *bed) measure(consumer string, run, n, rate int) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("bench-%s-%d-%d", consumer, rate, run)
	if err := b.namespace(ctx, ns); err != nil {
		return result{}, err
	}
	res := result{Consumer: consumer, Run: run, Rate: rate, Changes: 3 * n}
	l := &load{cs: b.cs, ns: ns, n: n, rate: rate, workers: b.workers}
	if isBaseline(consumer) {
		return res, b.measureBaseline(ctx, consumer, l, &res)
	}
	return res, b.measureBridge(ctx, consumer, l, &res)
}

func (b *bed) namespace(ctx context.Context, ns string) error {
	_, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (b *bed) measureBaseline(ctx context.Context, consumer string, l *load, res *result) error {
	cmd := exec.Command(b.self, "watch", "-kubeconfig", b.kubeconfig, "-namespace", l.ns, "-expect", strconv.Itoa(res.Changes))
	cmd.Stderr, cmd.Env = os.Stderr, watchEnv(consumer)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "synced" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("baseline watch did not sync")
	}
	start, err := l.run(ctx)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	end := time.Now()
	// It exits once every change arrived; a stalled one is stopped.
	stall := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
	defer stall.Stop()
	var rep watchReport
	if lines.Scan() {
		if err := json.Unmarshal(lines.Bytes(), &rep); err != nil {
			return err
		}
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("baseline watch: %w", err)
	}
	res.Events = int(rep.Events)
	res.Seconds = time.Unix(0, rep.LastNanos).Sub(start).Seconds()
	res.Tail = time.Unix(0, rep.LastNanos).Sub(end).Seconds()
	res.MaxRSS = rep.PeakRSSBytes
	usage(cmd, res)
	return nil
}

// bridgeConfig is the bridge's config for one consumer: one rule on the
// namespace's ConfigMaps, delivering to one sink.
func (b *bed) bridgeConfig(consumer, ns, hookURL, file string) string {
	var sink string
	switch consumer {
	case "nats", "nats-json":
		sink = "nats: {url: " + b.natsURL + "}"
	case "jetstream":
		sink = "nats: {url: " + b.natsURL + ", jetstream: true, stream: {name: BENCH}}"
	case "jetstream-unfenced": // what fencing at the stream is measured against
		sink = "nats: {url: " + b.natsURL + ", jetstream: true, fence: false, stream: {name: BENCH}}"
	case "webhook":
		sink = "webhook: {url: " + hookURL + ", batch: {maxEvents: 100}}"
	case "webhook-ce": // one CloudEvent per request: what a shaped request is measured against
		sink = "webhook: {url: " + hookURL + "}"
	case "webhook-shaped": // one request per event, its body built by CEL
		sink = `webhook:
      url: ` + hookURL + `
      request:
        headers: {X-Rule: "event.rule"}
        body: >-
          {"id": event.id, "time": event.time, "name": object.metadata.name, "subject": event.subject, "change": event.change}`
	case "file":
		sink = "file: {path: " + file + ", maxSizeMB: 4096}"
	case "kafka", "kafka-state":
		change, stateTemplate, _ := kafkaTopics(consumer, ns)
		var brokers []string
		if b.kafka != nil {
			brokers = b.kafka.brokers()
		}
		sink = kafkaSink(brokers, change, stateTemplate)
	}
	return ruleConfig(sink, ns)
}

// ruleConfig is a bridge config with one sink (its type block) and one
// rule on the namespace's ConfigMaps.
func ruleConfig(sink, ns string) string {
	return fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: bench
sinks:
  - name: out
    %s
rules:
  - name: bench
    resource: v1/configmaps
    namespaces: [%s]
    sinks: [out]
`, sink, ns)
}

func (b *bed) measureBridge(ctx context.Context, consumer string, l *load, res *result) error {
	c := newCollector()
	var hookURL string
	file := filepath.Join(b.dir, l.ns+".jsonl")
	stopFile := make(chan struct{})
	fileDone := make(chan error, 1)
	switch consumer {
	case "nats", "nats-json", "jetstream", "jetstream-unfenced":
		closeSub, err := natsReceiver(b.natsURL, c)
		if err != nil {
			return err
		}
		defer closeSub()
	case "webhook", "webhook-ce", "webhook-shaped":
		hook := webhookReceiver(c)
		defer hook.Close()
		hookURL = hook.URL
	case "file":
		go func() { fileDone <- fileReceiver(file, c, stopFile) }()
		defer func() { close(stopFile); <-fileDone }()
	case "kafka", "kafka-state":
		k, err := b.kafkaBroker()
		if err != nil {
			return err
		}
		change, _, state := kafkaTopics(consumer, l.ns)
		if err := k.createTopics(ctx, change, state); err != nil {
			return err
		}
		defer k.deleteTopics(context.Background(), change, state)
		closeRecv, err := kafkaReceiver(k.brokers(), change, c)
		if err != nil {
			return err
		}
		defer closeRecv()
	default:
		return fmt.Errorf("unknown consumer %q", consumer)
	}
	profiling := b.profile != "" && l.rate == 0
	p, err := b.startBridge(l.ns, b.bridgeConfig(consumer, l.ns, hookURL, file), profiling, bridgeArgs(consumer)...)
	if err != nil {
		return err
	}
	defer p.kill()
	if profiling {
		profiled := make(chan struct{})
		defer func() { <-profiled }()
		go func() {
			defer close(profiled)
			if err := p.saveProfile(filepath.Join(b.profile, l.ns+".pprof")); err != nil {
				log.Printf("profile: %v", err)
			}
		}()
	}
	start, err := l.run(ctx)
	if err != nil {
		return err
	}
	end := time.Now()
	// Wait for every change, or until nothing arrived for 30s.
	if !c.waitFor(res.Changes, 30*time.Second, time.Time{}) {
		log.Printf("%s: stalled at %d of %d events", consumer, c.unique(), res.Changes)
	}
	res.MaxRSS = procStatus(p.cmd.Process.Pid, "VmHWM:")
	if err := p.stop(); err != nil {
		return err
	}
	usage(p.cmd, res)
	c.mu.Lock()
	defer c.mu.Unlock()
	res.Events, res.Duplicate, res.OutOfOrder = len(c.ids), c.dups, c.outOfOrder
	res.Seconds = c.lastNew.Sub(start).Seconds()
	res.Tail = c.lastNew.Sub(end).Seconds()
	res.Latency = c.lat
	res.P50, res.P99, res.Max = quantile(c.lat, 0.5), quantile(c.lat, 0.99), quantile(c.lat, 1)
	res.P99ByType = map[string]time.Duration{}
	for t, l := range c.byType {
		res.P99ByType[t] = quantile(l, 0.99)
	}
	if strings.HasPrefix(consumer, "jetstream") { // keep the store small across runs
		if s, err := b.js.Stream(ctx, "BENCH"); err == nil {
			_ = s.Purge(ctx)
		}
	}
	return nil
}

// bridgeProc is a running bridge binary.
type bridgeProc struct {
	cmd     *exec.Cmd
	admin   string
	pprof   string // with -profile
	log     string // its log file
	done    chan struct{}
	started time.Time // just before the process was started
	ready   time.Time // when /readyz first answered 200
}

// startBridge starts the bridge with cfg and waits until it is ready. Its
// checkpoint and log are named after name: starting the same name again
// restarts it from its checkpoint (the log is appended to).
func (b *bed) startBridge(name, cfg string, profiling bool, extra ...string) (*bridgeProc, error) {
	args := []string{"--checkpoint-file", filepath.Join(b.dir, name+".checkpoint")}
	pprofAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort())
	if profiling {
		args = append(args, "--profiling", "--profiling-addr", pprofAddr)
	}
	p, err := b.launch(name, cfg, append(args, extra...)...)
	if err != nil {
		return nil, err
	}
	p.pprof = "http://" + pprofAddr
	// Polled often: the warm restart is timed to this answer.
	if err := p.waitReady(5*time.Millisecond, 5*time.Minute); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// launch starts the bridge with cfg (written to <name>.yaml), its log
// appended to <name>.log, and args after the common flags; it does not
// wait.
func (b *bed) launch(name, cfg string, args ...string) (*bridgeProc, error) {
	cfgFile := filepath.Join(b.dir, name+".yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(b.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	admin := "127.0.0.1:" + strconv.Itoa(testenv.FreePort())
	common := []string{"run", "--config", cfgFile, "--kubeconfig", b.kubeconfig, "--admin-addr", admin, "--reload=false", "--log-level", "warn"}
	cmd := exec.Command(b.bridge, append(common, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p := &bridgeProc{cmd: cmd, admin: "http://" + admin, log: logFile.Name(), done: make(chan struct{}), started: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// waitReady polls /readyz every poll until it answers 200 (p.ready is
// then set), the bridge exits or within passed.
func (p *bridgeProc) waitReady(poll, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(p.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ready = time.Now()
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("bridge exited: see %s", p.log)
		case <-time.After(poll):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bridge not ready after %v: see %s", within, p.log)
		}
	}
}

// stop stops the bridge as Kubernetes would (SIGTERM) and waits.
func (p *bridgeProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
		return fmt.Errorf("bridge did not stop within 30s")
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("bridge: %v", p.cmd.ProcessState)
	}
	return nil
}

func (p *bridgeProc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// saveProfile takes a 10s CPU profile into path.
func (p *bridgeProc) saveProfile(path string) error {
	resp, err := http.Get(p.pprof + "/debug/pprof/profile?seconds=10")
	if err != nil {
		return err
	}
	return saveBody(resp, path)
}

// saveBody writes an answer's body to path and closes it.
func saveBody(resp *http.Response, path string) error {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Request.URL.Path, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// metric reads one sample (the first whose name and labels start with
// prefix) of the bridge's /metrics.
// waitMetric waits until the metric's value is want.
func (p *bridgeProc) waitMetric(prefix string, want float64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		v, err := p.metric(prefix)
		if err == nil && v == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is %v, not %v, after %s (%v)", prefix, v, want, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *bridgeProc) metric(prefix string) (float64, error) {
	resp, err := http.Get(p.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if line := s.Text(); strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, fmt.Errorf("no metric %s", prefix)
}

// usage records the CPU time of an exited process. (Its rusage's maxrss is
// no use: Linux carries the forking parent's peak over into the child.)
func usage(cmd *exec.Cmd, res *result) {
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

// procCPU is a running process's user+system CPU time so far, from
// /proc/<pid>/stat (in clock ticks of 10 ms).
func procCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name's closing parenthesis start at
	// the state (field 3); utime and stime are fields 14 and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(ut+st) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100

// rss is a process's resident set size, from /proc.
func rss(pid int) int64 { return procStatus(pid, "VmRSS:") }

// procStatus reads a size field of /proc/<pid>/status in bytes: VmRSS is
// the resident set now, VmHWM its peak since the process started.
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%d cores (GOMAXPROCS %d), %s, %s/%s, host %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, host)
}

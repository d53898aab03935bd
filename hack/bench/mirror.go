package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/mirror"
)

// The -mirror phase: a rule's view read from its NATS KV mirror bucket by
// a client-go informer (pkg/mirror's ListerWatcher), against the same
// informer listing the apiserver. One namespace is filled with N
// ConfigMaps; the bridge, with a mirror sink and one rule on the
// namespace, runs until the bucket holds a key per object, and is then
// stopped (the bucket stays: the consumers read NATS only). Then, runs
// times, a bare informer process lists the namespace from the apiserver
// (`bench watch -initial N`) and a consumer process lists it from the
// bucket (`bench mirrorwatch -initial N`), each timed from its process
// start to its handler's N-th add of the initial list. Memory: one
// `mirrorwatch -memory -consumers K` process running K informers over the
// bucket, against `watch -memory`.

// mirrorRule is the rule of the mirror phase, so its bucket is
// kubebridge-bench (the sink's default template kubebridge-{rule}).
const (
	mirrorRule      = "bench"
	mirrorBucket    = "kubebridge-" + mirrorRule
	mirrorNamespace = "bench-mirror"
)

// mirrorResults are the measurements of the -mirror phase.
type mirrorResults struct {
	Fill   []mirrorFill  `json:"fill"`
	Starts []startResult `json:"starts"` // Phase "mirror", Consumer baseline or mirror
	Memory []memResult   `json:"memory"` // Consumer informer or mirror, Informers K
}

// mirrorFill is the bridge's start on N ConfigMaps with a mirror sink,
// until the bucket held a key for each.
type mirrorFill struct {
	Objects int     `json:"objects"`
	Keys    int     `json:"keys"`    // keys of the namespace in the bucket at the end
	Seconds float64 `json:"seconds"` // process start to the last key (polled every 200 ms)
	Ready   float64 `json:"readySeconds"`
	CPU     float64 `json:"cpuSeconds"`
	PeakRSS int64   `json:"peakRSSBytes"`
}

func (f mirrorFill) String() string {
	return fmt.Sprintf("mirror fill %7d objects: %d keys in %.2fs (ready after %.2fs), cpu %.2fs, peak rss %d MiB",
		f.Objects, f.Keys, f.Seconds, f.Ready, f.CPU, f.PeakRSS>>20)
}

// mirrorRuns fills the namespace to each count of -mirror in turn, has the
// bridge mirror it, and measures the consumers there.
func (b *bed) mirrorRuns(o options) (mirrorResults, error) {
	var res mirrorResults
	counts, err := parseCounts("mirror", o.mirror)
	if err != nil {
		return res, err
	}
	var ks []int
	if o.mirrorConsumers != "" {
		if ks, err = parseCounts("mirror-consumers", o.mirrorConsumers); err != nil {
			return res, err
		}
	}
	ctx := context.Background()
	if err := b.namespace(ctx, mirrorNamespace); err != nil {
		return res, err
	}
	have := 0
	for _, n := range counts {
		log.Printf("mirror: creating ConfigMaps %d to %d", have, n)
		if err := fill(ctx, b.cs, mirrorNamespace, have, n, b.workers); err != nil {
			return res, fmt.Errorf("mirror: fill: %w", err)
		}
		have = n
		f, err := b.mirrorFill(ctx, n)
		if err != nil {
			return res, fmt.Errorf("mirror fill at %d: %w", n, err)
		}
		log.Print(f)
		res.Fill = append(res.Fill, f)
		for r := 1; r <= o.runs; r++ {
			apiserver := b.apiserverPid()
			before := procCPU(apiserver)
			base, err := b.coldBaseline("baseline", mirrorNamespace, n, r)
			base.ServerCPU = procCPU(apiserver) - before
			if err != nil {
				return res, fmt.Errorf("mirror run %d, baseline at %d: %w", r, n, err)
			}
			base.Phase = "mirror"
			log.Print(base)
			before = selfCPU()
			m, err := b.mirrorConsumer(n, r)
			m.ServerCPU = selfCPU() - before
			if err != nil {
				return res, fmt.Errorf("mirror run %d, mirror at %d: %w", r, n, err)
			}
			log.Print(m)
			res.Starts = append(res.Starts, base, m)
		}
		for r := 1; r <= o.runs && len(ks) > 0; r++ {
			// The baseline as it is, and as it would cache what the
			// bridge's events carry (no managedFields).
			for _, c := range []string{"informer", "informer-strip"} {
				m := memResult{Consumer: c, Objects: n, Run: r, Informers: 1}
				if err := b.informerMemory(mirrorNamespace, &m); err != nil {
					return res, fmt.Errorf("mirror memory run %d, %s at %d: %w", r, c, n, err)
				}
				log.Print(m)
				res.Memory = append(res.Memory, m)
			}
			for i, k := range ks {
				m := memResult{Consumer: "mirror", Objects: n, Run: r, Informers: k}
				if err := b.mirrorMemory(&m, false); err != nil {
					return res, fmt.Errorf("mirror memory run %d, %d informers at %d: %w", r, k, n, err)
				}
				log.Print(m)
				res.Memory = append(res.Memory, m)
				if i == len(ks)-1 && k > 1 && o.mirrorShared {
					// The most informers again on one connection.
					m := memResult{Consumer: "mirror-shared", Objects: n, Run: r, Informers: k}
					if err := b.mirrorMemory(&m, true); err != nil {
						return res, fmt.Errorf("mirror memory run %d, %d informers on one connection at %d: %w", r, k, n, err)
					}
					log.Print(m)
					res.Memory = append(res.Memory, m)
				}
			}
		}
	}
	return res, nil
}

// mirrorFill runs the bridge with a mirror sink (its checkpoint kept
// across counts) until the bucket holds a key per ConfigMap of the
// namespace, then stops it.
func (b *bed) mirrorFill(ctx context.Context, n int) (mirrorFill, error) {
	f := mirrorFill{Objects: n}
	cfg := ruleConfig("nats: {url: "+b.natsURL+", mirror: {}}", mirrorNamespace)
	p, err := b.startBridge("mirror", cfg, false)
	if err != nil {
		return f, err
	}
	defer p.kill()
	f.Ready = p.ready.Sub(p.started).Seconds()
	deadline := time.Now().Add(10 * time.Minute)
	var kv jetstream.KeyValue
	for {
		if kv == nil {
			kv, _ = b.js.KeyValue(ctx, mirrorBucket) // created by the sink
		}
		if kv != nil {
			// The stream's message count is cheap to read; count the keys
			// only once it could be complete.
			if st, err := kv.Status(ctx); err == nil && st.Values() >= uint64(n) {
				keys, err := countKeys(ctx, kv, mirrorNamespace+".>")
				if err != nil {
					return f, err
				}
				if f.Keys = keys; keys == n {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("the bucket holds %d keys of %d after 10 min: see %s", f.Keys, n, p.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	pid := p.cmd.Process.Pid
	f.Seconds = time.Since(p.started).Seconds()
	f.CPU, f.PeakRSS = procCPU(pid), procStatus(pid, "VmHWM:")
	return f, p.stop()
}

// apiserverPid finds the bench's kube-apiserver by its --cert-dir, under
// the bench's control plane directory (0 if not found).
func (b *bed) apiserverPid() int {
	want := []byte("--cert-dir=" + filepath.Join(b.cpDir, "apiserver-certs") + "\x00")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(cmd, want) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			return pid
		}
	}
	return 0
}

// countKeys counts the bucket's keys matching filter.
func countKeys(ctx context.Context, kv jetstream.KeyValue, filter string) (int, error) {
	l, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return 0, err
	}
	defer l.Stop()
	n := 0
	for range l.Keys() {
		n++
	}
	return n, nil
}

// mirrorConsumer starts `mirrorwatch -initial n` and times it until its
// handler got all n objects of the bucket's initial list.
func (b *bed) mirrorConsumer(n, run int) (startResult, error) {
	res := startResult{Phase: "mirror", Consumer: "mirror", Objects: n, Run: run}
	cmd := exec.Command(b.self, "mirrorwatch", "-url", b.natsURL, "-bucket", mirrorBucket, "-initial", strconv.Itoa(n))
	if b.profile != "" {
		cmd.Args = append(cmd.Args, "-cpuprofile", filepath.Join(b.profile, fmt.Sprintf("mirror-mirror-%d-%d.pprof", n, run)))
	}
	cmd.Stderr = os.Stderr
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
		return res, fmt.Errorf("mirrorwatch: %w", werr)
	}
	if err != nil {
		return res, fmt.Errorf("mirrorwatch report: %w", err)
	}
	res.Events = int(rep.Events)
	res.Seconds = time.Unix(0, rep.LastNanos).Sub(started).Seconds()
	res.CPU, res.PeakRSS = rep.CPUSeconds, rep.PeakRSSBytes
	return res, nil
}

// mirrorMemory starts `mirrorwatch -memory -consumers K` (with
// sharedConn, -shared-conn) and reads its memory once every informer
// holds the bucket's objects.
func (b *bed) mirrorMemory(m *memResult, sharedConn bool) error {
	cmd := exec.Command(b.self, "mirrorwatch", "-memory", "-url", b.natsURL, "-bucket", mirrorBucket, "-consumers", strconv.Itoa(m.Informers),
		"-shared-conn="+strconv.FormatBool(sharedConn))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	slow := b.slowConsumers()
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	lines.Buffer(nil, 1<<20)
	if !lines.Scan() || lines.Text() != "synced" {
		return fmt.Errorf("mirrorwatch did not sync")
	}
	m.Seconds = time.Since(started).Seconds()
	m.SlowConsumers = b.slowConsumers() - slow
	if !lines.Scan() {
		return fmt.Errorf("mirrorwatch did not report")
	}
	var rep watchReport
	if err := json.Unmarshal(lines.Bytes(), &rep); err != nil {
		return err
	}
	if rep.Objects != m.Objects {
		return fmt.Errorf("an informer cached %d objects, want %d", rep.Objects, m.Objects)
	}
	m.HeapBytes, m.RSSBytes, m.Disconnects = rep.HeapBytes, rep.RSSBytes, rep.Disconnects
	return nil
}

// slowConsumers is how many clients the bench's nats-server cut off as
// slow consumers so far.
func (b *bed) slowConsumers() int64 {
	if b.natsServer == nil || b.natsServer.Server == nil {
		return 0
	}
	v, err := b.natsServer.Varz(nil)
	if err != nil {
		return 0
	}
	return v.SlowConsumers
}

// mirrorWatchMain is the consumer of the mirror: -consumers client-go
// shared informers over pkg/mirror's ListerWatcher on the bucket (a NATS
// connection and a ListerWatcher each, as separate consumers would have;
// with -shared-conn one connection for all), unstructured with the
// namespace index as the baseline's dynamic informer, a handler that only
// counts. With -initial N it reports (as `watch -initial` does) once
// every informer's handler got N adds of the initial list, and exits;
// with -memory it prints "synced" once every informer synced, then a
// report of its memory (Objects: the fewest any informer holds), and
// waits for SIGTERM.
func mirrorWatchMain(args []string) error {
	fs := flag.NewFlagSet("mirrorwatch", flag.ContinueOnError)
	url := fs.String("url", "", "NATS server")
	bucket := fs.String("bucket", mirrorBucket, "the rule's mirror bucket")
	consumers := fs.Int("consumers", 1, "informers over the bucket")
	memory := fs.Bool("memory", false, "report memory after every informer synced, then wait")
	initial := fs.Int64("initial", 0, "report and exit once every handler got this many adds of the initial list")
	shared := fs.Bool("shared-conn", false, "one NATS connection for every informer")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (with -initial: until the report) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if *consumers < 1 {
		return fmt.Errorf("-consumers must be at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var disconnects atomic.Int64
	var kv jetstream.KeyValue
	bucketOf := func() (jetstream.KeyValue, error) {
		if kv != nil && *shared {
			return kv, nil
		}
		nc, err := natsgo.Connect(*url, natsgo.MaxReconnects(-1),
			natsgo.DisconnectErrHandler(func(*natsgo.Conn, error) { disconnects.Add(1) }))
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, err
		}
		if kv, err = js.KeyValue(ctx, *bucket); err != nil {
			return nil, fmt.Errorf("bucket %s: %w", *bucket, err)
		}
		return kv, nil
	}
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ConfigMap")

	want := *initial * int64(*consumers)
	var initials atomic.Int64
	var initialReport watchReport
	initialDone := make(chan struct{})
	var once sync.Once
	infs := make([]cache.SharedIndexInformer, *consumers)
	for i := range infs {
		kv, err := bucketOf()
		if err != nil {
			return err
		}
		lw := mirror.NewListerWatcher(kv, mirror.Options{Object: obj})
		inf := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(_ any, isInitial bool) {
				if isInitial && initials.Add(1) == want {
					once.Do(func() {
						initialReport = watchReport{Events: *initial, LastNanos: time.Now().UnixNano(), CPUSeconds: selfCPU(),
							PeakRSSBytes: procStatus(os.Getpid(), "VmHWM:")}
						close(initialDone)
					})
				}
			},
			UpdateFunc: func(any, any) {},
			DeleteFunc: func(any) {},
		}); err != nil {
			return err
		}
		infs[i] = inf
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, inf := range infs {
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(runCtx) }()
	}
	if *initial > 0 {
		select {
		case <-initialDone:
		case <-ctx.Done():
			return fmt.Errorf("stopped after %d of %d initial adds", initials.Load(), want)
		}
		return json.NewEncoder(os.Stdout).Encode(initialReport)
	}
	for _, inf := range infs {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return fmt.Errorf("informer did not sync")
		}
	}
	fmt.Println("synced")
	r := watchReport{Objects: -1, PeakRSSBytes: procStatus(os.Getpid(), "VmHWM:"), Disconnects: disconnects.Load()}
	for _, inf := range infs {
		if n := len(inf.GetStore().ListKeys()); r.Objects < 0 || n < r.Objects {
			r.Objects = n
		}
	}
	if !*memory {
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	r.HeapBytes, r.RSSBytes = liveHeap(), rss(os.Getpid())
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return err
	}
	<-ctx.Done()
	runtime.KeepAlive(infs)
	return nil
}

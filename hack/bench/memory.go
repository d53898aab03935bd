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
)

// memResult is one consumer's memory with objects ConfigMaps cached.
type memResult struct {
	Consumer  string `json:"consumer"`
	Objects   int    `json:"objects"`
	Run       int    `json:"run"`
	HeapBytes int64  `json:"heapBytes"` // live heap after a forced GC
	RSSBytes  int64  `json:"rssBytes"`
}

// memConsumers are measured with the same objects cached: plain client-go
// informers (dynamic, as kubebridge uses, and typed) and the bridge, once
// with a rule that delivers the object and once with one that needs only
// metadata.
var memConsumers = []string{"informer", "typed", "bridge", "bridge-meta"}

// memoryRuns fills one namespace to each count in spec (and measures it
// empty first), measuring every consumer runs times at each count.
func (b *bed) memoryRuns(spec string, runs int) ([]memResult, error) {
	ctx := context.Background()
	counts := []int{0}
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("-memory: %w", err)
		}
		counts = append(counts, n)
	}
	slices.Sort(counts)
	const ns = "bench-memory"
	if err := b.namespace(ctx, ns); err != nil {
		return nil, err
	}
	var out []memResult
	have := 0
	for _, n := range counts {
		if n > have {
			log.Printf("memory: creating ConfigMaps %d to %d", have, n)
			if err := fill(ctx, b.cs, ns, have, n, b.workers); err != nil {
				return nil, err
			}
			have = n
		}
		for r := 1; r <= runs; r++ {
			for _, c := range memConsumers {
				m := memResult{Consumer: c, Objects: n, Run: r}
				var err error
				if strings.HasPrefix(c, "bridge") {
					err = b.bridgeMemory(ns, &m)
				} else {
					err = b.informerMemory(ns, &m)
				}
				if err != nil {
					return nil, fmt.Errorf("memory %s at %d: %w", c, n, err)
				}
				log.Printf("memory run %d %-11s %6d objects: heap %6.1f MiB, rss %6.1f MiB", r, c, n, mib(m.HeapBytes), mib(m.RSSBytes))
				out = append(out, m)
			}
		}
	}
	return out, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (b *bed) informerMemory(ns string, m *memResult) error {
	args := []string{"watch", "-memory", "-kubeconfig", b.kubeconfig, "-namespace", ns}
	if m.Consumer == "typed" {
		args = append(args, "-typed")
	}
	cmd := exec.Command(b.self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	lines.Buffer(nil, 1<<20)
	if !lines.Scan() || lines.Text() != "synced" || !lines.Scan() {
		return fmt.Errorf("informer did not report")
	}
	var rep watchReport
	if err := json.Unmarshal(lines.Bytes(), &rep); err != nil {
		return err
	}
	if rep.Objects != m.Objects {
		return fmt.Errorf("informer cached %d objects, want %d", rep.Objects, m.Objects)
	}
	m.HeapBytes, m.RSSBytes = rep.HeapBytes, rep.RSSBytes
	return nil
}

func (b *bed) bridgeMemory(ns string, m *memResult) error {
	name := fmt.Sprintf("memory-%s-%d-%d", m.Consumer, m.Objects, m.Run)
	file := filepath.Join(b.dir, name+".jsonl")
	defer os.Remove(file)
	defer os.Remove(filepath.Join(b.dir, name+".checkpoint"))
	include := ""
	if m.Consumer == "bridge-meta" {
		include = "\n    include: [metadata]"
	}
	cfg := fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: bench
sinks:
  - name: out
    file: {path: %s, maxSizeMB: 4096}
rules:
  - name: bench
    resource: v1/configmaps
    namespaces: [%s]
    sinks: [out]%s
`, file, ns, include)
	p, err := b.startBridge(name, cfg, true)
	if err != nil {
		return err
	}
	defer p.kill()
	// The first start delivers the whole view; measure once it is out of
	// the queue (and the checkpoint written), as in steady state.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		n, err := p.metric(`kubebridge_sink_delivered_total{sink="out"}`)
		if err != nil {
			return err
		}
		if int(n) >= m.Objects {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bridge delivered %d of %d", int(n), m.Objects)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // a checkpoint flush
	if err := p.collectGarbage(); err != nil {
		return err
	}
	heap, err := p.metric("go_memstats_heap_alloc_bytes ")
	if err != nil {
		return err
	}
	m.HeapBytes, m.RSSBytes = int64(heap), rss(p.cmd.Process.Pid)
	return p.stop()
}

// collectGarbage has the bridge (started with profiling) run two full
// collections: the pprof heap profile with ?gc=1 runs one first.
func (p *bridgeProc) collectGarbage() error {
	for range 2 {
		resp, err := http.Get(p.pprof + "/debug/pprof/heap?gc=1")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("heap profile: %s", resp.Status)
		}
	}
	return nil
}

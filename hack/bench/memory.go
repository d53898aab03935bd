package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// memResult is one consumer's memory with objects ConfigMaps (or Secrets,
// for the *-secrets consumers) cached.
type memResult struct {
	Consumer  string `json:"consumer"`
	Objects   int    `json:"objects"`
	Run       int    `json:"run"`
	HeapBytes int64  `json:"heapBytes"` // live heap after a forced GC
	RSSBytes  int64  `json:"rssBytes"`
	// Informers is, in the mirror phase, how many informers the process
	// ran (each holding every object).
	Informers int `json:"informers,omitempty"`
	// Disconnects are the NATS connections the mirror's process lost
	// until its informers synced; SlowConsumers, the clients the server
	// cut off as slow consumers meanwhile.
	Disconnects   int64 `json:"disconnects,omitempty"`
	SlowConsumers int64 `json:"slowConsumers,omitempty"`
	// Seconds is from the process start until every informer synced.
	Seconds float64 `json:"seconds,omitempty"`
}

func (m memResult) String() string {
	s := fmt.Sprintf("memory run %d %-22s %6d objects: heap %6.1f MiB, rss %6.1f MiB", m.Run, m.Consumer, m.Objects, mib(m.HeapBytes), mib(m.RSSBytes))
	if m.Informers > 0 {
		s += fmt.Sprintf(" (%d informers: heap %.1f MiB, rss %.1f MiB each; synced after %.2fs, %d NATS disconnects, %d slow consumers)",
			m.Informers, mib(m.HeapBytes)/float64(m.Informers), mib(m.RSSBytes)/float64(m.Informers), m.Seconds, m.Disconnects, m.SlowConsumers)
	}
	return s
}

// memConsumers are measured with the same objects cached: plain client-go
// informers (dynamic, as kubebridge uses, and typed) and the bridge, once
// with a rule that delivers the object and once with one that needs only
// metadata.
var memConsumers = []string{"informer", "typed", "bridge", "bridge-meta"}

// memSecretConsumers are measured with Secrets cached (-memory
// secrets:N): the plain dynamic informer, the bridge with a rule that
// delivers them redacted (its cache holds digests of the values), and the
// bridge with a rule that may deliver the values (allowSecretData, run with
// --allow-secret-data: its cache holds them, as every cache did before).
var memSecretConsumers = []string{"informer-secrets", "bridge-secrets", "bridge-secrets-allowed"}

// memPhase is one namespace filled with one kind of object, measured at
// each count by its consumers.
type memPhase struct {
	ns        string
	what      string
	counts    []int
	consumers []string
	fill      func(ctx context.Context, cs kubernetes.Interface, ns string, from, to, workers int) error
}

// memoryPhases parses the -memory spec: counts of ConfigMaps ("10000") and
// of Secrets ("secrets:20000"), comma-separated. Each kind given is
// measured empty first.
func memoryPhases(spec string) ([]memPhase, error) {
	cms := memPhase{ns: "bench-memory", what: "ConfigMaps", consumers: memConsumers, fill: fill}
	secrets := memPhase{ns: "bench-memory-secrets", what: "Secrets", consumers: memSecretConsumers, fill: fillSecrets}
	for _, s := range strings.Split(spec, ",") {
		s = strings.TrimSpace(s)
		p := &cms
		if rest, ok := strings.CutPrefix(s, "secrets:"); ok {
			s, p = rest, &secrets
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-memory: %q is not a count (N or secrets:N)", s)
		}
		p.counts = append(p.counts, n)
	}
	var out []memPhase
	for _, p := range []memPhase{cms, secrets} {
		if len(p.counts) > 0 {
			p.counts = slices.Compact(slices.Sorted(slices.Values(append(p.counts, 0))))
			out = append(out, p)
		}
	}
	return out, nil
}

// memoryRuns fills a namespace per kind of object to each count in spec
// (and measures it empty first), measuring every consumer of the kind runs
// times at each count.
func (b *bed) memoryRuns(spec string, runs int) ([]memResult, error) {
	ctx := context.Background()
	phases, err := memoryPhases(spec)
	if err != nil {
		return nil, err
	}
	var out []memResult
	for _, p := range phases {
		if err := b.namespace(ctx, p.ns); err != nil {
			return nil, err
		}
		have := 0
		for _, n := range p.counts {
			if n > have {
				log.Printf("memory: creating %s %d to %d", p.what, have, n)
				if err := p.fill(ctx, b.cs, p.ns, have, n, b.workers); err != nil {
					return nil, err
				}
				have = n
			}
			for r := 1; r <= runs; r++ {
				for _, c := range p.consumers {
					m := memResult{Consumer: c, Objects: n, Run: r}
					var err error
					if strings.HasPrefix(c, "bridge") {
						err = b.bridgeMemory(p.ns, &m)
					} else {
						err = b.informerMemory(p.ns, &m)
					}
					if err != nil {
						return nil, fmt.Errorf("memory %s at %d: %w", c, n, err)
					}
					log.Printf("memory run %d %-22s %6d objects: heap %6.1f MiB, rss %6.1f MiB", r, c, n, mib(m.HeapBytes), mib(m.RSSBytes))
					out = append(out, m)
				}
			}
		}
	}
	return out, nil
}

// secretPayload is a Secret's data as users' Secrets often hold it: a
// 4 KiB blob (a certificate chain, a Helm release's manifest) and a few
// small entries. Values are random, as secrets are: nothing compresses or
// repeats across objects.
func secretPayload(rng *rand.Rand) map[string][]byte {
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	return map[string][]byte{"tls.crt": random(4096), "username": random(12), "password": random(24), "api-key": random(32)}
}

// fillSecrets creates Secrets from..to-1 in ns (for the memory runs).
func fillSecrets(ctx context.Context, cs kubernetes.Interface, ns string, from, to, workers int) error {
	return createAll(ctx, from, to, workers, func(i int) error {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: objectName(i), Labels: map[string]string{"app": "bench"}},
			Type: corev1.SecretTypeOpaque, Data: secretPayload(rand.New(rand.NewPCG(uint64(i), 1)))}
		_, err := cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
		return err
	})
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (b *bed) informerMemory(ns string, m *memResult) error {
	args := []string{"watch", "-memory", "-kubeconfig", b.kubeconfig, "-namespace", ns}
	switch m.Consumer {
	case "typed":
		args = append(args, "-typed")
	case "informer-secrets":
		args = append(args, "-resource", "secrets")
	case "informer-strip":
		args = append(args, "-strip-managed-fields")
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
	resource, more, flags := "configmaps", "", []string(nil)
	switch m.Consumer {
	case "bridge-meta":
		more = "\n    include: [metadata]"
	case "bridge-secrets":
		resource = "secrets"
	case "bridge-secrets-allowed":
		resource, more, flags = "secrets", "\n    allowSecretData: true", []string{"--allow-secret-data"}
	}
	cfg := fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: bench
sinks:
  - name: out
    file: {path: %s, maxSizeMB: 4096}
rules:
  - name: bench
    resource: v1/%s
    namespaces: [%s]
    sinks: [out]%s
`, file, resource, ns, more)
	p, err := b.startBridge(name, cfg, true, flags...)
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

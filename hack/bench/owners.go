package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The -owners phase: what include: [owners] costs. N Pods in chains made
// by hand (no controller-manager, no kubelet: a Deployment, its
// ReplicaSet, podsPerReplicaSet Pods), and a bridge with one rule on the
// Pods, without owners ("pods") and with them ("pods-owners", which also
// caches the ReplicaSets' and Deployments' metadata, and the other
// workload kinds', empty here). Each run measures both in turn: the cold
// start until every Pod is delivered (CPU, time), the memory once settled
// (heap after GC, RSS), and -owners-updates Pod updates (CPU per update:
// one notification each, owners resolved once per notification).
const podsPerReplicaSet = 10

var ownersConsumers = []string{"pods", "pods-owners"}

// ownersResult is one consumer's run of the owners phase.
type ownersResult struct {
	Consumer      string  `json:"consumer"`
	Run           int     `json:"run"`
	Pods          int     `json:"pods"`
	ColdSeconds   float64 `json:"coldSeconds"` // start to every Pod delivered
	ColdCPU       float64 `json:"coldCPUSeconds"`
	HeapBytes     int64   `json:"heapBytes"` // settled, after GC
	RSSBytes      int64   `json:"rssBytes"`
	Updates       int     `json:"updates"`
	UpdateSeconds float64 `json:"updateSeconds"` // first patch to the last update delivered
	UpdateCPU     float64 `json:"updateCPUSeconds"`
	Incomplete    float64 `json:"incomplete"` // kubebridge_owners_incomplete_total (must be 0)
}

func (r ownersResult) String() string {
	return fmt.Sprintf("owners run %d %-11s %6d pods: cold %6.2fs cpu %6.2fs (%5.1f µs/pod), heap %6.1f MiB, rss %6.1f MiB; %d updates in %6.2fs, cpu %5.2fs (%5.1f µs/update), incomplete %v",
		r.Run, r.Consumer, r.Pods, r.ColdSeconds, r.ColdCPU, r.ColdCPU/float64(r.Pods)*1e6, mib(r.HeapBytes), mib(r.RSSBytes),
		r.Updates, r.UpdateSeconds, r.UpdateCPU, r.UpdateCPU/float64(max(r.Updates, 1))*1e6, r.Incomplete)
}

const ownersNS = "bench-owners"

// ownersRuns creates the chains, then measures each consumer o.runs times.
func (b *bed) ownersRuns(o options) ([]ownersResult, error) {
	ctx := context.Background()
	if err := b.namespace(ctx, ownersNS); err != nil {
		return nil, err
	}
	n := o.owners
	sets := (n + podsPerReplicaSet - 1) / podsPerReplicaSet
	log.Printf("owners: creating %d Deployments, %d ReplicaSets, %d Pods", sets, sets, n)
	rsUID := make([]types.UID, sets)
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}}
	yes := true
	err := createAll(ctx, 0, sets, b.workers, func(i int) error {
		name := fmt.Sprintf("app-%05d", i)
		sel := map[string]string{"app": name}
		tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: spec}
		d, err := b.cs.AppsV1().Deployments(ownersNS).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%20)}},
			Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tmpl}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		rs, err := b.cs.AppsV1().ReplicaSets(ownersNS).Create(ctx, &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-6d4", Labels: sel, OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: &yes}}},
			Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tmpl}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		rsUID[i] = rs.UID
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = createAll(ctx, 0, n, b.workers, func(i int) error {
		set := i / podsPerReplicaSet
		rs := fmt.Sprintf("app-%05d-6d4", set)
		_, err := b.cs.CoreV1().Pods(ownersNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%d", rs, i%podsPerReplicaSet), Labels: map[string]string{"app": fmt.Sprintf("app-%05d", set)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs, UID: rsUID[set], Controller: &yes}}},
			Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []ownersResult
	for r := 1; r <= o.runs; r++ {
		for _, c := range ownersConsumers {
			m, err := b.ownersRun(ctx, c, r, n, o.ownersUpdates)
			if err != nil {
				return out, fmt.Errorf("owners run %d, %s: %w", r, c, err)
			}
			log.Print(m)
			out = append(out, m)
		}
	}
	return out, nil
}

// ownersRun measures one consumer once, from a fresh checkpoint.
func (b *bed) ownersRun(ctx context.Context, consumer string, run, n, updates int) (ownersResult, error) {
	m := ownersResult{Consumer: consumer, Run: run, Pods: n, Updates: updates}
	name := fmt.Sprintf("owners-%s-%d", consumer, run)
	file := filepath.Join(b.dir, name+".jsonl")
	defer os.Remove(file)
	defer os.Remove(filepath.Join(b.dir, name+".checkpoint"))
	include := "[object]"
	if consumer == "pods-owners" {
		include = "[object, owners]"
	}
	cfg := fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: bench
sinks:
  - name: out
    file: {path: %s, maxSizeMB: 4096}
rules:
  - name: pods
    resource: v1/pods
    namespaces: [%s]
    include: %s
    sinks: [out]
`, file, ownersNS, include)
	p, err := b.startBridge(name, cfg, true)
	if err != nil {
		return m, err
	}
	defer p.kill()
	pid := p.cmd.Process.Pid
	delivered := func(want int, within time.Duration) error {
		return p.waitAtLeast(`kubebridge_sink_delivered_total{sink="out"}`, float64(want), within)
	}
	if err := delivered(n, 10*time.Minute); err != nil {
		return m, err
	}
	m.ColdSeconds, m.ColdCPU = time.Since(p.started).Seconds(), procCPU(pid)
	time.Sleep(2 * time.Second) // a checkpoint flush
	if err := p.collectGarbage(); err != nil {
		return m, err
	}
	heap, err := p.metric("go_memstats_heap_alloc_bytes ")
	if err != nil {
		return m, err
	}
	m.HeapBytes, m.RSSBytes = int64(heap), rss(pid)

	cpu0, start := procCPU(pid), time.Now()
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{"rev":%q}}}`, name))
	err = createAll(ctx, 0, updates, b.workers, func(i int) error {
		pod := fmt.Sprintf("app-%05d-6d4-%d", (i%n)/podsPerReplicaSet, i%podsPerReplicaSet)
		_, err := b.cs.CoreV1().Pods(ownersNS).Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return m, err
	}
	if err := delivered(n+updates, 10*time.Minute); err != nil {
		return m, err
	}
	m.UpdateSeconds, m.UpdateCPU = time.Since(start).Seconds(), procCPU(pid)-cpu0
	if consumer == "pods-owners" {
		if m.Incomplete, err = p.metric(`kubebridge_owners_incomplete_total{rule="pods"}`); err != nil {
			return m, err
		}
	}
	return m, p.stop()
}

// waitAtLeast waits until the metric is at least want.
func (p *bridgeProc) waitAtLeast(prefix string, want float64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		v, err := p.metric(prefix)
		if err == nil && v >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is %v, not %v, after %s (%v)", prefix, v, want, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ownersReport is the owners phase's table: medians per consumer, and the
// ratios of pods-owners to pods.
func ownersReport(rs []ownersResult) string {
	if len(rs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### include: [owners] on %d Pods (%d per ReplicaSet, one Deployment each), medians of %d runs\n\n", rs[0].Pods, podsPerReplicaSet, len(rs)/len(ownersConsumers))
	b.WriteString("| rule | cold start | cold CPU | CPU per Pod listed | heap | RSS | CPU per update | incomplete |\n|---|---|---|---|---|---|---|---|\n")
	med := map[string][6]float64{}
	for _, c := range ownersConsumers {
		var of []ownersResult
		for _, r := range rs {
			if r.Consumer == c {
				of = append(of, r)
			}
		}
		v := [6]float64{
			medianOf(of, func(r ownersResult) float64 { return r.ColdSeconds }),
			medianOf(of, func(r ownersResult) float64 { return r.ColdCPU }),
			medianOf(of, func(r ownersResult) float64 { return r.ColdCPU / float64(r.Pods) * 1e6 }),
			medianOf(of, func(r ownersResult) float64 { return mib(r.HeapBytes) }),
			medianOf(of, func(r ownersResult) float64 { return mib(r.RSSBytes) }),
			medianOf(of, func(r ownersResult) float64 { return r.UpdateCPU / float64(max(r.Updates, 1)) * 1e6 }),
		}
		med[c] = v
		fmt.Fprintf(&b, "| %s | %.2f s | %.2f s | %.1f µs | %.1f MiB | %.1f MiB | %.1f µs | %v |\n", c, v[0], v[1], v[2], v[3], v[4], v[5],
			medianOf(of, func(r ownersResult) float64 { return r.Incomplete }))
	}
	p, o := med["pods"], med["pods-owners"]
	fmt.Fprintf(&b, "| owners / without | %.2f | %.2f | %.2f | %.2f (+%.1f MiB) | %.2f (+%.1f MiB) | %.2f | |\n",
		o[0]/p[0], o[1]/p[1], o[2]/p[2], o[3]/p[3], o[3]-p[3], o[4]/p[4], o[4]-p[4], o[5]/p[5])
	return b.String()
}

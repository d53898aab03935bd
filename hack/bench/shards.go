package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
)

// benchShards is the shard count of every sharded run (issue 23's 8).
const benchShards = 8

// shardSpace places an event's object in its shard, as the bridge does.
var shardSpace = shards.Space{N: benchShards, Key: shards.KeyUID}

// shardLeaseNS holds the replicas' Leases.
const shardLeaseNS = "default"

// handoverGuard is how long after a SIGKILL an event in the killed
// replica's shards is still taken for one it sent before (in flight in
// nats-server): the survivor cannot take a shard before its Lease expired.
const handoverGuard = 100 * time.Millisecond

// shardResults are the -shards phase's measurements.
type shardResults struct {
	Cold     []shardStart    `json:"cold"`
	Baseline []shardBaseline `json:"baseline"`
	Churn    []shardChurn    `json:"churn"`
	Handover []handover      `json:"handover"`
	// Final is the state the handover runs' consumer holds against the
	// cluster once their churn stopped.
	Final *handoverFinal `json:"final,omitempty"`
}

// replicaResult is one replica's part of a sharded run.
type replicaResult struct {
	Identity string `json:"identity"`
	// CPU and PeakRSS: until every object was delivered (cold); for the
	// churn, CPU is what the load cost it.
	CPU        float64 `json:"cpuSeconds"`
	PeakRSS    int64   `json:"peakRSSBytes"`
	Shards     int     `json:"shards"`     // held at the end
	MostShards int     `json:"mostShards"` // most held at once, sampled every shardSample
	Delivered  float64 `json:"delivered"`  // kubebridge_sink_delivered_total
	// Acquired, Released, Lost count its shard handovers.
	Acquired float64 `json:"acquired"`
	Released float64 `json:"released"`
	Lost     float64 `json:"lost"`
	Filtered bool    `json:"apiserverFiltered"` // kubebridge_shards_apiserver_filtered
}

// shardStart is one cold start of replicas on existing objects.
type shardStart struct {
	Gate     string `json:"gate"` // the apiserver's ShardedListAndWatch: on or off
	Replicas int    `json:"replicas"`
	Objects  int    `json:"objects"`
	Run      int    `json:"run"`
	// Seconds is from the first replica's start until the subscriber had
	// every object; BalancedSeconds until the replicas first held every
	// shard in fair shares.
	Seconds         float64 `json:"seconds"`
	BalancedSeconds float64 `json:"balancedSeconds"`
	Events          int     `json:"events"`
	Duplicates      int     `json:"duplicates"`
	// Types counts the unique events by type: a cold start sends each
	// object once, added.
	Types   map[string]int  `json:"types"`
	Members []replicaResult `json:"members"`
}

func (r shardStart) String() string {
	var cpu, rss, held []string
	for _, m := range r.Members {
		cpu = append(cpu, fmt.Sprintf("%.2f", m.CPU))
		rss = append(rss, fmt.Sprintf("%.0f", mib(m.PeakRSS)))
		held = append(held, fmt.Sprintf("%d (most %d, +%.0f -%.0f lost %.0f)", m.Shards, m.MostShards, m.Acquired, m.Released, m.Lost))
	}
	return fmt.Sprintf("shards gate %s run %d, %d replicas, %d objects: %d events %v (%d duplicates) in %.2fs (balanced after %.2fs); cpu s %s; peak rss MiB %s; shards %s",
		r.Gate, r.Run, r.Replicas, r.Objects, r.Events, r.Types, r.Duplicates, r.Seconds, r.BalancedSeconds,
		strings.Join(cpu, " "), strings.Join(rss, " "), strings.Join(held, ", "))
}

// shardBaseline is the bare informer's cold start on the same objects.
type shardBaseline struct {
	Gate string `json:"gate"`
	startResult
}

// shardChurn is the load generator's changes delivered by replicas that
// share the shards.
type shardChurn struct {
	Replicas   int             `json:"replicas"`
	Run        int             `json:"run"`
	Changes    int             `json:"changes"`
	Events     int             `json:"events"`
	Duplicates int             `json:"duplicates"`
	OutOfOrder int             `json:"outOfOrder"`
	Seconds    float64         `json:"seconds"` // first write to last new event
	Members    []replicaResult `json:"members"`
}

func (r shardChurn) perSecond() float64 { return float64(r.Events) / r.Seconds }

func (r shardChurn) cpu() float64 {
	var s float64
	for _, m := range r.Members {
		s += m.CPU
	}
	return s
}

func (r shardChurn) String() string {
	return fmt.Sprintf("shards churn run %d, %d replicas: %d/%d events in %.2fs = %.0f/s, cpu %.2fs all replicas, %d duplicates, %d out of order",
		r.Run, r.Replicas, r.Events, r.Changes, r.Seconds, r.perSecond(), r.cpu(), r.Duplicates, r.OutOfOrder)
}

// handover is one SIGKILL of one of two replicas under paced churn, every
// time since the kill.
type handover struct {
	Round  int    `json:"round"`
	Victim string `json:"victim"`
	Shards []int  `json:"shards"` // the victim's
	// DeliverSeconds: the first event of an object in one of the victim's
	// shards (after handoverGuard); OwnedSeconds: the survivor holds every
	// shard; ReadySeconds: and has reconciled them (/readyz).
	DeliverSeconds float64 `json:"deliverSeconds"`
	OwnedSeconds   float64 `json:"ownedSeconds"`
	ReadySeconds   float64 `json:"readySeconds"`
	// JoinSeconds is from the replacement's start until the two held the
	// shards in fair shares again, both ready.
	JoinSeconds float64 `json:"joinSeconds"`
}

func (h handover) String() string {
	return fmt.Sprintf("handover %d: %s killed holding shards %v; first event in them after %.2fs, survivor holds %d after %.2fs, ready after %.2fs; replacement balanced after %.2fs",
		h.Round, h.Victim, h.Shards, h.DeliverSeconds, benchShards, h.OwnedSeconds, h.ReadySeconds, h.JoinSeconds)
}

// handoverFinal is the handover runs' end: what their consumer holds
// against the cluster (all must be 0 but the counts).
type handoverFinal struct {
	Churned    int64 `json:"churned"` // names created and deleted
	Events     int   `json:"events"`
	Duplicates int   `json:"duplicates"`
	// DeletedAgain counts deletions of an object received after one of its
	// deletions under another id (sent again by the shard's next owner);
	// OutOfOrder the other first deliveries older than one before.
	DeletedAgain int `json:"deletedAgain"`
	OutOfOrder   int `json:"outOfOrder"`
	Missing      int `json:"missing"`
	Extra        int `json:"extra"`
	Stale        int `json:"stale"`
}

// shardGates parses -shard-gates: on, off or both.
func shardGates(spec string) ([]string, error) {
	var gates []string
	for _, g := range strings.Split(spec, ",") {
		if g = strings.TrimSpace(g); g != "on" && g != "off" {
			return nil, fmt.Errorf("-shard-gates: %q is not on or off", g)
		}
		if !slices.Contains(gates, g) {
			gates = append(gates, g)
		}
	}
	return gates, nil
}

// shardRuns measures, for each apiserver setting in turn on its own
// control plane (the bench's own keeps its gates): the cold starts of
// every replica count on the same o.shards ConfigMaps with the bare
// informer's, then, with the gate on, the churn and the handovers.
func (b *bed) shardRuns(o options) (res shardResults, err error) {
	counts, err := parseCounts("shard-replicas", o.shardReplicas)
	if err != nil {
		return res, err
	}
	gates, err := shardGates(o.shardGates)
	if err != nil {
		return res, err
	}
	for _, gate := range gates {
		if err := b.shardGate(o, gate, counts, &res); err != nil {
			return res, fmt.Errorf("shards, gate %s: %w", gate, err)
		}
	}
	return res, nil
}

// shardGate runs the phase's measurements against one apiserver setting.
func (b *bed) shardGate(o options, gate string, counts []int, res *shardResults) error {
	sb, stop, err := b.shardBed(o, gate)
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	const ns = "bench-shards"
	if err := sb.namespace(ctx, ns); err != nil {
		return err
	}
	t0 := time.Now()
	if err := fill(ctx, sb.cs, ns, 0, o.shards, sb.workers); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	log.Printf("shards, gate %s: created %d ConfigMaps in %.1fs", gate, o.shards, time.Since(t0).Seconds())
	for r := 1; r <= o.runs; r++ {
		m, err := sb.coldBaseline("baseline", ns, o.shards, r)
		if err != nil {
			return fmt.Errorf("baseline run %d: %w", r, err)
		}
		log.Print(m)
		res.Baseline = append(res.Baseline, shardBaseline{Gate: gate, startResult: m})
		for _, n := range counts {
			m, err := sb.shardCold(gate, ns, n, o.shards, r)
			if err != nil {
				return fmt.Errorf("cold run %d, %d replicas: %w", r, n, err)
			}
			log.Print(m)
			res.Cold = append(res.Cold, m)
		}
	}
	if gate != "on" {
		return nil
	}
	for r := 1; r <= o.runs && o.shardChurnN > 0; r++ {
		for _, n := range []int{1, 2} {
			m, err := sb.shardChurn(n, o.shardChurnN, r)
			if err != nil {
				return fmt.Errorf("churn run %d, %d replicas: %w", r, n, err)
			}
			log.Print(m)
			res.Churn = append(res.Churn, m)
		}
	}
	if o.shardHandovers > 0 {
		hs, final, err := sb.shardHandovers(o)
		res.Handover, res.Final = hs, final
		if err != nil {
			return fmt.Errorf("handovers: %w", err)
		}
	}
	return nil
}

// shardBed is the bed on a control plane of its own whose apiserver has
// ShardedListAndWatch on or off (with CBOR as -cbor says), and what
// stops that control plane.
func (b *bed) shardBed(o options, gate string) (*bed, func(), error) {
	tools, err := testenv.ToolsDir()
	if err != nil {
		return nil, nil, err
	}
	dir := filepath.Join(b.dir, "cp-shards-"+gate)
	opts := testenv.ControlPlaneOptions{FeatureGates: []string{"ShardedListAndWatch=" + strconv.FormatBool(gate == "on")}}
	if o.cbor {
		opts.FeatureGates = append(opts.FeatureGates, "CBORServingAndStorage=true")
	}
	log.Printf("shards, gate %s: starting etcd and kube-apiserver --feature-gates=%s", gate, strings.Join(opts.FeatureGates, ","))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, nil, err
	}
	cp, err := testenv.NewControlPlaneWithOptions(tools, dir, opts)
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		if err := cp.Stop(); err != nil {
			log.Printf("shards, gate %s: stopping the control plane: %v", gate, err)
		}
	}
	sb := *b
	if sb.kubeconfig, err = cp.Kubeconfig(dir); err != nil {
		stop()
		return nil, nil, err
	}
	rc := cp.RESTConfig()
	rc.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	if sb.cs, err = kubernetes.NewForConfig(rc); err != nil {
		stop()
		return nil, nil, err
	}
	return &sb, stop, nil
}

// shardConfig is the replicas' config: the rule on ns into JetStream
// (the KV checkpoint needs it) on the bench's stream, 8 shards by uid, the
// checkpoint in bucket.
func (b *bed) shardConfig(ns, bucket string) string {
	return strings.Replace(b.bridgeConfig("jetstream", ns, "", ""), "\nsinks:\n",
		fmt.Sprintf("\ncheckpoint: {natsKV: {sink: out, bucket: %s}}\nsharding: {shards: %d, key: uid}\nsinks:\n", bucket, benchShards), 1)
}

// dropShardState deletes a sharded run's KV bucket and empties the
// stream, keeping nats-server's store small across runs.
func (b *bed) dropShardState(bucket string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = b.js.DeleteKeyValue(ctx, bucket)
	if s, err := b.js.Stream(ctx, "BENCH"); err == nil {
		_ = s.Purge(ctx)
	}
}

// errExited is a replica's exit while it is measured.
var errExited = errors.New("a replica exited")

// waitAll waits until count (of c's receipts) reaches n; it fails when a
// replica exits, count did not grow for stall, or the deadline passed.
func waitAll(c *collector, count func() int, n int, ps []*bridgeProc, stall time.Duration, deadline time.Time) error {
	last, lastAt := count(), time.Now()
	for last < n {
		select {
		case <-c.arrived:
		case <-time.After(100 * time.Millisecond):
		}
		for _, p := range ps {
			select {
			case <-p.done:
				return fmt.Errorf("%w: see %s", errExited, p.log)
			default:
			}
		}
		now := time.Now()
		if u := count(); u != last {
			last, lastAt = u, now
		}
		if last < n && (now.Sub(lastAt) > stall || now.After(deadline)) {
			return fmt.Errorf("stalled at %d of %d", last, n)
		}
	}
	return nil
}

// launchReplica starts one replica of group (its Leases' prefix) without
// waiting for it, with the short Leases of the e2e tests.
func (b *bed) launchReplica(group, identity, cfg string) (*bridgeProc, error) {
	return b.launch(group+"-"+identity, cfg, "--identity", identity, "--log-level", "info",
		"--leader-elect-namespace", shardLeaseNS, "--leader-elect-name", group,
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms")
}

// launchReplicas starts n replicas of group at once, r1..rn.
func (b *bed) launchReplicas(group, cfg string, n int) ([]*bridgeProc, error) {
	var ps []*bridgeProc
	for i := 1; i <= n; i++ {
		p, err := b.launchReplica(group, "r"+strconv.Itoa(i), cfg)
		if err != nil {
			killAll(ps)
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func killAll(ps []*bridgeProc) {
	for _, p := range ps {
		p.kill()
	}
}

// stopAll stops the replicas with SIGTERM together, as a rollout would.
func stopAll(ps []*bridgeProc) error {
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.stop(); err != nil {
				errs[i] = fmt.Errorf("%w: see %s", err, p.log)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fairShares reports whether the held counts cover every shard in fair
// shares (each within one of the others).
func fairShares(held []int) bool {
	lo, hi := benchShards/len(held), (benchShards+len(held)-1)/len(held)
	total := 0
	for _, h := range held {
		if h < lo || h > hi {
			return false
		}
		total += h
	}
	return total == benchShards
}

// shardsOwned is a replica's kubebridge_shards_owned (-1: unreadable).
func (p *bridgeProc) shardsOwned() int {
	v, err := p.metric("kubebridge_shards_owned ")
	if err != nil {
		return -1
	}
	return int(v)
}

func (p *bridgeProc) isReady() bool {
	resp, err := http.Get(p.admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitBalanced waits until the replicas hold every shard in fair shares
// and are all ready.
func waitBalanced(ps []*bridgeProc, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		held := make([]int, len(ps))
		ready := true
		for i, p := range ps {
			select {
			case <-p.done:
				return fmt.Errorf("%w: see %s", errExited, p.log)
			default:
			}
			held[i] = p.shardsOwned()
			ready = ready && p.isReady()
		}
		if ready && fairShares(held) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the shards did not settle in fair shares within %v: held %v, all ready %v", within, held, ready)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shardSample is how often a cold start's replicas are asked how many
// shards they hold.
const shardSample = 250 * time.Millisecond

// shardWatch samples the replicas' shards held until stopped: the most
// each held at once, and when they first held them in fair shares.
type shardWatch struct {
	most     []int
	balanced time.Time
	stop     chan struct{}
	done     chan struct{}
}

func watchShards(ps []*bridgeProc) *shardWatch {
	w := &shardWatch{most: make([]int, len(ps)), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			held := make([]int, len(ps))
			for i, p := range ps {
				held[i] = p.shardsOwned()
				w.most[i] = max(w.most[i], held[i])
			}
			if w.balanced.IsZero() && fairShares(held) {
				w.balanced = time.Now()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(shardSample):
			}
		}
	}()
	return w
}

func (w *shardWatch) end() { close(w.stop); <-w.done }

// replicaState reads what a replica's metrics say of its part.
func replicaState(p *bridgeProc, identity string) replicaResult {
	m := replicaResult{Identity: identity, Shards: p.shardsOwned()}
	m.Delivered, _ = p.metric(`kubebridge_sink_delivered_total{sink="out"}`)
	m.Acquired, _ = p.metric(`kubebridge_shard_handovers_total{kind="acquired"}`)
	m.Released, _ = p.metric(`kubebridge_shard_handovers_total{kind="released"}`)
	m.Lost, _ = p.metric(`kubebridge_shard_handovers_total{kind="lost"}`)
	f, _ := p.metric("kubebridge_shards_apiserver_filtered ")
	m.Filtered = f == 1
	return m
}

// shardCold starts replicas replicas at once on a fresh KV bucket and new
// Leases, sharing ns's n ConfigMaps, and measures each until the
// subscriber has every object.
func (b *bed) shardCold(gate, ns string, replicas, n, run int) (shardStart, error) {
	res := shardStart{Gate: gate, Replicas: replicas, Objects: n, Run: run}
	c := newCollector()
	tr := &receiptTrace{start: time.Now(), byUID: map[string][]string{}}
	c.tap = tr.add
	closeSub, err := natsReceiver(b.natsURL, c)
	if err != nil {
		return res, err
	}
	defer closeSub()
	group := fmt.Sprintf("shards-%s-%d-%d", gate, replicas, run)
	defer b.dropShardState(group)
	ps, err := b.launchReplicas(group, b.shardConfig(ns, group), replicas)
	if err != nil {
		return res, err
	}
	defer killAll(ps)
	w := watchShards(ps)
	// Every object held (its last event not a deletion): not unique ids,
	// which a spurious deletion and its new added would count. A sharded
	// start waits for its informers' list before it takes shards: the
	// first event may come late.
	if err := waitAll(c, c.holding, n, ps, 3*time.Minute, time.Now().Add(20*time.Minute)); err != nil {
		if errors.Is(err, errExited) {
			w.end()
			return res, err
		}
		log.Printf("shards cold %s %d: %v", gate, replicas, err)
	}
	c.mu.Lock()
	done := c.lastNew
	c.mu.Unlock()
	for _, p := range ps { // CPU and memory first: the moment all were delivered
		pid := p.cmd.Process.Pid
		res.Members = append(res.Members, replicaResult{CPU: procCPU(pid), PeakRSS: procStatus(pid, "VmHWM:")})
	}
	for i, p := range ps {
		s := replicaState(p, "r"+strconv.Itoa(i+1))
		s.CPU, s.PeakRSS = res.Members[i].CPU, res.Members[i].PeakRSS
		res.Members[i] = s
	}
	w.end()
	started := ps[0].started
	for i := range res.Members {
		res.Members[i].MostShards = w.most[i]
	}
	if !w.balanced.IsZero() {
		res.BalancedSeconds = w.balanced.Sub(started).Seconds()
	}
	res.Seconds = done.Sub(started).Seconds()
	// What else arrives (a spurious deletion, its new added) is counted
	// too, until nothing came for a second.
	c.waitFor(math.MaxInt, time.Second, time.Now().Add(30*time.Second))
	c.mu.Lock()
	res.Events, res.Duplicates = len(c.ids), c.dups
	res.Types = map[string]int{}
	for t, l := range c.byType {
		res.Types[t] = len(l)
	}
	c.mu.Unlock()
	if res.Events != n {
		tr.repeated()
	}
	want := gate == "on"
	for _, m := range res.Members {
		if m.Filtered != want {
			log.Printf("shards cold %s %d: %s says kubebridge_shards_apiserver_filtered %v", gate, replicas, m.Identity, m.Filtered)
		}
	}
	return res, stopAll(ps)
}

// shardChurn starts replicas on an empty namespace, waits until they
// share the shards, and measures the load generator's n ConfigMaps
// created, updated and deleted as fast as the apiserver takes them.
func (b *bed) shardChurn(replicas, n, run int) (shardChurn, error) {
	res := shardChurn{Replicas: replicas, Run: run, Changes: 3 * n}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("bench-shards-churn-%d-%d", replicas, run)
	if err := b.namespace(ctx, ns); err != nil {
		return res, err
	}
	c := newCollector()
	closeSub, err := natsReceiver(b.natsURL, c)
	if err != nil {
		return res, err
	}
	defer closeSub()
	group := fmt.Sprintf("churn-%d-%d", replicas, run)
	defer b.dropShardState(group)
	ps, err := b.launchReplicas(group, b.shardConfig(ns, group), replicas)
	if err != nil {
		return res, err
	}
	defer killAll(ps)
	if err := waitBalanced(ps, 2*time.Minute); err != nil {
		return res, err
	}
	before := make([]float64, len(ps))
	for i, p := range ps {
		before[i] = procCPU(p.cmd.Process.Pid)
	}
	l := &load{cs: b.cs, ns: ns, n: n, workers: b.workers}
	start, err := l.run(ctx)
	if err != nil {
		return res, err
	}
	if err := waitAll(c, c.unique, res.Changes, ps, 30*time.Second, time.Now().Add(10*time.Minute)); err != nil {
		log.Printf("shards churn %d: %v", replicas, err)
	}
	for i, p := range ps {
		pid := p.cmd.Process.Pid
		s := replicaState(p, "r"+strconv.Itoa(i+1))
		s.CPU, s.PeakRSS = procCPU(pid)-before[i], procStatus(pid, "VmHWM:")
		res.Members = append(res.Members, s)
	}
	c.mu.Lock()
	res.Events, res.Duplicates, res.OutOfOrder = len(c.ids), c.dups, c.outOfOrder
	res.Seconds = c.lastNew.Sub(start).Seconds()
	c.mu.Unlock()
	return res, stopAll(ps)
}

// heldBy is the shards whose Lease in group names identity.
func (b *bed) heldBy(ctx context.Context, group, identity string) ([]int, error) {
	list, err := b.cs.CoordinationV1().Leases(shardLeaseNS).List(ctx, metav1.ListOptions{LabelSelector: shards.LabelGroup + "=" + group})
	if err != nil {
		return nil, err
	}
	var held []int
	for _, l := range list.Items {
		for i := range benchShards {
			if l.Name == shards.ShardLease(group, i) && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == identity {
				held = append(held, i)
			}
		}
	}
	slices.Sort(held)
	return held, nil
}

// firstIn is the first receipt of an event in some shards after a moment:
// the collector's tap offers it every receipt.
type firstIn struct {
	mu     sync.Mutex
	shards []bool
	after  time.Time
	at     time.Time // zero until seen
}

func (f *firstIn) arm(held []int, after time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shards = make([]bool, benchShards)
	for _, i := range held {
		f.shards[i] = true
	}
	f.after, f.at = after, time.Time{}
}

// offer takes a receipt: ids are <uid>.<tag>.<resourceVersion>.<type>.
func (f *firstIn) offer(id string, now time.Time) {
	uid, _, _ := strings.Cut(id, ".")
	shard := shardSpace.OfHash(shards.Hash(uid))
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shards != nil && f.shards[shard] && f.at.IsZero() && !now.Before(f.after) {
		f.at = now
	}
}

func (f *firstIn) seen() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.at
}

// handoverSettle is how long two balanced replicas deliver under the
// churn before one is killed.
const handoverSettle = 2 * time.Second

// shardHandovers runs two replicas under names created and deleted at
// o.shardHandoverRate per second and, o.shardHandovers times, SIGKILLs
// one of them (in turn) and times until its shards deliver again; then a
// replacement (a new identity, as a Deployment's pod) joins. Once the
// churn stopped, the state the consumer holds is compared with the
// cluster.
func (b *bed) shardHandovers(o options) ([]handover, *handoverFinal, error) {
	ctx := context.Background()
	const ns, group = "bench-shards-handover", "handover"
	if err := b.namespace(ctx, ns); err != nil {
		return nil, nil, err
	}
	c := newCollector()
	first := &firstIn{}
	tr := &receiptTrace{start: time.Now(), byUID: map[string][]string{}}
	c.tap = func(id string, now time.Time) {
		first.offer(id, now)
		tr.add(id, now)
	}
	closeSub, err := natsReceiver(b.natsURL, c)
	if err != nil {
		return nil, nil, err
	}
	defer closeSub()
	defer b.dropShardState(group)
	cfg := b.shardConfig(ns, group)
	live, err := b.launchReplicas(group, cfg, 2)
	if err != nil {
		return nil, nil, err
	}
	all := slices.Clone(live)
	defer func() { killAll(all) }()
	ids := []string{"r1", "r2"}
	if err := waitBalanced(live, 2*time.Minute); err != nil {
		return nil, nil, err
	}
	churnCtx, stopChurn := context.WithCancel(ctx)
	defer stopChurn()
	var created, deleted atomic.Int64
	churned := make(chan error, 1)
	go func() { churned <- churn(churnCtx, b, ns, o.shardHandoverRate, &created, &deleted) }()

	var out []handover
	for k := 1; k <= o.shardHandovers; k++ {
		if err := waitBalanced(live, time.Minute); err != nil {
			return out, nil, fmt.Errorf("round %d: %w", k, err)
		}
		time.Sleep(handoverSettle)
		v := (k - 1) % 2
		victim, survivor := live[v], live[1-v]
		h := handover{Round: k, Victim: ids[v]}
		if h.Shards, err = b.heldBy(ctx, group, ids[v]); err != nil {
			return out, nil, err
		}
		t0 := time.Now()
		first.arm(h.Shards, t0.Add(handoverGuard))
		victim.kill()
		tr.mark(fmt.Sprintf("SIGKILL %s holding %v", ids[v], h.Shards), t0)
		deadline := t0.Add(time.Minute)
		for h.DeliverSeconds == 0 || h.OwnedSeconds == 0 || h.ReadySeconds == 0 {
			if time.Now().After(deadline) {
				return out, nil, fmt.Errorf("round %d: after a minute: %+v (survivor holds %d): see %s", k, h, survivor.shardsOwned(), survivor.log)
			}
			if at := first.seen(); h.DeliverSeconds == 0 && !at.IsZero() {
				h.DeliverSeconds = at.Sub(t0).Seconds()
			}
			if h.OwnedSeconds == 0 && survivor.shardsOwned() == benchShards {
				h.OwnedSeconds = time.Since(t0).Seconds()
			}
			if h.OwnedSeconds > 0 && h.ReadySeconds == 0 && survivor.isReady() {
				h.ReadySeconds = time.Since(t0).Seconds()
			}
			time.Sleep(10 * time.Millisecond)
		}
		id := "r" + strconv.Itoa(k+2)
		joined := time.Now()
		p, err := b.launchReplica(group, id, cfg)
		if err != nil {
			return out, nil, err
		}
		tr.mark("start "+id, joined)
		all = append(all, p)
		live[v], ids[v] = p, id
		if err := waitBalanced(live, time.Minute); err != nil {
			return out, nil, fmt.Errorf("round %d, the replacement: %w", k, err)
		}
		h.JoinSeconds = time.Since(joined).Seconds()
		log.Print(h)
		out = append(out, h)
	}
	stopChurn()
	if err := <-churned; err != nil {
		return out, nil, fmt.Errorf("churn: %w", err)
	}
	tr.mark("churn stopped", time.Now())
	final := &handoverFinal{Churned: deleted.Load()}
	// The last deletions reach the consumer within a moment; a lost one
	// never does.
	settled := time.Now()
	var missing, extra, stale []string
	for {
		if missing, extra, stale, err = b.diffHeld(ctx, ns, c); err != nil {
			return out, nil, err
		}
		if len(missing)+len(extra)+len(stale) == 0 || time.Since(settled) > 30*time.Second {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	final.Missing, final.Extra, final.Stale = len(missing), len(extra), len(stale)
	c.mu.Lock()
	final.Events, final.Duplicates = len(c.ids), c.dups
	c.mu.Unlock()
	again, disordered := tr.classify()
	final.DeletedAgain, final.OutOfOrder = len(again), len(disordered)
	log.Printf("handovers: %d names churned, %d events, %d duplicates, %d deleted again under another id, %d out of order; in the end %d missing, %d deleted but held, %d stale",
		final.Churned, final.Events, final.Duplicates, final.DeletedAgain, final.OutOfOrder, final.Missing, final.Extra, final.Stale)
	if final.DeletedAgain+final.OutOfOrder+final.Missing+final.Extra+final.Stale > 0 {
		tr.dump(map[string][]string{"missing": missing, "deleted but held": extra, "stale": stale,
			"deleted again": again, "out of order": disordered})
	}
	return out, final, stopAll(live)
}

// receiptTrace keeps, for the handover runs, every receipt by uid and the
// moments of the kills and starts, to show what went wrong where the
// final check fails.
type receiptTrace struct {
	start time.Time
	mu    sync.Mutex
	byUID map[string][]string
	marks []string
}

func (t *receiptTrace) since(at time.Time) string {
	return fmt.Sprintf("+%.3fs", at.Sub(t.start).Seconds())
}

func (t *receiptTrace) add(id string, now time.Time) {
	uid, _, _ := strings.Cut(id, ".")
	t.mu.Lock()
	t.byUID[uid] = append(t.byUID[uid], id+" "+t.since(now))
	t.mu.Unlock()
}

func (t *receiptTrace) mark(what string, at time.Time) {
	t.mu.Lock()
	t.marks = append(t.marks, t.since(at)+" "+what)
	t.mu.Unlock()
}

// repeated logs what a cold start sent beyond one added per object: by
// shard, the objects sent deleted and the spans (since the first replica
// started) in which their first added, their deletion and their second
// added arrived, and one of them in full.
func (t *receiptTrace) repeated() {
	t.mu.Lock()
	defer t.mu.Unlock()
	type span struct{ lo, hi float64 }
	widen := func(s *span, x float64) {
		if s.lo == 0 || x < s.lo {
			s.lo = x
		}
		s.hi = max(s.hi, x)
	}
	byShard := map[int]int{}
	var added, deleted, again span
	example := ""
	for uid, rs := range t.byUID {
		if len(rs) < 2 {
			continue
		}
		byShard[shardSpace.OfHash(shards.Hash(uid))]++
		adds := 0
		for _, r := range rs {
			id, at, _ := strings.Cut(r, " ")
			x, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(at, "+"), "s"), 64)
			switch {
			case strings.HasSuffix(id, ".deleted"):
				widen(&deleted, x)
			case adds == 0:
				adds++
				widen(&added, x)
			default:
				widen(&again, x)
			}
		}
		if example == "" {
			example = strings.Join(rs, ", ")
		}
	}
	log.Printf("  objects sent more than once, by shard: %v; first added %.2f-%.2fs, deleted %.2f-%.2fs, added again %.2f-%.2fs after the start; e.g. %s",
		byShard, added.lo, added.hi, deleted.lo, deleted.hi, again.lo, again.hi, example)
}

// classify walks each object's first receipts of an id: the objects
// whose deletion came again under another id, and those with another
// first delivery older than one before it.
func (t *receiptTrace) classify() (again, disordered []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for uid, rs := range t.byUID {
		seen := map[string]bool{}
		c := newCollector()
		gone, twice := false, false
		for _, r := range rs {
			id, _, _ := strings.Cut(r, " ")
			if seen[id] {
				continue
			}
			seen[id] = true
			if strings.HasSuffix(id, ".deleted") {
				if gone {
					twice = true
					continue
				}
				gone = true
			}
			c.apply(id)
		}
		if twice {
			again = append(again, uid)
		}
		if c.outOfOrder > 0 {
			disordered = append(disordered, uid)
		}
	}
	return again, disordered
}

// dump logs the marks, then the receipts of up to 10 objects of each kind
// of failure.
func (t *receiptTrace) dump(failed map[string][]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	log.Printf("handovers, timeline: %s", strings.Join(t.marks, "; "))
	for kind, uids := range failed {
		for k, uid := range uids {
			if k == 10 {
				log.Printf("  ... %d more %s", len(uids)-k, kind)
				break
			}
			log.Printf("  %s: %s (shard %d): %s", kind, uid, shardSpace.OfHash(shards.Hash(uid)), strings.Join(t.byUID[uid], ", "))
		}
	}
}

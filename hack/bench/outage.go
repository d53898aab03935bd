package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outageSample is the bridge's memory at one moment of the outage.
type outageSample struct {
	T         float64 `json:"t"`              // seconds since the outage began
	Live      int64   `json:"liveObjects"`    // ConfigMaps in the namespace
	Churned   int64   `json:"namesChurned"`   // names created and deleted so far
	HeapInUse int64   `json:"heapInUseBytes"` // go_memstats_heap_inuse_bytes, as found
	HeapLive  int64   `json:"heapLiveBytes"`  // heap_alloc after a forced GC
	RSS       int64   `json:"rssBytes"`
	Queued    int64   `json:"queued"`    // the sink's queue depth
	Coalesced int64   `json:"coalesced"` // events merged on queue overflow so far
}

// outageResult is one outage run: the memory curve while the webhook
// answers 503 under churn, then the state its consumer holds once it
// recovered, compared with the cluster.
type outageResult struct {
	Run     int            `json:"run"`
	Seconds float64        `json:"seconds"` // the outage
	Rate    int            `json:"rate"`    // names created and deleted per second
	Live    int            `json:"live"`    // ConfigMaps that stay
	Samples []outageSample `json:"samples"`
	// RecoverySeconds is from the receiver's recovery until the state it
	// holds matched the cluster and the sink's queue was empty (or it gave
	// up waiting: nothing new arrived for recoveryStall).
	RecoverySeconds float64 `json:"recoverySeconds"`
	RuleEvents      string  `json:"ruleEvents,omitempty"` // the rule's events (-outage-events); empty: all
	Events          int     `json:"events"`               // unique events, the whole run
	Duplicates      int     `json:"duplicates"`
	OutOfOrder      int     `json:"outOfOrder"`
	// The final check: objects of the cluster the consumer does not hold,
	// objects it holds that are gone (a deletion lost), and objects held
	// at another resourceVersion than the cluster's.
	Missing int     `json:"missing"`
	Extra   int     `json:"extra"`
	Stale   int     `json:"stale"`
	CPU     float64 `json:"cpuSeconds"`
}

func (r outageResult) ok() bool {
	return r.Missing == 0 && r.Extra == 0 && r.Stale == 0 && r.OutOfOrder == 0
}

// heapGrowthPerName is the live heap's growth over the outage per name
// churned.
func (r outageResult) heapGrowthPerName() float64 {
	if len(r.Samples) < 2 {
		return 0
	}
	first, last := r.Samples[0], r.Samples[len(r.Samples)-1]
	if last.Churned == 0 {
		return 0
	}
	return float64(last.HeapLive-first.HeapLive) / float64(last.Churned)
}

func (r outageResult) String() string {
	last := r.Samples[len(r.Samples)-1]
	events := r.RuleEvents
	if events == "" {
		events = "all"
	}
	return fmt.Sprintf("outage run %d (events %s): %.0fs at %d names/s, %d names churned, %d queued at the end, live heap %.1f -> %.1f MiB (%.0f B per name), rss %.1f MiB; recovered in %.1fs: %d missing, %d deleted but held, %d stale, %d out of order, %d duplicates",
		r.Run, events, r.Seconds, r.Rate, last.Churned, last.Queued, mib(r.Samples[0].HeapLive), mib(last.HeapLive), r.heapGrowthPerName(), mib(last.RSS),
		r.RecoverySeconds, r.Missing, r.Extra, r.Stale, r.OutOfOrder, r.Duplicates)
}

// outageRun fills live ConfigMaps, has the bridge deliver them to a
// webhook with its default config, then makes the webhook answer 503 for
// o.outage while names are created and deleted at o.outageRate per second,
// sampling the bridge's memory; then the webhook recovers and the state
// its events build is compared with the cluster's.
func (b *bed) outageRun(o options, run int) (outageResult, error) {
	res := outageResult{Run: run, Seconds: o.outage.Seconds(), Rate: o.outageRate, Live: o.outageLive}
	if o.outageRate <= 0 || o.outageLive < 0 || o.outageSample <= 0 {
		return res, fmt.Errorf("-outage-rate and -outage-sample must be positive, -outage-live not negative")
	}
	ctx := context.Background()
	ns := fmt.Sprintf("bench-outage-%d", run)
	if err := b.namespace(ctx, ns); err != nil {
		return res, err
	}
	if err := fill(ctx, b.cs, ns, 0, o.outageLive, b.workers); err != nil {
		return res, fmt.Errorf("fill: %w", err)
	}
	col := newCollector()
	h := webhookReceiver(col)
	defer h.Close()
	cfg := ruleConfig("webhook: {url: "+h.URL+"}", ns)
	partial := o.outageEvents != ""
	if partial {
		cfg = strings.Replace(cfg, "    sinks: [out]\n", "    events: ["+o.outageEvents+"]\n    sinks: [out]\n", 1)
	}
	res.RuleEvents = o.outageEvents
	p, err := b.startBridge(ns, cfg, true)
	if err != nil {
		return res, err
	}
	defer p.kill()
	defer os.Remove(filepath.Join(b.dir, ns+".checkpoint"))
	if partial { // nothing to see: the view is recorded quietly
		if err := p.waitMetric(`kubebridge_sink_queue_depth{sink="out"}`, 0, time.Minute); err != nil {
			return res, fmt.Errorf("initial view: %w", err)
		}
	} else if !col.waitFor(o.outageLive, time.Minute, time.Time{}) {
		return res, fmt.Errorf("initial view: %d of %d delivered", col.unique(), o.outageLive)
	}

	h.status.Store(http.StatusServiceUnavailable)
	start := time.Now()
	var created, deleted atomic.Int64
	live := func() int64 { return int64(o.outageLive) + created.Load() - deleted.Load() }
	take := func() error {
		s, err := p.memory()
		if err != nil {
			return err
		}
		s.T, s.Live, s.Churned = time.Since(start).Seconds(), live(), deleted.Load()
		res.Samples = append(res.Samples, s)
		log.Printf("outage: t %4.0fs, %d live, %d churned, %d queued, %d coalesced, heap in use %.1f MiB, live heap %.1f MiB, rss %.1f MiB",
			s.T, s.Live, s.Churned, s.Queued, s.Coalesced, mib(s.HeapInUse), mib(s.HeapLive), mib(s.RSS))
		return nil
	}
	if err := take(); err != nil {
		return res, err
	}
	churnCtx, stopChurn := context.WithTimeout(ctx, o.outage)
	defer stopChurn()
	churned := make(chan error, 1)
	go func() { churned <- churn(churnCtx, b, ns, o.outageRate, &created, &deleted) }()
	tick := time.NewTicker(o.outageSample)
	defer tick.Stop()
sampling:
	for {
		select {
		case err := <-churned:
			if err != nil {
				return res, fmt.Errorf("churn: %w", err)
			}
			break sampling
		case <-tick.C:
			if err := take(); err != nil {
				stopChurn()
				<-churned
				return res, err
			}
		}
	}
	if err := take(); err != nil {
		return res, err
	}

	h.status.Store(0)
	recovered := time.Now()
	var miss, extra, stale int
	for {
		depth, err := p.metric(`kubebridge_sink_queue_depth{sink="out"}`)
		if err != nil {
			return res, err
		}
		if !partial {
			if miss, extra, stale, err = b.compareHeld(ctx, ns, col); err != nil {
				return res, err
			}
		}
		if depth == 0 && miss+extra+stale == 0 {
			break
		}
		col.mu.Lock()
		last := col.lastNew
		col.mu.Unlock()
		if time.Since(last) > recoveryStall && time.Since(recovered) > recoveryStall {
			log.Printf("outage: gave up waiting: %.0f queued, %d missing, %d deleted but held, %d stale", depth, miss, extra, stale)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.RecoverySeconds = time.Since(recovered).Seconds()
	res.Missing, res.Extra, res.Stale = miss, extra, stale
	res.CPU = procCPU(p.cmd.Process.Pid)
	if err := p.stop(); err != nil {
		return res, err
	}
	col.mu.Lock()
	res.Events, res.Duplicates, res.OutOfOrder = len(col.ids), col.dups, col.outOfOrder
	col.mu.Unlock()
	log.Print(res)
	return res, nil
}

// recoveryStall is how long the recovery waits without a new event: the
// retry backoff may wait up to 30 s (retry.maxInterval), so two of those.
const recoveryStall = 70 * time.Second

// compareHeld compares what the consumer holds (its events applied by uid)
// with the namespace's ConfigMaps.
func (b *bed) compareHeld(ctx context.Context, ns string, c *collector) (missing, extra, stale int, err error) {
	m, e, s, err := b.diffHeld(ctx, ns, c)
	return len(m), len(e), len(s), err
}

// diffHeld is compareHeld's uids: in the cluster but not held, held but
// gone, held at another resourceVersion.
func (b *bed) diffHeld(ctx context.Context, ns string, c *collector) (missing, extra, stale []string, err error) {
	list, err := b.cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	inCluster := make(map[string]bool, len(list.Items))
	for _, cm := range list.Items {
		uid := string(cm.UID)
		inCluster[uid] = true
		rv, held := c.held[uid]
		switch {
		case !held:
			missing = append(missing, uid)
		case rv != cm.ResourceVersion:
			stale = append(stale, uid)
		}
	}
	for uid := range c.held {
		if !inCluster[uid] {
			extra = append(extra, uid)
		}
	}
	return missing, extra, stale, nil
}

// memory samples the bridge's heap as it is, its live heap after a forced
// collection (it runs with profiling) and its resident set.
func (p *bridgeProc) memory() (outageSample, error) {
	var s outageSample
	inuse, err := p.metric("go_memstats_heap_inuse_bytes ")
	if err != nil {
		return s, err
	}
	if err := p.collectGarbage(); err != nil {
		return s, err
	}
	alloc, err := p.metric("go_memstats_heap_alloc_bytes ")
	if err != nil {
		return s, err
	}
	queued, err := p.metric(`kubebridge_sink_queue_depth{sink="out"}`)
	if err != nil {
		return s, err
	}
	coalesced, err := p.metric(`kubebridge_sink_coalesced_total{sink="out"}`)
	if err != nil {
		return s, err
	}
	s.HeapInUse, s.HeapLive, s.RSS = int64(inuse), int64(alloc), rss(p.cmd.Process.Pid)
	s.Queued, s.Coalesced = int64(queued), int64(coalesced)
	return s, nil
}

// churnLag is how long a churned name lives before it is deleted.
const churnLag = time.Second

// churn creates distinct names in ns at rate per second until ctx ends,
// and deletes each churnLag after its creation; once ctx ends it deletes
// the rest and returns.
func churn(ctx context.Context, b *bed, ns string, rate int, created, deleted *atomic.Int64) error {
	type pending struct {
		name string
		at   time.Time
	}
	workers := min(b.workers, 8)
	toDelete := make(chan pending, rate*int(churnLag/time.Second+2)+workers)
	cms := b.cs.CoreV1().ConfigMaps(ns)
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	start := time.Now()
	var next atomic.Int64
	var creators, deleters sync.WaitGroup
	for range workers {
		creators.Add(1)
		go func() {
			defer creators.Done()
			for {
				i := int(next.Add(1) - 1)
				due := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(due)):
				}
				cm := configMap(ns, i, 0)
				cm.Name = fmt.Sprintf("churn-%07d", i)
				// A create is not cancelled midway: its name must be deleted.
				if _, err := cms.Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
					fail(fmt.Errorf("create %s: %w", cm.Name, err))
					return
				}
				created.Add(1)
				toDelete <- pending{cm.Name, time.Now()}
			}
		}()
		deleters.Add(1)
		go func() {
			defer deleters.Done()
			for d := range toDelete {
				time.Sleep(time.Until(d.at.Add(churnLag)))
				if err := cms.Delete(context.Background(), d.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					fail(fmt.Errorf("delete %s: %w", d.name, err))
					continue
				}
				deleted.Add(1)
			}
		}()
	}
	creators.Wait()
	close(toDelete)
	deleters.Wait()
	return first
}

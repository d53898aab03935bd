package bridge

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubebridge/kubebridge/internal/version"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// AdminHandler serves the bridge's admin endpoints:
//
//	/healthz  200 while the process serves
//	/readyz   200 once the caches synced and the checkpoint was reconciled
//	/metrics  Prometheus metrics (per-sink counts, queue depth, latency, ...)
//	/replay   POST ?sink=S[&rule=R]: queue the full view to one sink
//
// It can be served before Start returns (readyz then says 503).
func (b *Bridge) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !b.started.Load() || !b.Ready() {
			http.Error(w, "not ready: caches syncing or checkpoint not reconciled", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(b.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/replay", b.serveReplay)
	return mux
}

// ReplayProgress is one line of a /replay response.
type ReplayProgress struct {
	Rule   string `json:"rule,omitempty"`
	Queued int    `json:"queued"`
	Done   bool   `json:"done,omitempty"`
	Error  string `json:"error,omitempty"`
}

// serveReplay reconciles the sink's rule views (or one rule's) and queues
// every object in them again as updated with kbreplay "resync", streaming
// progress as JSON lines.
func (b *Bridge) serveReplay(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	sink, ruleName := r.URL.Query().Get("sink"), r.URL.Query().Get("rule")
	s := b.sinkOf(sink)
	if s == nil || !b.started.Load() {
		http.Error(w, fmt.Sprintf("no running sink %q", sink), http.StatusNotFound)
		return
	}
	allRules, _ := b.snapshot()
	var rules []*filters.Rule
	for _, rule := range allRules {
		if (ruleName == "" || rule.Name == ruleName) && containsString(rule.Sinks, sink) {
			rules = append(rules, rule)
		}
	}
	if len(rules) == 0 {
		http.Error(w, fmt.Sprintf("no rule %q delivers to sink %q", ruleName, sink), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	total := 0
	for _, rule := range rules {
		n := b.reconcile(s, rule.Name, event.ReplayResync)
		total += n
		_ = enc.Encode(ReplayProgress{Rule: rule.Name, Queued: n})
		flush()
	}
	_ = enc.Encode(ReplayProgress{Queued: total, Done: true})
	b.logger.Info("replay queued", "sink", sink, "rule", ruleName, "events", total)
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// metrics is the bridge's Prometheus registry. Counters are read from the
// deliveries' own counts when scraped, so the hot path pays nothing for them.
type metrics struct {
	registry *prometheus.Registry
	latency  *prometheus.HistogramVec
}

func newMetrics(b *Bridge) *metrics {
	m := &metrics{registry: prometheus.NewRegistry()}
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kubebridge_delivery_latency_seconds",
		Help:    "From the bridge observing a change to the sink acknowledging its event.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"sink"})
	m.registry.MustRegister(m.latency, (*collector)(b), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

type collector Bridge

var (
	descEnqueued     = prometheus.NewDesc("kubebridge_sink_enqueued_total", "Events offered to the sink's queue.", []string{"sink"}, nil)
	descDelivered    = prometheus.NewDesc("kubebridge_sink_delivered_total", "Events the sink acknowledged.", []string{"sink"}, nil)
	descRetried      = prometheus.NewDesc("kubebridge_sink_retried_total", "Failed delivery attempts that were retried (batches).", []string{"sink"}, nil)
	descFailed       = prometheus.NewDesc("kubebridge_sink_failed_total", "Events the sink refused permanently.", []string{"sink"}, nil)
	descDeadLettered = prometheus.NewDesc("kubebridge_sink_dead_lettered_total", "Refused events written to the dead-letter.", []string{"sink"}, nil)
	descCoalesced    = prometheus.NewDesc("kubebridge_sink_coalesced_total", "Events merged into a pending event of the same object on queue overflow.", []string{"sink"}, nil)
	descDepth        = prometheus.NewDesc("kubebridge_sink_queue_depth", "Events queued or in flight.", []string{"sink"}, nil)
	descCapacity     = prometheus.NewDesc("kubebridge_sink_queue_capacity", "Events kept in order before coalescing starts.", []string{"sink"}, nil)
	descReceived     = prometheus.NewDesc("kubebridge_rule_received_total", "Notifications the rule evaluated.", []string{"rule"}, nil)
	descMatched      = prometheus.NewDesc("kubebridge_rule_matched_total", "Events the rule produced (received minus matched were filtered out).", []string{"rule"}, nil)
	descLag          = prometheus.NewDesc("kubebridge_checkpoint_lag", "Acknowledged changes not yet written to the checkpoint.", nil, nil)
	descLeader       = prometheus.NewDesc("kubebridge_leader", "1 while this replica delivers (the leader, or the only one).", nil, nil)
	descEvalErrors   = prometheus.NewDesc("kubebridge_rule_where_errors_total", "where evaluations that failed (the event was not delivered).", []string{"rule"}, nil)
	descSynced       = prometheus.NewDesc("kubebridge_informers_synced", "1 once every informer's cache has synced.", nil, nil)
	descBuild        = prometheus.NewDesc("kubebridge_build_info", "The build.", []string{"version", "commit"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	b := (*Bridge)(c)
	for _, d := range b.Deliveries() {
		s := d.Stats()
		ch <- prometheus.MustNewConstMetric(descEnqueued, prometheus.CounterValue, float64(s.Queue.Offered), d.Name)
		ch <- prometheus.MustNewConstMetric(descDelivered, prometheus.CounterValue, float64(s.Delivered), d.Name)
		ch <- prometheus.MustNewConstMetric(descRetried, prometheus.CounterValue, float64(s.Retried), d.Name)
		ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(s.Failed), d.Name)
		ch <- prometheus.MustNewConstMetric(descDeadLettered, prometheus.CounterValue, float64(s.DeadLettered), d.Name)
		ch <- prometheus.MustNewConstMetric(descCoalesced, prometheus.CounterValue, float64(s.Queue.Coalesced), d.Name)
		ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(s.Pending), d.Name)
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(s.Capacity), d.Name)
	}
	rules, _ := b.snapshot()
	for _, r := range rules {
		received, matched := r.Counts()
		ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(received), r.Name)
		ch <- prometheus.MustNewConstMetric(descMatched, prometheus.CounterValue, float64(matched), r.Name)
		ch <- prometheus.MustNewConstMetric(descEvalErrors, prometheus.CounterValue, float64(r.EvalErrors()), r.Name)
	}
	lag := 0
	if rec := b.recorder.Load(); rec != nil {
		lag = rec.Lag()
	}
	ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(lag))
	leader := 0.0
	if b.active.Load() != nil {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	synced := 0.0
	if b.Ready() {
		synced = 1
	}
	ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, synced)
	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, version.Version, version.Commit())
}

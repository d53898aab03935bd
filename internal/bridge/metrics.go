package bridge

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubebridge/kubebridge/internal/version"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// metrics is the bridge's Prometheus registry. Counters are read from the
// deliveries' own counts when scraped, so the hot path pays nothing for them.
type metrics struct {
	registry *prometheus.Registry
	latency  *prometheus.HistogramVec
}

// newLatency is the histogram deliveries observe (delivererOptions.Latency).
func newLatency() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kubebridge_delivery_latency_seconds",
		Help:    "From the bridge observing a change to the sink acknowledging its event.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"sink"})
}

// newMetrics registers latency and the bridge's collector, once b is
// built (registering collects).
func newMetrics(b *Bridge, latency *prometheus.HistogramVec) *metrics {
	m := &metrics{registry: prometheus.NewRegistry(), latency: latency}
	m.registry.MustRegister(m.latency, (*collector)(b), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// handler serves the registry (/metrics).
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

type collector Bridge

var (
	descEnqueued     = prometheus.NewDesc("kubebridge_sink_enqueued_total", "Events offered to the sink's queue.", []string{"sink"}, nil)
	descDelivered    = prometheus.NewDesc("kubebridge_sink_delivered_total", "Events the sink acknowledged.", []string{"sink"}, nil)
	descRetried      = prometheus.NewDesc("kubebridge_sink_retried_total", "Failed delivery attempts that were retried (batches).", []string{"sink"}, nil)
	descFailed       = prometheus.NewDesc("kubebridge_sink_failed_total", "Events the sink refused permanently.", []string{"sink"}, nil)
	descDeadLettered = prometheus.NewDesc("kubebridge_sink_dead_lettered_total", "Refused events written to the dead-letter.", []string{"sink"}, nil)
	descCoalesced    = prometheus.NewDesc("kubebridge_sink_coalesced_total", "Events merged into a pending event of the same object on queue overflow.", []string{"sink"}, nil)
	descCancelled    = prometheus.NewDesc("kubebridge_sink_cancelled_total", "Events that left the queue unsent because an object created and deleted while its added still waited cancelled out (two per object).", []string{"sink"}, nil)
	descLimit        = prometheus.NewDesc("kubebridge_sink_concurrency_limit", "Batches the sink may have in flight now (adaptive, or the fixed workers).", []string{"sink"}, nil)
	descInFlight     = prometheus.NewDesc("kubebridge_sink_requests_in_flight", "Batches being sent to the sink now.", []string{"sink"}, nil)
	descDepth        = prometheus.NewDesc("kubebridge_sink_queue_depth", "Events queued or in flight.", []string{"sink"}, nil)
	descCapacity     = prometheus.NewDesc("kubebridge_sink_queue_capacity", "Events kept in order before coalescing starts.", []string{"sink"}, nil)
	// Failure per object (internal/delivery parking).
	descParked     = prometheus.NewDesc("kubebridge_sink_parked_objects", "Objects whose delivery failed, waiting for their own retry (their later events held behind them); others flow meanwhile.", []string{"sink"}, nil)
	descParkedAge  = prometheus.NewDesc("kubebridge_sink_oldest_parked_seconds", "How long the oldest parked object has waited.", []string{"sink"}, nil)
	descThrottled  = prometheus.NewDesc("kubebridge_sink_throttled_objects", "Objects waiting out the sink's updateWindow: their change was sent, their next updates wait and coalesce until the window ends.", []string{"sink"}, nil)
	descFailing    = prometheus.NewDesc("kubebridge_sink_destination_failing", "1 while the destination fails as a whole and is probed one batch at a time.", []string{"sink"}, nil)
	descDestErrors = prometheus.NewDesc("kubebridge_sink_destination_errors_total", "Failed attempts that say the destination or the sink's config is wrong (retried, never dead-lettered), by reason: unauthorized, forbidden, not_found, gone, redirect, config.", []string{"sink", "reason"}, nil)
	descReceived   = prometheus.NewDesc("kubebridge_rule_received_total", "Notifications the rule evaluated.", []string{"rule"}, nil)
	descMatched    = prometheus.NewDesc("kubebridge_rule_matched_total", "Events the rule produced (received minus matched were filtered out).", []string{"rule"}, nil)
	descWaiting    = prometheus.NewDesc("kubebridge_rule_waiting", "1 while the rule waits for its resource: the cluster does not serve it (a CRD not installed) or its informer has not listed it yet.", []string{"rule"}, nil)
	descLag        = prometheus.NewDesc("kubebridge_checkpoint_lag", "Acknowledged changes not yet written to the checkpoint.", nil, nil)
	descLeader     = prometheus.NewDesc("kubebridge_leader", "1 while this replica delivers (the leader, or the only one).", nil, nil)
	descEvalErrors = prometheus.NewDesc("kubebridge_rule_where_errors_total", "where evaluations that failed (the event was not delivered).", []string{"rule"}, nil)
	descSynced     = prometheus.NewDesc("kubebridge_informers_synced", "1 once every informer's cache has synced.", nil, nil)
	descBuild      = prometheus.NewDesc("kubebridge_build_info", "The build.", []string{"version", "commit"}, nil)
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
		ch <- prometheus.MustNewConstMetric(descCancelled, prometheus.CounterValue, float64(s.Queue.Cancelled), d.Name)
		limit, inFlight := d.Concurrency()
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(limit), d.Name)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(inFlight), d.Name)
		ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(s.Pending), d.Name)
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(s.Capacity), d.Name)
		ch <- prometheus.MustNewConstMetric(descParked, prometheus.GaugeValue, float64(s.Parked), d.Name)
		ch <- prometheus.MustNewConstMetric(descParkedAge, prometheus.GaugeValue, s.OldestParked.Seconds(), d.Name)
		ch <- prometheus.MustNewConstMetric(descThrottled, prometheus.GaugeValue, float64(s.Throttled), d.Name)
		failing := 0.0
		if s.Failing {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(descFailing, prometheus.GaugeValue, failing, d.Name)
		for reason, n := range s.DestinationErrors {
			ch <- prometheus.MustNewConstMetric(descDestErrors, prometheus.CounterValue, float64(n), d.Name, reason)
		}
	}
	rules, in := b.snapshot()
	var waiting map[*filters.Rule]error
	if in != nil {
		waiting = in.Waiting()
	}
	for _, r := range rules {
		w := 0.0
		if waiting[r] != nil {
			w = 1
		}
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, w, r.Name)
		received, matched := r.Counts()
		ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(received), r.Name)
		ch <- prometheus.MustNewConstMetric(descMatched, prometheus.CounterValue, float64(matched), r.Name)
		ch <- prometheus.MustNewConstMetric(descEvalErrors, prometheus.CounterValue, float64(r.EvalErrors()), r.Name)
	}
	ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(b.deliver.lag()))
	leader := 0.0
	if b.deliver.delivering() {
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

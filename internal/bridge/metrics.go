package bridge

import (
	"net/http"
	"reflect"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/internal/version"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/sinks"
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
	descCoalesced    = prometheus.NewDesc("kubebridge_sink_coalesced_total", "Events merged into a pending event of the same object: on queue overflow, into a retry or an update window.", []string{"sink"}, nil)
	descCancelled    = prometheus.NewDesc("kubebridge_sink_cancelled_total", "Events that left the queue unsent because an object created and deleted while its added still waited cancelled out (two per object).", []string{"sink"}, nil)
	descLimit        = prometheus.NewDesc("kubebridge_sink_concurrency_limit", "Batches the sink may have in flight now (adaptive, or the fixed workers).", []string{"sink"}, nil)
	descInFlight     = prometheus.NewDesc("kubebridge_sink_requests_in_flight", "Batches being sent to the sink now.", []string{"sink"}, nil)
	descDepth        = prometheus.NewDesc("kubebridge_sink_queue_depth", "Events queued or in flight.", []string{"sink"}, nil)
	descCapacity     = prometheus.NewDesc("kubebridge_sink_queue_capacity", "Events kept in order before coalescing starts.", []string{"sink"}, nil)
	// Failure per object (internal/delivery parking).
	descParked           = prometheus.NewDesc("kubebridge_sink_parked_objects", "Objects whose delivery failed, waiting for their own retry (their later events held behind them); others flow meanwhile.", []string{"sink"}, nil)
	descParkedAge        = prometheus.NewDesc("kubebridge_sink_oldest_parked_seconds", "How long the oldest parked object has waited.", []string{"sink"}, nil)
	descMuteWhereErrors  = prometheus.NewDesc("kubebridge_sink_mute_where_errors_total", "Events whose mute.where failed to evaluate (or gave no bool), e.g. a label the object lacks: each was held as if it matched.", []string{"sink"}, nil)
	descHeld             = prometheus.NewDesc("kubebridge_sink_held_events", "Events the sink's mute holds now (coalesced per object; sent when the window ends).", []string{"sink"}, nil)
	descThrottled        = prometheus.NewDesc("kubebridge_sink_throttled_objects", "Objects (or updateWindow keys) waiting out the sink's updateWindow: their change was sent, their next updates wait and coalesce until the window ends.", []string{"sink"}, nil)
	descWindowOverflow   = prometheus.NewDesc("kubebridge_sink_window_overflow_total", "Messages of an updateWindow key sent without a window, because updateWindow.maxKeys keys were waiting: sent as they came, none dropped.", []string{"sink"}, nil)
	descWindowKeyErrors  = prometheus.NewDesc("kubebridge_sink_window_key_errors_total", "Objects whose updateWindow.key failed to evaluate (or was not a string): each waits out a window of its own.", []string{"sink"}, nil)
	descFailing          = prometheus.NewDesc("kubebridge_sink_destination_failing", "1 while the destination fails as a whole and is probed one batch at a time.", []string{"sink"}, nil)
	descDestErrors       = prometheus.NewDesc("kubebridge_sink_destination_errors_total", "Failed attempts that say the destination or the sink's config is wrong (retried, never dead-lettered), by reason: unauthorized, forbidden, not_found, gone, redirect, config.", []string{"sink", "reason"}, nil)
	descOwnersIncomplete = prometheus.NewDesc("kubebridge_owners_incomplete_total", "Notifications of a rule that includes owners whose owner chain (or Event's involved object) was not all in the bridge's caches (after the wait, where one was worth it): sent with the missing owner named from its reference, without labels.", []string{"rule"}, nil)
	descReceived         = prometheus.NewDesc("kubebridge_rule_received_total", "Notifications the rule evaluated.", []string{"rule"}, nil)
	descMatched          = prometheus.NewDesc("kubebridge_rule_matched_total", "Events the rule produced (received minus matched were filtered out).", []string{"rule"}, nil)
	descWaiting          = prometheus.NewDesc("kubebridge_rule_waiting", "1 while the rule waits for its resource: the cluster does not serve it (a CRD not installed) or its informer has not listed it yet.", []string{"rule"}, nil)
	descLag              = prometheus.NewDesc("kubebridge_checkpoint_lag", "Acknowledged changes not yet written to the checkpoint.", nil, nil)
	descLeader           = prometheus.NewDesc("kubebridge_leader", "1 while this replica delivers (the leader, the only one, or a holder of shards).", nil, nil)
	// Sharding.
	descShardsOwned    = prometheus.NewDesc("kubebridge_shards_owned", "Shards this replica holds and delivers.", nil, nil)
	descShardsLapsed   = prometheus.NewDesc("kubebridge_shards_lapsed", "Shards held whose lease renewal is overdue: nothing is sent for them until it is renewed (or another replica takes them).", nil, nil)
	descShardMembers   = prometheus.NewDesc("kubebridge_shard_members", "Live replicas sharing the shards, as this one sees them (itself included).", nil, nil)
	descShardHandovers = prometheus.NewDesc("kubebridge_shard_handovers_total", "Shards this replica took (acquired), gave back (released), lost (another replica took its lease), holds that lapsed (a renewal overdue: fenced, queue kept) and of those resumed (renewed with nobody having written the lease meanwhile), and attempts to start delivering a shard held that failed and are retried (failed).", []string{"kind"}, nil)
	descCached         = prometheus.NewDesc("kubebridge_informer_cached_objects", "Objects in an informer's cache (with sharding filtered by the apiserver: this replica's shards only).", []string{"informer"}, nil)
	descShardPending   = prometheus.NewDesc("kubebridge_shard_pending_events", "Events of a held shard queued or in flight, all its sinks together.", []string{"shard"}, nil)
	descShardLag       = prometheus.NewDesc("kubebridge_shard_checkpoint_lag", "Acknowledged changes of a held shard not yet written to the checkpoint.", []string{"shard"}, nil)
	descShardFiltered  = prometheus.NewDesc("kubebridge_shards_apiserver_filtered", "1 when the apiserver lists and watches only this replica's shards (ShardedListAndWatch), 0 when the replica filters every object itself.", nil, nil)
	descFenceRefusals  = prometheus.NewDesc("kubebridge_sink_fence_refusals_total", "Writes the sink's destination refused because another writer wrote the object meanwhile (JetStream publish expectations): the sink's own retries after adopting what it found, and late writes of a replica that had given the object up, which must not land.", []string{"sink"}, nil)
	descTruncated      = prometheus.NewDesc("kubebridge_sink_truncated_total", "Events the sink's destination holds as a marker that names the object, because the event was larger than the destination takes (a mirror's bucket); the object's next state that fits replaces it.", []string{"sink"}, nil)
	descWithheld       = withheldDescs()
	descGroupErrors    = prometheus.NewDesc("kubebridge_sink_digest_group_errors_total", "Events whose digest.groupBy failed to evaluate (e.g. a label the object lacks): each went in the digest's default group.", []string{"sink"}, nil)
	descEvalErrors     = prometheus.NewDesc("kubebridge_rule_where_errors_total", "where evaluations that failed (the event was not delivered).", []string{"rule"}, nil)
	descRouteDefaulted = prometheus.NewDesc("kubebridge_rule_route_defaulted_total", "Evaluations of a rule's route that chose its default sink, by reason: the expression named a sink that is not one of the rule's (undeclared), or failed or gave no string, e.g. a label the namespace lacks (failed).", []string{"rule", "reason"}, nil)
	descSynced         = prometheus.NewDesc("kubebridge_informers_synced", "1 once every informer's cache has synced.", nil, nil)
	descBuild          = prometheus.NewDesc("kubebridge_build_info", "The build.", []string{"version", "commit"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	b := (*Bridge)(c)
	for _, s := range sinkTotals(b.Deliveries()) {
		name := s.name
		ch <- prometheus.MustNewConstMetric(descEnqueued, prometheus.CounterValue, float64(s.Queue.Offered), name)
		ch <- prometheus.MustNewConstMetric(descDelivered, prometheus.CounterValue, float64(s.Delivered), name)
		ch <- prometheus.MustNewConstMetric(descRetried, prometheus.CounterValue, float64(s.Retried), name)
		ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(s.Failed), name)
		ch <- prometheus.MustNewConstMetric(descDeadLettered, prometheus.CounterValue, float64(s.DeadLettered), name)
		ch <- prometheus.MustNewConstMetric(descCoalesced, prometheus.CounterValue, float64(s.Queue.Coalesced), name)
		ch <- prometheus.MustNewConstMetric(descCancelled, prometheus.CounterValue, float64(s.Queue.Cancelled), name)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(s.limit), name)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.inFlight), name)
		ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(s.Pending), name)
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(s.Capacity), name)
		ch <- prometheus.MustNewConstMetric(descParked, prometheus.GaugeValue, float64(s.Parked), name)
		ch <- prometheus.MustNewConstMetric(descParkedAge, prometheus.GaugeValue, s.OldestParked.Seconds(), name)
		ch <- prometheus.MustNewConstMetric(descThrottled, prometheus.GaugeValue, float64(s.Throttled), name)
		ch <- prometheus.MustNewConstMetric(descWindowOverflow, prometheus.CounterValue, float64(s.Window.Overflow), name)
		ch <- prometheus.MustNewConstMetric(descWindowKeyErrors, prometheus.CounterValue, float64(s.Window.KeyErrors), name)
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(s.Held), name)
		ch <- prometheus.MustNewConstMetric(descWithheld[withheldMute], prometheus.CounterValue, float64(s.Muted), name)
		ch <- prometheus.MustNewConstMetric(descMuteWhereErrors, prometheus.CounterValue, float64(s.MuteWhereErrors), name)
		ch <- prometheus.MustNewConstMetric(descWithheld[withheldWindow], prometheus.CounterValue, float64(s.Window.Coalesced), name)
		failing := 0.0
		if s.Failing {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(descFailing, prometheus.GaugeValue, failing, name)
		for reason, n := range s.DestinationErrors {
			ch <- prometheus.MustNewConstMetric(descDestErrors, prometheus.CounterValue, float64(n), name, reason)
		}
	}
	c.collectFenceRefusals(ch, b)
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
		if r.Routes() {
			for _, why := range []filters.RouteReason{filters.RouteUndeclared, filters.RouteFailed} {
				ch <- prometheus.MustNewConstMetric(descRouteDefaulted, prometheus.CounterValue, float64(r.RouteDefaulted(why)), r.Name, why.String())
			}
		}
		if r.IncludesOwners() {
			ch <- prometheus.MustNewConstMetric(descOwnersIncomplete, prometheus.CounterValue, float64(r.OwnersIncomplete()), r.Name)
		}
	}
	lag, leader := 0, 0.0
	for _, d := range b.deliverers() {
		lag += d.lag()
		if d.delivering() {
			leader = 1
		}
	}
	ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(lag))
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	if sh, ok := b.own.(*sharded); ok {
		c.collectShards(ch, sh)
	}
	if in != nil {
		for name, n := range in.Cached() {
			ch <- prometheus.MustNewConstMetric(descCached, prometheus.GaugeValue, float64(n), name)
		}
	}
	synced := 0.0
	if b.Ready() {
		synced = 1
	}
	ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, synced)
	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, version.Version, version.Commit())
}

// collectFenceRefusals reports each sink's refusals by its destination's
// fence, and the events it stored cut to a marker, once per sink (shards
// share one).
func (c *collector) collectFenceRefusals(ch chan<- prometheus.Metric, b *Bridge) {
	c.collectSinkCounts(ch, b, descFenceRefusals, func(s sinks.Sink) (int64, bool) {
		fr, ok := s.(sinks.FenceReporter)
		if !ok {
			return 0, false
		}
		return fr.FenceRefusals(), true
	})
	for _, reason := range sinks.WithheldReasons {
		c.collectSinkCounts(ch, b, descWithheld[reason], func(s sinks.Sink) (int64, bool) {
			wr, ok := s.(sinks.WithholdReporter)
			if !ok {
				return 0, false
			}
			return wr.Withheld(reason), true
		})
	}
	c.collectSinkCounts(ch, b, descGroupErrors, func(s sinks.Sink) (int64, bool) {
		gr, ok := s.(sinks.DigestGroupReporter)
		if !ok {
			return 0, false
		}
		return gr.DigestGroupErrors(), true
	})
	c.collectSinkCounts(ch, b, descTruncated, func(s sinks.Sink) (int64, bool) {
		tr, ok := s.(sinks.TruncationReporter)
		if !ok {
			return 0, false
		}
		return tr.Truncations(), true
	})
}

// collectSinkCounts reports, per sink name, what count reads of each sink
// that has it (ok), once per sink however many shards share it.
func (c *collector) collectSinkCounts(ch chan<- prometheus.Metric, b *Bridge, desc *prometheus.Desc, count func(sinks.Sink) (int64, bool)) {
	seen := map[sinks.Sink]bool{}
	var names []string
	counts := map[string]int64{}
	for _, d := range b.deliverers() {
		for _, run := range d.active.Load().runs() {
			sink := run.sink
			if u, ok := sink.(interface{ Unwrap() sinks.Sink }); ok {
				sink = u.Unwrap()
			}
			n, ok := count(sink)
			if !ok {
				continue
			}
			if reflect.TypeOf(sink).Comparable() { // a map key; shards share one sink
				if seen[sink] {
					continue
				}
				seen[sink] = true
			}
			if _, ok := counts[run.cfg.Name]; !ok {
				names = append(names, run.cfg.Name)
			}
			counts[run.cfg.Name] += n
		}
	}
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(counts[name]), name)
	}
}

// collectShards reports the shard owner's counts and each held shard's
// pending events and checkpoint lag.
func (c *collector) collectShards(ch chan<- prometheus.Metric, sh *sharded) {
	st := sh.stats()
	ch <- prometheus.MustNewConstMetric(descShardsOwned, prometheus.GaugeValue, float64(len(st.Owned)))
	ch <- prometheus.MustNewConstMetric(descShardsLapsed, prometheus.GaugeValue, float64(len(st.Lapsed)))
	ch <- prometheus.MustNewConstMetric(descShardMembers, prometheus.GaugeValue, float64(st.Members))
	for kind, n := range map[string]uint64{"acquired": st.Acquired, "released": st.Released, "lost": st.Lost, "lapsed": st.Lapses, "resumed": st.Resumed, "failed": st.AcquireFailures + sh.startFailures.Load()} {
		ch <- prometheus.MustNewConstMetric(descShardHandovers, prometheus.CounterValue, float64(n), kind)
	}
	filtered := 0.0
	if sh.filter {
		filtered = 1
	}
	ch <- prometheus.MustNewConstMetric(descShardFiltered, prometheus.GaugeValue, filtered)
	for _, held := range sh.held() {
		pending := 0
		for _, dv := range held.d.deliveries() {
			pending += dv.Pending()
		}
		shard := strconv.Itoa(held.shard)
		ch <- prometheus.MustNewConstMetric(descShardPending, prometheus.GaugeValue, float64(pending), shard)
		ch <- prometheus.MustNewConstMetric(descShardLag, prometheus.GaugeValue, float64(held.d.lag()), shard)
	}
}

// sinkTotal is one sink's counts over its deliveries (one per shard held
// when sharded).
type sinkTotal struct {
	name string
	delivery.Stats
	limit, inFlight int
}

// sinkTotals sums the deliveries' counts per sink, in the order first seen.
func sinkTotals(ds []*delivery.Delivery) []*sinkTotal {
	var out []*sinkTotal
	byName := map[string]*sinkTotal{}
	for _, d := range ds {
		s := d.Stats()
		limit, inFlight := d.Concurrency()
		t := byName[d.Name]
		if t == nil {
			t = &sinkTotal{name: d.Name, Stats: s, limit: limit, inFlight: inFlight}
			byName[d.Name] = t
			out = append(out, t)
			continue
		}
		t.Delivered += s.Delivered
		t.Failed += s.Failed
		t.Retried += s.Retried
		t.DeadLettered += s.DeadLettered
		t.Queue.Offered += s.Queue.Offered
		t.Queue.Coalesced += s.Queue.Coalesced
		t.Queue.Cancelled += s.Queue.Cancelled
		t.Pending += s.Pending
		t.Capacity += s.Capacity
		t.Parked += s.Parked
		t.OldestParked = max(t.OldestParked, s.OldestParked)
		t.Throttled += s.Throttled
		t.Window.Coalesced += s.Window.Coalesced
		t.Window.Overflow += s.Window.Overflow
		t.Window.KeyErrors += s.Window.KeyErrors
		t.Held += s.Held
		t.Muted += s.Muted
		t.MuteWhereErrors += s.MuteWhereErrors
		t.Failing = t.Failing || s.Failing
		t.limit += limit
		t.inFlight += inFlight
		for reason, n := range s.DestinationErrors {
			if t.DestinationErrors == nil {
				t.DestinationErrors = map[string]uint64{}
			}
			t.DestinationErrors[reason] += n
		}
	}
	return out
}

// withheldDescs is kubebridge_sink_withheld_total, one Desc per reason (a
// constant label), so that collectSinkCounts reports each.
func withheldDescs() map[string]*prometheus.Desc {
	out := make(map[string]*prometheus.Desc, len(sinks.WithheldReasons)+1)
	for _, r := range append(slices.Clone(sinks.WithheldReasons), withheldMute, withheldWindow) {
		out[r] = prometheus.NewDesc("kubebridge_sink_withheld_total",
			"Events the sink handled without a request at once: reason when, the request's when was false, and for, the object had not been in the view for the request's for yet (both count as delivered); mute, the event was held by the sink's mute, to be sent coalesced when its window ends; window, the event was coalesced into another object's message by the sink's updateWindow key (counts as delivered).",
			[]string{"sink"}, prometheus.Labels{"reason": r})
	}
	return out
}

// withheldMute is the reason of the events a mute held: the delivery's
// count, not the sink's.
const withheldMute = "mute"

// withheldWindow is the reason of the events an updateWindow key coalesced
// into another object's message: the delivery's count.
const withheldWindow = "window"

package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDur(rs []result, f func(result) time.Duration) time.Duration {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = float64(f(r))
	}
	return roundDur(time.Duration(median(xs)))
}

// roundDur keeps three or four significant digits.
func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}

// medianOf is the median of f over measurements.
func medianOf[T any](rs []T, f func(T) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return median(xs)
}

// report renders the medians as Markdown tables.
func report(o options, res results) string {
	all, mem := res.Runs, res.Memory
	var b strings.Builder
	fmt.Fprintf(&b, "\n## kubebridge bench, %s\n\nmachine: %s\n", time.Now().UTC().Format("2006-01-02"), machine())
	command := o.command
	if command == "" { // run from a test: the options it set
		command = fmt.Sprintf("go run ./hack/bench -n %d -runs %d -latency-rate %d -latency-n %d -memory %q -cold %q -slow %q -outage %v -mirror %q",
			o.n, o.runs, o.latencyRate, o.latencyN, o.memory, o.cold, o.slow, o.outage, o.mirror)
	}
	fmt.Fprintf(&b, "command: %s\n", command)
	if o.cbor {
		b.WriteString("apiserver: --feature-gates=CBORServingAndStorage=true\n")
	}

	byConsumer := map[string][]result{}
	baseline, baselineCBOR := map[int]result{}, map[int]result{}
	paced := map[string][]result{}
	var order []string
	var pacedOrder []string // latency runs only (-n 0) have no throughput order
	for _, r := range all {
		if r.Rate > 0 {
			if _, ok := paced[r.Consumer]; !ok {
				pacedOrder = append(pacedOrder, r.Consumer)
			}
			paced[r.Consumer] = append(paced[r.Consumer], r)
			continue
		}
		if _, ok := byConsumer[r.Consumer]; !ok {
			order = append(order, r.Consumer)
		}
		byConsumer[r.Consumer] = append(byConsumer[r.Consumer], r)
		switch r.Consumer {
		case "baseline":
			baseline[r.Run] = r
		case "baseline-cbor":
			baselineCBOR[r.Run] = r
		}
	}
	// cborCol is the extra column of a run with both bare watches.
	cborCol := len(baselineCBOR) > 0 && len(baseline) > 0
	if len(order) > 0 {
		fmt.Fprintf(&b, "\n### Throughput: %d ConfigMaps created, updated, deleted (%d changes) as fast as the apiserver takes them; medians of %d runs\n\n", o.n, 3*o.n, o.runs)
		b.WriteString("Delivered/s: unique events from the first write to the last event; tail: from the load's last acknowledged write to the last event (how far behind the apiserver the consumer ended).\n\n")
		head, cols := "| consumer | delivered/s | ratio to baseline |", "|---|---|---|"
		if cborCol {
			head, cols = head+" ratio to baseline-cbor |", cols+"---|"
		}
		b.WriteString(head + " tail after the load | latency p50 | p99 | max | CPU s per 10k events | peak RSS | delivered / changes | duplicates | out of order |\n")
		b.WriteString(cols + "---|---|---|---|---|---|---|---|---|\n")
		for _, c := range order {
			rs := byConsumer[c]
			ratioTo := func(base map[int]result) string {
				return fmt.Sprintf("%.2f", medianOf(rs, func(r result) float64 {
					return r.perSecond() / base[r.Run].perSecond()
				}))
			}
			ratio := ratioTo(baseline)
			if cborCol {
				ratio += " | " + ratioTo(baselineCBOR)
			}
			lat := "- | - | -"
			if !isBaseline(c) {
				lat = fmt.Sprintf("%v | %v | %v", medianDur(rs, func(r result) time.Duration { return r.P50 }),
					medianDur(rs, func(r result) time.Duration { return r.P99 }), medianDur(rs, func(r result) time.Duration { return r.Max }))
			}
			fmt.Fprintf(&b, "| %s | %.0f | %s | %.2f s | %s | %.2f | %.0f MiB | %.0f / %d | %.0f | %.0f |\n", c,
				medianOf(rs, result.perSecond), ratio, medianOf(rs, func(r result) float64 { return r.Tail }), lat,
				medianOf(rs, func(r result) float64 { return r.CPU / float64(r.Events) * 10000 }),
				medianOf(rs, func(r result) float64 { return float64(r.MaxRSS) / (1 << 20) }),
				medianOf(rs, func(r result) float64 { return float64(r.Events) }), rs[0].Changes,
				medianOf(rs, func(r result) float64 { return float64(r.Duplicate) }),
				medianOf(rs, func(r result) float64 { return float64(r.OutOfOrder) }))
		}
		// A shaped request against a CloudEvent, one request per event each,
		// run by run.
		if ce, shaped := byConsumer["webhook-ce"], byConsumer["webhook-shaped"]; len(ce) > 0 && len(shaped) > 0 {
			perRun := map[int]result{}
			for _, r := range ce {
				perRun[r.Run] = r
			}
			var paired []result // runs with both
			for _, r := range shaped {
				if c, ok := perRun[r.Run]; ok && c.perSecond() > 0 {
					paired = append(paired, r)
				}
			}
			if len(paired) > 0 {
				fmt.Fprintf(&b, "\nwebhook-shaped / webhook-ce (delivered/s, one request per event each, ratio within each run): median %.2f\n",
					medianOf(paired, func(r result) float64 { return r.perSecond() / perRun[r.Run].perSecond() }))
			}
		}
	}
	// The kafka sink against JetStream, run by run.
	var vsJS []string
	for _, c := range []string{"kafka", "kafka-state"} {
		if r := pairRatio(byConsumer, c, "jetstream"); r != "" {
			vsJS = append(vsJS, c+" "+r)
		}
	}
	if r := pairRatio(byConsumer, "kafka-state", "kafka"); r != "" {
		vsJS = append(vsJS, "kafka-state / kafka "+r)
	}
	if len(vsJS) > 0 {
		fmt.Fprintf(&b, "\nAgainst jetstream (delivered/s, ratio within each run, median): %s\n", strings.Join(vsJS, ", "))
	}
	if len(paced) > 0 {
		fmt.Fprintf(&b, "\n### Latency at %d changes/s (%d ConfigMaps, %d changes), observation to sink receipt; medians of %d runs\n\n", o.latencyRate, o.latencyN, 3*o.latencyN, o.runs)
		b.WriteString("| consumer | p50 | p99 | max | p99 added | p99 updated | p99 deleted | delivered / changes |\n|---|---|---|---|---|---|---|---|\n")
		for _, c := range pacedOrder {
			rs := paced[c]
			if len(rs) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %v | %v | %v | %v | %v | %v | %.0f / %d |\n", c,
				medianDur(rs, func(r result) time.Duration { return r.P50 }),
				medianDur(rs, func(r result) time.Duration { return r.P99 }),
				medianDur(rs, func(r result) time.Duration { return r.Max }),
				medianDur(rs, func(r result) time.Duration { return r.P99ByType["added"] }),
				medianDur(rs, func(r result) time.Duration { return r.P99ByType["updated"] }),
				medianDur(rs, func(r result) time.Duration { return r.P99ByType["deleted"] }),
				medianOf(rs, func(r result) float64 { return float64(r.Events) }), rs[0].Changes)
		}
	}
	if len(mem) > 0 {
		b.WriteString(memReport(mem, "the ConfigMaps cached", memConsumers, "informer"))
		b.WriteString(memReport(mem, "Secrets cached (4 KiB and three small values each)", memSecretConsumers, "informer-secrets"))
	}
	if len(res.Cold) > 0 {
		b.WriteString(coldReport(o, res.Cold))
	}
	if len(res.Slow) > 0 {
		b.WriteString(slowReport(o, res.Slow))
	}
	if len(res.Outage) > 0 {
		b.WriteString(outageReport(o, res.Outage))
	}
	if res.Mirror != nil {
		b.WriteString(mirrorReport(o, *res.Mirror))
	}
	if res.Shards != nil {
		b.WriteString(shardReport(o, *res.Shards))
	}
	b.WriteString(ownersReport(res.Owners))
	return b.String()
}

// memReport gives, per object count, the median heap and RSS of each of
// consumers and the cost per object: the growth over the empty cache
// divided by the count, and its ratio to base's ("" without measurements
// of consumers).
func memReport(mem []memResult, what string, consumers []string, base string) string {
	type key struct {
		c string
		n int
	}
	heap, rss := map[key][]float64{}, map[key][]float64{}
	var counts []int
	for _, m := range mem {
		if !slices.Contains(consumers, m.Consumer) {
			continue
		}
		k := key{m.Consumer, m.Objects}
		heap[k] = append(heap[k], float64(m.HeapBytes))
		rss[k] = append(rss[k], float64(m.RSSBytes))
		if m.Objects > 0 && !slices.Contains(counts, m.Objects) {
			counts = append(counts, m.Objects)
		}
	}
	if len(counts) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Memory with %s (after the initial view was delivered; heap after a forced GC)\n\n", what)
	fmt.Fprintf(&b, "| consumer | objects | heap | RSS | heap per object | ratio to %[1]s | RSS per object | ratio to %[1]s |\n|---|---|---|---|---|---|---|---|\n", base)
	for _, n := range counts {
		per := func(m map[key][]float64, c string) float64 {
			return (median(m[key{c, n}]) - median(m[key{c, 0}])) / float64(n)
		}
		for _, c := range consumers {
			k := key{c, n}
			if len(heap[k]) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %.1f MiB | %.1f MiB | %.0f B | %.2f | %.0f B | %.2f |\n", c, n,
				median(heap[k])/(1<<20), median(rss[k])/(1<<20),
				per(heap, c), per(heap, c)/per(heap, base), per(rss, c), per(rss, c)/per(rss, base))
		}
	}
	return b.String()
}

// coldReport gives, per object count, the cold starts against the bare
// watches of the same run, then the warm restarts.
func coldReport(o options, cold []startResult) string {
	type key struct {
		consumer string
		n, run   int
	}
	base := map[key]startResult{}
	var ns []int
	var consumers []string
	for _, r := range cold {
		if r.Phase == "cold" && isBaseline(r.Consumer) {
			base[key{r.Consumer, r.Objects, r.Run}] = r
		}
		if !slices.Contains(ns, r.Objects) {
			ns = append(ns, r.Objects)
		}
		if !slices.Contains(consumers, r.Consumer) {
			consumers = append(consumers, r.Consumer)
		}
	}
	var bases []string
	for _, c := range []string{"baseline", "baseline-cbor"} {
		if slices.Contains(consumers, c) {
			bases = append(bases, c)
		}
	}
	// ratios is the median over runs of a bare watch's time to all
	// delivered over r's time, one column per bare watch.
	ratios := func(rs []startResult) string {
		var cols []string
		for _, c := range bases {
			cols = append(cols, fmt.Sprintf("%.2f", medianOf(rs, func(r startResult) float64 {
				return base[key{c, r.Objects, r.Run}].Seconds / r.Seconds
			})))
		}
		return strings.Join(cols, " | ")
	}
	ratioHead := func() (string, string) {
		var h, d string
		for _, c := range bases {
			h += " ratio to " + c + " |"
			d += "---|"
		}
		return h, d
	}
	h, d := ratioHead()
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "\n### Cold start: %d existing ConfigMaps, each consumer started fresh (bridge: empty checkpoint; nats: NATS core, jetstream: a new stream, kafka: new topics); medians of %d runs\n\n", n, o.runs)
		b.WriteString("Time is from process start until every object was delivered (the bare watch: to its handler; the bridge: to the subscriber); a ratio is the bare watch's time over the consumer's, per run (> 1: faster than the bare watch).\n\n")
		b.WriteString("After ready: from /readyz (the initial list is in the bridge's cache) to the last event, and the events per second over it: the sink's burst rate.\n\n")
		fmt.Fprintf(&b, "| consumer | time to all delivered |%s ready | after ready | events/s after ready | CPU s | peak RSS | delivered / objects | duplicates |\n|---|---|%s---|---|---|---|---|---|---|\n", h, d)
		for _, c := range consumers {
			rs := filterStarts(cold, "cold", c, n)
			if len(rs) == 0 {
				continue
			}
			ready, after, rate := "-", "-", "-"
			if !isBaseline(c) {
				ready = fmt.Sprintf("%.2f s", medianOf(rs, func(r startResult) float64 { return r.ReadySeconds }))
				after = fmt.Sprintf("%.2f s", medianOf(rs, func(r startResult) float64 { return r.Seconds - r.ReadySeconds }))
				rate = fmt.Sprintf("%.0f", medianOf(rs, func(r startResult) float64 { return float64(r.Events) / (r.Seconds - r.ReadySeconds) }))
			}
			fmt.Fprintf(&b, "| %s | %.2f s | %s | %s | %s | %s | %.2f | %.0f MiB | %.0f / %d | %.0f |\n", c,
				medianOf(rs, func(r startResult) float64 { return r.Seconds }), ratios(rs), ready, after, rate,
				medianOf(rs, func(r startResult) float64 { return r.CPU }),
				medianOf(rs, func(r startResult) float64 { return mib(r.PeakRSS) }),
				medianOf(rs, func(r startResult) float64 { return float64(r.Events) }), n,
				medianOf(rs, func(r startResult) float64 { return float64(r.Duplicates) }))
		}
		var warm bool
		for _, c := range consumers {
			warm = warm || len(filterStarts(cold, "restart", c, n)) > 0
		}
		if !warm {
			continue
		}
		fmt.Fprintf(&b, "\n### Warm restart: %d ConfigMaps, the bridge stopped (SIGTERM) and started again on its checkpoint, nothing changed; medians of %d runs\n\n", n, o.runs)
		fmt.Fprintf(&b, "Time is from process start to /readyz; a ratio is the bare watch's time to all delivered (same run) over it. Events: every event received from the restart until %v after ready (must be 0).\n\n", restartSettle)
		fmt.Fprintf(&b, "| consumer | time to ready |%s CPU s to ready | peak RSS | events delivered (max over runs) |\n|---|---|%s---|---|---|\n", h, d)
		for _, c := range consumers {
			rs := filterStarts(cold, "restart", c, n)
			if len(rs) == 0 {
				continue
			}
			most := 0
			for _, r := range rs {
				most = max(most, r.Events)
			}
			fmt.Fprintf(&b, "| %s | %.2f s | %s | %.2f | %.0f MiB | %d |\n", c,
				medianOf(rs, func(r startResult) float64 { return r.Seconds }), ratios(rs),
				medianOf(rs, func(r startResult) float64 { return r.CPU }),
				medianOf(rs, func(r startResult) float64 { return mib(r.PeakRSS) }), most)
		}
	}
	return b.String()
}

func filterStarts(rs []startResult, phase, consumer string, n int) []startResult {
	var out []startResult
	for _, r := range rs {
		if r.Phase == phase && r.Consumer == consumer && r.Objects == n {
			out = append(out, r)
		}
	}
	return out
}

// seriesRows is the most rows an in-flight series is printed with.
const seriesRows = 40

// slowReport gives each slow case's medians, then the in-flight series of
// the first run of each step case.
func slowReport(o options, slow []slowResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Slow sinks: %d changes/s offered (%d ConfigMaps, %d changes), sinks with their default config; medians of %d runs\n\n",
		o.slowRate, o.slowN, 3*o.slowN, o.runs)
	fmt.Fprintf(&b, "A case is the webhook receiver's time per request (a > b: a for the first half of the load, b after) or NATS core. A run waits for every event until nothing arrived for 30 s or %v after the load. Out of order: first deliveries of an object older than an earlier one (must be 0).\n\n", o.slowMax)
	b.WriteString("| case | delivered/s | offered/s | delivered / changes | complete runs | latency p50 | p99 | max in flight | requests | out of order | duplicates | CPU s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var names []string
	byCase := map[string][]slowResult{}
	for _, r := range slow {
		if _, ok := byCase[r.Name]; !ok {
			names = append(names, r.Name)
		}
		byCase[r.Name] = append(byCase[r.Name], r)
	}
	dur := func(rs []slowResult, f func(slowResult) time.Duration) time.Duration {
		return roundDur(time.Duration(medianOf(rs, func(r slowResult) float64 { return float64(f(r)) })))
	}
	for _, name := range names {
		rs := byCase[name]
		complete, worst := 0, 0
		for _, r := range rs {
			if r.Complete {
				complete++
			}
			worst = max(worst, r.OutOfOrder)
		}
		inFlight, requests := "-", "-"
		if rs[0].Sink == "webhook" {
			inFlight = fmt.Sprintf("%.0f", medianOf(rs, func(r slowResult) float64 { return float64(r.MaxInFlight) }))
			requests = fmt.Sprintf("%.0f", medianOf(rs, func(r slowResult) float64 { return float64(r.Requests) }))
		}
		fmt.Fprintf(&b, "| %s | %.0f | %d | %.0f / %d | %d / %d | %v | %v | %s | %s | %d | %.0f | %.2f |\n", name,
			medianOf(rs, slowResult.perSecond), o.slowRate,
			medianOf(rs, func(r slowResult) float64 { return float64(r.Events) }), rs[0].Changes, complete, len(rs),
			dur(rs, func(r slowResult) time.Duration { return r.P50 }), dur(rs, func(r slowResult) time.Duration { return r.P99 }),
			inFlight, requests, worst,
			medianOf(rs, func(r slowResult) float64 { return float64(r.Duplicates) }),
			medianOf(rs, func(r slowResult) float64 { return r.CPU }))
	}
	for _, name := range names {
		r := byCase[name][0]
		if r.Delay2 == 0 || len(r.Series) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n#### %s, run %d: requests in flight over time (samples every %v, grouped by %d)\n\n", name, r.Run, o.slowSample, groupOf(len(r.Series)))
		b.WriteString(seriesTable(r.Series))
	}
	return b.String()
}

func groupOf(n int) int { return max(1, (n+seriesRows-1)/seriesRows) }

// seriesTable prints an in-flight series in at most seriesRows rows: per
// group of samples, its end, the receiver's delay, the most in flight,
// the delivery rate over the group and the total delivered.
func seriesTable(series []inFlight) string {
	var b strings.Builder
	b.WriteString("| t | receiver delay | max in flight | delivered/s | delivered |\n|---|---|---|---|---|\n")
	g := groupOf(len(series))
	prevT, prevN := 0.0, 0
	for i := 0; i < len(series); i += g {
		grp := series[i:min(i+g, len(series))]
		last := grp[len(grp)-1]
		var most int64
		for _, s := range grp {
			most = max(most, s.Max)
		}
		rate := 0.0
		if last.T > prevT {
			rate = float64(last.Delivered-prevN) / (last.T - prevT)
		}
		fmt.Fprintf(&b, "| %.1f s | %.0f ms | %d | %.0f | %d |\n", last.T, last.DelayMs, most, rate, last.Delivered)
		prevT, prevN = last.T, last.Delivered
	}
	return b.String()
}

// outageReport gives each outage run's growth and final check, then the
// memory curve of the first run.
func outageReport(o options, outage []outageResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Sink outage: the webhook answers 503 for %v while %d names/s are created and deleted (%d ConfigMaps stay), then recovers\n\n",
		o.outage, o.outageRate, o.outageLive)
	b.WriteString("Live heap is after a forced GC. The final check replays the received events by uid and compares with the cluster: missing (in the cluster, not held), deleted but held, stale (another resourceVersion); all must be 0.\n\n")
	b.WriteString("| run | names churned | live heap before | after | growth per churned name | RSS after | recovery | missing | deleted but held | stale | out of order | duplicates | CPU s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range outage {
		first, last := r.Samples[0], r.Samples[len(r.Samples)-1]
		fmt.Fprintf(&b, "| %d | %d | %.1f MiB | %.1f MiB | %.0f B | %.1f MiB | %.1f s | %d | %d | %d | %d | %d | %.2f |\n", r.Run, last.Churned,
			mib(first.HeapLive), mib(last.HeapLive), r.heapGrowthPerName(), mib(last.RSS), r.RecoverySeconds,
			r.Missing, r.Extra, r.Stale, r.OutOfOrder, r.Duplicates, r.CPU)
	}
	fmt.Fprintf(&b, "\n#### Memory during the outage, run %d (every %v)\n\n", outage[0].Run, o.outageSample)
	b.WriteString("| t | live objects | names churned | queued | coalesced | heap in use | live heap | RSS |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range outage[0].Samples {
		fmt.Fprintf(&b, "| %.0f s | %d | %d | %d | %d | %.1f MiB | %.1f MiB | %.1f MiB |\n", s.T, s.Live, s.Churned, s.Queued, s.Coalesced,
			mib(s.HeapInUse), mib(s.HeapLive), mib(s.RSS))
	}
	return b.String()
}

// balanced is the median time until the replicas first held fair shares,
// over the runs where they did before every object was delivered.
func balanced(rs []shardStart) string {
	var in []shardStart
	for _, r := range rs {
		if r.BalancedSeconds > 0 {
			in = append(in, r)
		}
	}
	switch {
	case len(in) == 0:
		return "not before all delivered"
	case len(in) < len(rs):
		return fmt.Sprintf("%.2f s (%d of %d runs; the others not before all delivered)", medianOf(in, func(r shardStart) float64 { return r.BalancedSeconds }), len(in), len(rs))
	}
	return fmt.Sprintf("%.2f s", medianOf(in, func(r shardStart) float64 { return r.BalancedSeconds }))
}

// shardReport gives the sharded cold starts per apiserver setting and
// replica count, each replica against the one replica of the same run,
// then the churn and the handovers.
func shardReport(o options, res shardResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Sharding: cold start on %d existing ConfigMaps, %d shards by uid, the replicas started at once; medians of %d runs\n\n", o.shards, benchShards, o.runs)
	b.WriteString("Each replica is a process of its own on this machine's cores, shared with the apiserver, etcd, nats-server and the other replicas: its CPU seconds and peak RSS (VmHWM) until the subscriber had every object are what it would use on a node of its own; the time is not. " +
		"A ratio is a replica's over the one replica's of the same apiserver in the same run (the largest of the replicas'), then the median over runs; the goal with the apiserver filtering is <= 1.1/N. " +
		"Shards: held at the end (over runs and replicas), and the most one replica held at once during the start (sampled every " + shardSample.String() + ", most over runs). " +
		"Delivered: unique event ids, one `added` per object expected; deleted: `deleted` events among them (nothing is deleted: each is an object announced gone while it exists, then added again under a new id).\n\n")
	b.WriteString("| apiserver filters | replicas | time to all delivered | CPU s per replica (min - max) | CPU / 1 replica (largest) | goal | CPU all replicas / 1 replica | peak RSS per replica (min - max) | RSS / 1 replica (largest) | balanced after | shards held | most held at once | delivered / objects | deleted (max) | duplicates |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	type key struct {
		gate   string
		n, run int
	}
	byKey := map[key]shardStart{}
	var gates []string
	var counts []int
	for _, r := range res.Cold {
		byKey[key{r.Gate, r.Replicas, r.Run}] = r
		if !slices.Contains(gates, r.Gate) {
			gates = append(gates, r.Gate)
		}
		if !slices.Contains(counts, r.Replicas) {
			counts = append(counts, r.Replicas)
		}
	}
	minMax := func(ms []replicaResult, f func(replicaResult) float64) (lo, hi float64) {
		lo, hi = f(ms[0]), f(ms[0])
		for _, m := range ms[1:] {
			lo, hi = min(lo, f(m)), max(hi, f(m))
		}
		return lo, hi
	}
	sum := func(ms []replicaResult, f func(replicaResult) float64) (s float64) {
		for _, m := range ms {
			s += f(m)
		}
		return s
	}
	cpu := func(m replicaResult) float64 { return m.CPU }
	rss := func(m replicaResult) float64 { return mib(m.PeakRSS) }
	for _, g := range gates {
		var base []startResult
		for _, r := range res.Baseline {
			if r.Gate == g {
				base = append(base, r.startResult)
			}
		}
		if len(base) > 0 {
			fmt.Fprintf(&b, "| %s | bare informer | %.2f s | %.2f | | | | %.0f MiB | | | | | %.0f / %d | | |\n", g,
				medianOf(base, func(r startResult) float64 { return r.Seconds }), medianOf(base, func(r startResult) float64 { return r.CPU }),
				medianOf(base, func(r startResult) float64 { return mib(r.PeakRSS) }),
				medianOf(base, func(r startResult) float64 { return float64(r.Events) }), base[0].Objects)
		}
		for _, n := range counts {
			var rs []shardStart
			for _, r := range res.Cold {
				if r.Gate == g && r.Replicas == n && len(r.Members) > 0 {
					rs = append(rs, r)
				}
			}
			if len(rs) == 0 {
				continue
			}
			// ratio is the median over runs of f's largest replica (or, sum,
			// all replicas together) over the one replica's.
			ratio := func(f func(replicaResult) float64, all bool) string {
				var xs []float64
				for _, r := range rs {
					one, ok := byKey[key{g, 1, r.Run}]
					if !ok || len(one.Members) == 0 {
						continue
					}
					_, hi := minMax(r.Members, f)
					if all {
						hi = sum(r.Members, f)
					}
					xs = append(xs, hi/f(one.Members[0]))
				}
				if len(xs) == 0 {
					return "-"
				}
				return fmt.Sprintf("%.2f", median(xs))
			}
			held := []float64{}
			most := 0
			for _, r := range rs {
				for _, m := range r.Members {
					held = append(held, float64(m.Shards))
					most = max(most, m.MostShards)
				}
			}
			hLo, hHi := slices.Min(held), slices.Max(held)
			deleted := 0
			for _, r := range rs {
				deleted = max(deleted, r.Types["deleted"])
			}
			fmt.Fprintf(&b, "| %s | %d | %.2f s | %.2f - %.2f | %s | %.2f | %s | %.0f - %.0f MiB | %s | %s | %.0f - %.0f | %d | %.0f / %d | %.0f (%d) | %.0f |\n", g, n,
				medianOf(rs, func(r shardStart) float64 { return r.Seconds }),
				medianOf(rs, func(r shardStart) float64 { lo, _ := minMax(r.Members, cpu); return lo }),
				medianOf(rs, func(r shardStart) float64 { _, hi := minMax(r.Members, cpu); return hi }),
				ratio(cpu, false), 1.1/float64(n), ratio(cpu, true),
				medianOf(rs, func(r shardStart) float64 { lo, _ := minMax(r.Members, rss); return lo }),
				medianOf(rs, func(r shardStart) float64 { _, hi := minMax(r.Members, rss); return hi }),
				ratio(rss, false),
				balanced(rs), hLo, hHi, most,
				medianOf(rs, func(r shardStart) float64 { return float64(r.Events) }), rs[0].Objects,
				medianOf(rs, func(r shardStart) float64 { return float64(r.Types["deleted"]) }), deleted,
				medianOf(rs, func(r shardStart) float64 { return float64(r.Duplicates) }))
		}
	}
	if len(res.Churn) > 0 {
		fmt.Fprintf(&b, "\n### Sharding: live churn, %d ConfigMaps created, updated, deleted (%d changes) as fast as the apiserver takes them, apiserver filtering; medians of %d runs\n\n", o.shardChurnN, 3*o.shardChurnN, o.runs)
		b.WriteString("The replicas share the shards (balanced, ready) before the load starts. Rate: unique events from the first write to the last event; CPU: what the load cost each replica.\n\n")
		b.WriteString("| replicas | delivered/s | ratio to 1 replica | CPU s per replica (min - max) | CPU s per 10k events, all replicas | peak RSS per replica (max) | delivered / changes | duplicates | out of order |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
		one := map[int]shardChurn{}
		var ns []int
		for _, r := range res.Churn {
			if r.Replicas == 1 {
				one[r.Run] = r
			}
			if !slices.Contains(ns, r.Replicas) {
				ns = append(ns, r.Replicas)
			}
		}
		for _, n := range ns {
			var rs []shardChurn
			for _, r := range res.Churn {
				if r.Replicas == n {
					rs = append(rs, r)
				}
			}
			fmt.Fprintf(&b, "| %d | %.0f | %.2f | %.2f - %.2f | %.2f | %.0f MiB | %.0f / %d | %.0f | %.0f |\n", n,
				medianOf(rs, shardChurn.perSecond),
				medianOf(rs, func(r shardChurn) float64 { return r.perSecond() / one[r.Run].perSecond() }),
				medianOf(rs, func(r shardChurn) float64 { lo, _ := minMax(r.Members, cpu); return lo }),
				medianOf(rs, func(r shardChurn) float64 { _, hi := minMax(r.Members, cpu); return hi }),
				medianOf(rs, func(r shardChurn) float64 { return r.cpu() / float64(r.Events) * 10000 }),
				medianOf(rs, func(r shardChurn) float64 { _, hi := minMax(r.Members, rss); return hi }),
				medianOf(rs, func(r shardChurn) float64 { return float64(r.Events) }), rs[0].Changes,
				medianOf(rs, func(r shardChurn) float64 { return float64(r.Duplicates) }),
				medianOf(rs, func(r shardChurn) float64 { return float64(r.OutOfOrder) }))
		}
	}
	if len(res.Handover) > 0 {
		fmt.Fprintf(&b, "\n### Sharding: handover after a SIGKILL, 2 replicas, apiserver filtering, %d names/s created and deleted 1 s later; leases 4 s (renew deadline 3 s, retry 500 ms)\n\n", o.shardHandoverRate)
		fmt.Fprintf(&b, "Times from the SIGKILL: the first event of an object in one of the killed replica's shards (received after %v), the survivor holding all %d shards, and it being ready with them; then a replacement (a new identity) starts: the time until the two hold fair shares, both ready.\n\n", handoverGuard, benchShards)
		b.WriteString("| round | killed replica's shards | first event in them | survivor holds all | survivor ready | replacement balanced |\n|---|---|---|---|---|---|\n")
		for _, h := range res.Handover {
			fmt.Fprintf(&b, "| %d | %v | %.2f s | %.2f s | %.2f s | %.2f s |\n", h.Round, h.Shards, h.DeliverSeconds, h.OwnedSeconds, h.ReadySeconds, h.JoinSeconds)
		}
		hs := res.Handover
		most := func(f func(handover) float64) float64 {
			m := 0.0
			for _, h := range hs {
				m = max(m, f(h))
			}
			return m
		}
		for _, row := range []struct {
			name string
			f    func(func(handover) float64) float64
		}{{"median", func(f func(handover) float64) float64 { return medianOf(hs, f) }}, {"max", most}} {
			fmt.Fprintf(&b, "| **%s** | | %.2f s | %.2f s | %.2f s | %.2f s |\n", row.name,
				row.f(func(h handover) float64 { return h.DeliverSeconds }), row.f(func(h handover) float64 { return h.OwnedSeconds }),
				row.f(func(h handover) float64 { return h.ReadySeconds }), row.f(func(h handover) float64 { return h.JoinSeconds }))
		}
	}
	if f := res.Final; f != nil {
		fmt.Fprintf(&b, "\nAfter the handovers: %d names churned, %d events, %d duplicates (same id), %d objects deleted again under another id (the deletion's acknowledgement not yet in the checkpoint when its replica was killed), %d other first deliveries out of order; the consumer's state against the cluster: %d missing, %d deleted but held, %d stale (all must be 0).\n",
			f.Churned, f.Events, f.Duplicates, f.DeletedAgain, f.OutOfOrder, f.Missing, f.Extra, f.Stale)
	}
	return b.String()
}

// ratioPair is one run's figure of the mirror consumer and of the
// baseline: their ratio (mirror / baseline).
type ratioPair struct{ base, mirror float64 }

func (p ratioPair) ratio() float64 { return p.mirror / p.base }

// mirrorReport gives, per object count, the bridge's fill of the bucket,
// the informer over the bucket against the one over the apiserver run by
// run (ratios mirror / baseline within each run, then their median), and
// memory per informer.
func mirrorReport(o options, mr mirrorResults) string {
	var b strings.Builder
	for _, f := range mr.Fill {
		n := f.Objects
		fmt.Fprintf(&b, "\n### The view from the bus: %d ConfigMaps, a client-go informer over the bridge's KV mirror against one over the apiserver; %d runs\n\n", n, o.runs)
		fmt.Fprintf(&b, "The bridge (mirror sink, one rule on the namespace, fresh checkpoint) filled the bucket: %d keys of %d objects in %.2f s from its process start (ready after %.2f s), CPU %.2f s, peak RSS %.0f MiB; then it was stopped.\n\n",
			f.Keys, n, f.Seconds, f.Ready, f.CPU, mib(f.PeakRSS))
		b.WriteString("Each consumer is a process of its own (unstructured SharedIndexInformer, namespace index, a handler that counts), timed from its start until its handler got the last add of the initial list. Baseline: `bench watch -initial N` listing the apiserver; mirror: `bench mirrorwatch -initial N` over `mirror.NewListerWatcher` on the bucket. Ratios are mirror / baseline within the run (< 1: the mirror costs less).\n\n")
		b.WriteString("Serving CPU: what the other side spent meanwhile, the apiserver's for the baseline, the bench process's (the embedded nats-server, and the bench's own idle) for the mirror.\n\n")
		b.WriteString("| run | baseline time | mirror time | time ratio | baseline CPU s | mirror CPU s | CPU ratio | baseline peak RSS | mirror peak RSS | RSS ratio | apiserver CPU s (baseline) | nats-server CPU s (mirror) | received baseline / mirror |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		base := map[int]startResult{}
		var runs []int
		for _, r := range mr.Starts {
			if r.Objects == n && r.Consumer == "baseline" {
				base[r.Run] = r
			}
		}
		var secs, cpus, rsss, serving []ratioPair
		for _, m := range mr.Starts {
			bl, ok := base[m.Run]
			if m.Objects != n || m.Consumer != "mirror" || !ok {
				continue
			}
			runs = append(runs, m.Run)
			p := [3]ratioPair{{bl.Seconds, m.Seconds}, {bl.CPU, m.CPU}, {mib(bl.PeakRSS), mib(m.PeakRSS)}}
			secs, cpus, rsss = append(secs, p[0]), append(cpus, p[1]), append(rsss, p[2])
			serving = append(serving, ratioPair{bl.ServerCPU, m.ServerCPU})
			fmt.Fprintf(&b, "| %d | %.2f s | %.2f s | %.2f | %.2f | %.2f | %.2f | %.0f MiB | %.0f MiB | %.2f | %.2f | %.2f | %d / %d of %d |\n", m.Run,
				p[0].base, p[0].mirror, p[0].ratio(), p[1].base, p[1].mirror, p[1].ratio(), p[2].base, p[2].mirror, p[2].ratio(),
				bl.ServerCPU, m.ServerCPU, bl.Events, m.Events, n)
		}
		if len(runs) > 0 {
			med := func(ps []ratioPair, f func(ratioPair) float64) float64 { return medianOf(ps, f) }
			base := func(p ratioPair) float64 { return p.base }
			mir := func(p ratioPair) float64 { return p.mirror }
			fmt.Fprintf(&b, "| **median** | %.2f s | %.2f s | **%.2f** | %.2f | %.2f | **%.2f** | %.0f MiB | %.0f MiB | **%.2f** | %.2f | %.2f | |\n",
				med(secs, base), med(secs, mir), med(secs, ratioPair.ratio), med(cpus, base), med(cpus, mir), med(cpus, ratioPair.ratio),
				med(rsss, base), med(rsss, mir), med(rsss, ratioPair.ratio), med(serving, base), med(serving, mir))
		}
		b.WriteString(mirrorMemReport(o, mr.Memory, n))
	}
	return b.String()
}

// mirrorMemReport gives the memory of K informers over the bucket in one
// process, per informer, against the informer over the apiserver.
func mirrorMemReport(o options, mem []memResult, n int) string {
	type key struct {
		consumer string
		k        int
	}
	base := map[int]memResult{}
	by := map[key][]memResult{}
	var order []key
	for _, m := range mem {
		if m.Objects != n {
			continue
		}
		if m.Consumer == "informer" {
			base[m.Run] = m
		}
		k := key{m.Consumer, m.Informers}
		if _, ok := by[k]; !ok {
			order = append(order, k)
		}
		by[k] = append(by[k], m)
	}
	if len(order) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n#### Memory per informer, %d ConfigMaps in each informer's cache (after the sync, heap after a forced GC); medians of %d runs\n\n", n, o.runs)
	b.WriteString("One process: the baseline `bench watch -memory` (one informer over the apiserver), or `bench mirrorwatch -memory -consumers K` (K informers over the bucket, a NATS connection and a ListerWatcher each). Per informer: the process's heap or RSS / K; a ratio is that over the baseline's of the same run. Synced: from the process start until every informer synced; disconnects: NATS connections the process lost meanwhile, and clients the server cut off as slow consumers (most in a run).\n\n")
	b.WriteString("| consumer | informers | heap | heap per informer | ratio to baseline | RSS | RSS per informer | ratio to baseline | synced after | disconnects / slow consumers |\n|---|---|---|---|---|---|---|---|---|---|\n")
	one := map[int]memResult{}
	for _, m := range by[key{"mirror", 1}] {
		one[m.Run] = m
	}
	var marginal []string
	for _, k := range order {
		ms := by[k]
		per := func(f func(memResult) int64) func(memResult) float64 {
			return func(m memResult) float64 { return float64(f(m)) / float64(max(m.Informers, 1)) }
		}
		heap := func(m memResult) int64 { return m.HeapBytes }
		rss := func(m memResult) int64 { return m.RSSBytes }
		ratio := func(f func(memResult) int64) float64 {
			return medianOf(ms, func(m memResult) float64 { return per(f)(m) / float64(f(base[m.Run])) })
		}
		name := map[string]string{"informer": "baseline (apiserver)", "informer-strip": "baseline, managedFields stripped",
			"mirror": "mirror", "mirror-shared": "mirror, one NATS connection"}[k.consumer]
		synced, lost := "-", "-"
		if strings.HasPrefix(k.consumer, "mirror") {
			var disc, slow int64
			for _, m := range ms {
				disc, slow = max(disc, m.Disconnects), max(slow, m.SlowConsumers)
			}
			synced = fmt.Sprintf("%.2f s", medianOf(ms, func(m memResult) float64 { return m.Seconds }))
			lost = fmt.Sprintf("%d / %d", disc, slow)
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f MiB | %.1f MiB | %.2f | %.1f MiB | %.1f MiB | %.2f | %s | %s |\n", name, k.k,
			medianOf(ms, func(m memResult) float64 { return mib(m.HeapBytes) }), medianOf(ms, per(heap))/(1<<20), ratio(heap),
			medianOf(ms, func(m memResult) float64 { return mib(m.RSSBytes) }), medianOf(ms, per(rss))/(1<<20), ratio(rss), synced, lost)
		if k.consumer == "mirror" && k.k > 1 && len(one) > 0 {
			// What one more informer costs: the growth over one informer's
			// process, per added informer.
			add := func(f func(memResult) int64) float64 {
				return medianOf(ms, func(m memResult) float64 { return float64(f(m)-f(one[m.Run])) / float64(k.k-1) })
			}
			marginal = append(marginal, fmt.Sprintf("%d informers: heap %.1f MiB, RSS %.1f MiB", k.k, add(heap)/(1<<20), add(rss)/(1<<20)))
		}
	}
	if len(marginal) > 0 {
		fmt.Fprintf(&b, "\nEach informer beyond the first (the growth over the one-informer process / (K-1), median over runs): %s.\n", strings.Join(marginal, "; "))
	}
	return b.String()
}

// pairRatio is the median over runs of a's delivered/s over b's, for the
// runs that measured both ("" when none did).
func pairRatio(byConsumer map[string][]result, a, b string) string {
	perRun := map[int]result{}
	for _, r := range byConsumer[b] {
		perRun[r.Run] = r
	}
	var xs []float64
	for _, r := range byConsumer[a] {
		if o, ok := perRun[r.Run]; ok && o.perSecond() > 0 {
			xs = append(xs, r.perSecond()/o.perSecond())
		}
	}
	if len(xs) == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", median(xs))
}

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
	return time.Duration(median(xs)).Round(10 * time.Microsecond)
}

func medianOf(rs []result, f func(result) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return median(xs)
}

// report renders the medians as Markdown tables.
func report(o options, all []result, mem []memResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## kubebridge bench, %s\n\nmachine: %s\n", time.Now().UTC().Format("2006-01-02"), machine())
	fmt.Fprintf(&b, "command: go run ./hack/bench -n %d -runs %d -latency-rate %d -latency-n %d -memory %q\n", o.n, o.runs, o.latencyRate, o.latencyN, o.memory)

	byConsumer := map[string][]result{}
	baseline := map[int]result{}
	paced := map[string][]result{}
	var order []string
	for _, r := range all {
		if r.Rate > 0 {
			paced[r.Consumer] = append(paced[r.Consumer], r)
			continue
		}
		if _, ok := byConsumer[r.Consumer]; !ok {
			order = append(order, r.Consumer)
		}
		byConsumer[r.Consumer] = append(byConsumer[r.Consumer], r)
		if r.Consumer == "baseline" {
			baseline[r.Run] = r
		}
	}
	if len(order) > 0 {
		fmt.Fprintf(&b, "\n### Throughput: %d ConfigMaps created, updated, deleted (%d changes) as fast as the apiserver takes them; medians of %d runs\n\n", o.n, 3*o.n, o.runs)
		b.WriteString("| consumer | delivered/s | ratio to baseline | latency p50 | p99 | max | CPU s per 10k events | peak RSS | delivered / changes | duplicates |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, c := range order {
			rs := byConsumer[c]
			ratio := "1.00"
			if c != "baseline" {
				ratio = fmt.Sprintf("%.2f", medianOf(rs, func(r result) float64 {
					return r.perSecond() / baseline[r.Run].perSecond()
				}))
			}
			lat := "- | - | -"
			if c != "baseline" {
				lat = fmt.Sprintf("%v | %v | %v", medianDur(rs, func(r result) time.Duration { return r.P50 }),
					medianDur(rs, func(r result) time.Duration { return r.P99 }), medianDur(rs, func(r result) time.Duration { return r.Max }))
			}
			fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %.2f | %.0f MiB | %.0f / %d | %.0f |\n", c,
				medianOf(rs, result.perSecond), ratio, lat,
				medianOf(rs, func(r result) float64 { return r.CPU / float64(r.Events) * 10000 }),
				medianOf(rs, func(r result) float64 { return float64(r.MaxRSS) / (1 << 20) }),
				medianOf(rs, func(r result) float64 { return float64(r.Events) }), rs[0].Changes,
				medianOf(rs, func(r result) float64 { return float64(r.Duplicate) }))
		}
	}
	if len(paced) > 0 {
		fmt.Fprintf(&b, "\n### Latency at %d changes/s (%d ConfigMaps, %d changes), observation to sink receipt; medians of %d runs\n\n", o.latencyRate, o.latencyN, 3*o.latencyN, o.runs)
		b.WriteString("| consumer | p50 | p99 | max | p99 added | p99 updated | p99 deleted | delivered / changes |\n|---|---|---|---|---|---|---|---|\n")
		for _, c := range order {
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
		b.WriteString(memReport(mem))
	}
	return b.String()
}

// memReport gives, per consumer and object count, the median heap and RSS
// and the cost per object: the growth over the empty cache divided by the
// count, and its ratio to the plain dynamic informer's.
func memReport(mem []memResult) string {
	type key struct {
		c string
		n int
	}
	heap, rss := map[key][]float64{}, map[key][]float64{}
	var counts []int
	for _, m := range mem {
		k := key{m.Consumer, m.Objects}
		heap[k] = append(heap[k], float64(m.HeapBytes))
		rss[k] = append(rss[k], float64(m.RSSBytes))
		if !slices.Contains(counts, m.Objects) {
			counts = append(counts, m.Objects)
		}
	}
	var b strings.Builder
	b.WriteString("\n### Memory with the ConfigMaps cached (after the initial view was delivered; heap after a forced GC)\n\n")
	b.WriteString("| consumer | objects | heap | RSS | heap per object | ratio to informer | RSS per object | ratio to informer |\n|---|---|---|---|---|---|---|---|\n")
	for _, n := range counts {
		if n == 0 {
			continue
		}
		per := func(m map[key][]float64, c string) float64 {
			return (median(m[key{c, n}]) - median(m[key{c, 0}])) / float64(n)
		}
		for _, c := range memConsumers {
			k := key{c, n}
			if len(heap[k]) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %.1f MiB | %.1f MiB | %.0f B | %.2f | %.0f B | %.2f |\n", c, n,
				median(heap[k])/(1<<20), median(rss[k])/(1<<20),
				per(heap, c), per(heap, c)/per(heap, "informer"), per(rss, c), per(rss, c)/per(rss, "informer"))
		}
	}
	return b.String()
}

package bridge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus/promhttp"

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
		if (ruleName == "" || rule.Name == ruleName) && slices.Contains(rule.Sinks, sink) {
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

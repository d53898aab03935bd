package bridge

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/kubebridge/kubebridge/internal/admin"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// The bridge as the admin API sees it (admin.Target).

// AdminHandler serves the bridge's admin endpoints (package admin):
// /healthz, /readyz, /metrics and /replay. It can be served before Start
// returns (readyz then says 503).
func (b *Bridge) AdminHandler() http.Handler { return b.admin.Handler() }

// target is the Bridge as admin.Target.
type target Bridge

// Checks are what /readyz reports: the caches, then each sink that runs
// on this replica (a destination failing as a whole, a connection closed
// for good), then each rule that waits.
func (t *target) Checks() []admin.Check {
	b := (*Bridge)(t)
	var checks []admin.Check
	switch {
	case !b.started.Load() || !b.Ready():
		checks = append(checks, admin.Check{Name: "informers", Err: errors.New("not ready: caches syncing or checkpoint not reconciled")})
	default:
		checks = append(checks, admin.Check{Name: "informers"})
	}
	// Sharded, a sink has a delivery per shard held: one check per sink,
	// failing with the first that fails.
	var order []string
	health := map[string]error{}
	for _, d := range b.Deliveries() {
		if _, seen := health[d.Name]; !seen {
			order = append(order, d.Name)
			health[d.Name] = nil
		}
		if err := d.Healthy(); err != nil && health[d.Name] == nil {
			health[d.Name] = err
		}
	}
	for _, name := range order {
		checks = append(checks, admin.Check{Name: "sink " + name, Err: health[name]})
	}
	for _, w := range b.waitingRules() {
		checks = append(checks, admin.Check{Name: "rule " + w.rule, Err: w.err, Degraded: true})
	}
	return checks
}

// ReplayRules lists the rules a replay of sink covers (rule only, if set).
func (t *target) ReplayRules(sink, rule string) ([]string, error) {
	b := (*Bridge)(t)
	if !b.started.Load() || !slices.ContainsFunc(b.deliverers(), func(d *deliverer) bool { return d.running(sink) != nil }) {
		return nil, fmt.Errorf("no running sink %q", sink)
	}
	rules, _ := b.snapshot()
	var out []string
	for _, r := range rules {
		if (rule == "" || r.Name == rule) && slices.Contains(r.Sinks, sink) {
			out = append(out, r.Name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no rule %q delivers to sink %q", rule, sink)
	}
	return out, nil
}

// Replay reconciles sink's view of rule with kbreplay "resync": every
// object in it is sent again (the one transition path, view.Sync).
func (t *target) Replay(sink, rule string) int {
	b := (*Bridge)(t)
	n := 0
	b.readingCaches(func() {
		for _, d := range b.deliverers() {
			if s := d.running(sink); s != nil { // else stopped delivering meanwhile
				n += d.reconcile(s, rule, event.ReplayResync)
			}
		}
	})
	return n
}

package delivery

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// turned reports whether g.turn returns within a moment (the dispatcher
// may start a batch).
func turned(g *gate) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	return g.turn(ctx, nil) == nil
}

// A destination failing as a whole is probed once its backoff (or a
// longer Throttle delay) has passed on the engine's clock; an answer opens
// the gate. One object's first failure is not the destination's: it is
// not reported unhealthy, and the next probe is due at once.
func TestGate(t *testing.T) {
	clk := fakeClock()
	log := slog.New(slog.DiscardHandler)
	g := &gate{backoff: backoff.Backoff{Initial: time.Second, Max: time.Minute}, clock: clk}
	if !turned(g) || g.health(clk.Now()) != nil {
		t.Fatal("a new gate is closed")
	}

	g.fail(clk.Now(), errors.New("500"), false, 0, log)
	if !g.isFailing() || g.health(clk.Now()) != nil || !turned(g) {
		t.Errorf("one object's first failure: failing %v, health %v; want probed at once, healthy", g.isFailing(), g.health(clk.Now()))
	}

	down := sinks.Unavailable(errors.New("connection refused"))
	g.fail(clk.Now(), down, true, 10*time.Second, log) // a Throttle-like delay beyond the backoff
	if err := g.health(clk.Now()); err == nil || !strings.Contains(err.Error(), "fails") {
		t.Errorf("failing as a whole: health %v", err)
	}
	if turned(g) {
		t.Error("probed before its delay")
	}
	clk.Step(9 * time.Second)
	if turned(g) {
		t.Error("probed before the 10 s delay")
	}
	clk.Step(time.Second)
	if !turned(g) {
		t.Error("not probed once the delay passed")
	}

	g.begin() // a probe in flight: nothing else starts, whenever due
	clk.Step(time.Hour)
	if turned(g) {
		t.Error("a second batch started beside the probe")
	}
	g.end()
	g.ok(clk.Now(), log)
	if g.isFailing() || g.health(clk.Now()) != nil || !turned(g) {
		t.Error("an answer did not open the gate")
	}
}

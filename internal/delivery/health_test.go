package delivery

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Healthy reports a destination that fails as a whole, with its class and
// not the error's text (it is served on the open /readyz), and turns
// healthy again once the destination takes events.
func TestHealthyFollowsTheDestination(t *testing.T) {
	f := &flaky{failures: 40, err: sinks.Destination(sinks.ReasonUnauthorized, errors.New("POST http://x: 401: secret-ish body"))}
	cfg := sinkConfig()
	cfg.Retry = config.Retry{InitialInterval: config.Duration(20 * time.Millisecond), MaxInterval: config.Duration(20 * time.Millisecond)}
	d := New(Options{Config: cfg, Sink: f})
	stop := run(t, d)
	defer stop()
	if err := d.Healthy(); err != nil {
		t.Fatalf("Healthy before any delivery = %v", err)
	}
	d.Offer(ev("a", "1", event.Added))
	d.Offer(ev("b", "2", event.Added))
	waitFor(t, func() bool { return d.Healthy() != nil })
	err := d.Healthy()
	if !strings.Contains(err.Error(), "unauthorized") || strings.Contains(err.Error(), "secret-ish") {
		t.Errorf("Healthy = %q, want the reason without the answer's text", err)
	}
	waitFor(t, func() bool { return len(f.received()) == 2 })
	if err := d.Healthy(); err != nil {
		t.Errorf("Healthy after the destination took the events = %v", err)
	}
}

// healthSink is a sink with its own check.
type healthSink struct{ flaky }

func (*healthSink) Healthy() error { return errors.New("connection closed") }

func TestHealthyAsksTheSink(t *testing.T) {
	d := New(Options{Config: sinkConfig(), Sink: &healthSink{}})
	if err := d.Healthy(); err == nil || err.Error() != "connection closed" {
		t.Errorf("Healthy = %v, want the sink's own check", err)
	}
}

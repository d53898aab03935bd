package delivery

import (
	"errors"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func policy(initial, maxInterval, maxElapsed time.Duration) retryPolicy {
	return retryPolicy{
		Retry:   config.Retry{InitialInterval: config.Duration(initial), MaxInterval: config.Duration(maxInterval), MaxElapsed: config.Duration(maxElapsed)},
		backoff: backoff.Backoff{Initial: initial, Max: maxInterval},
	}
}

// A parked object waits its backoff; one refused permanently waits
// maxInterval; a Throttle's delay is honoured up to maxInterval.
func TestRetryWait(t *testing.T) {
	r := policy(10*time.Millisecond, time.Second, 0)
	plain := errors.New("500")
	for _, c := range []struct {
		name     string
		failures int
		cause    error
		want     time.Duration
	}{
		{"first failure", 1, plain, 10 * time.Millisecond},
		{"third failure", 3, plain, 40 * time.Millisecond},
		{"backoff capped", 20, plain, time.Second},
		{"refused permanently", 1, sinks.Permanent(plain), time.Second},
		{"throttled longer than the backoff", 1, sinks.Throttle(plain, 300*time.Millisecond), 300 * time.Millisecond},
		{"throttled beyond maxInterval", 1, sinks.Throttle(plain, time.Minute), time.Second},
		{"throttled shorter than the backoff", 5, sinks.Throttle(plain, time.Millisecond), 160 * time.Millisecond},
	} {
		if got := r.wait(c.failures, c.cause); got != c.want {
			t.Errorf("%s: wait %s, want %s", c.name, got, c.want)
		}
	}
}

// maxElapsed counts from the first failure; without it nothing expires.
func TestRetryExpired(t *testing.T) {
	now := time.Unix(1000, 0)
	r := policy(time.Millisecond, time.Second, time.Minute)
	if r.expired(time.Time{}, now) {
		t.Error("a batch that never failed expired")
	}
	if r.expired(now.Add(-time.Minute), now) || !r.expired(now.Add(-time.Minute-time.Millisecond), now) {
		t.Error("maxElapsed of a minute: expired at the wrong time")
	}
	if r := policy(time.Millisecond, time.Second, 0); r.expired(now.Add(-time.Hour), now) {
		t.Error("expired without a maxElapsed")
	}
}

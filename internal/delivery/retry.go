package delivery

import (
	"time"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// retryPolicy is the sink's retry config: how long a parked object waits
// before its next attempt, and when it has failed for too long.
type retryPolicy struct {
	config.Retry
	backoff backoff.Backoff // the intervals: the wait after each failure
}

// wait is how long an object that failed failures times, the last with
// cause, waits before its retry (jitter not included): its backoff; the
// retry maxInterval when refused permanently (only a newer state, or a
// change at the destination, can help); at least a Throttle's delay, up
// to maxInterval.
func (r *retryPolicy) wait(failures int, cause error) time.Duration {
	wait := r.backoff.Wait(failures)
	if sinks.IsPermanent(cause) {
		return max(r.MaxInterval.D(), r.InitialInterval.D())
	}
	if t := sinks.ThrottleDelay(cause); t > wait {
		wait = min(t, max(r.MaxInterval.D(), wait))
	}
	return wait
}

// expired says whether a batch failing since since has failed for longer
// than retry.maxElapsed at now (never without one).
func (r *retryPolicy) expired(since, now time.Time) bool {
	return r.MaxElapsed > 0 && !since.IsZero() && now.Sub(since) > r.MaxElapsed.D()
}

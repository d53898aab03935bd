// Package outcome holds the outcome classes of a send that both a sink
// (package sinks) and an exec plugin (package plugin) answer with. It
// imports only the standard library, so that a plugin binary built on
// package plugin stays small (package sinks brings the event and config
// packages, and with them client-go's types); package sinks re-exports
// every class here under the same name.
package outcome

import (
	"errors"
	"time"
)

// permanentError marks an error retrying cannot fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying because of the event itself
// (HTTP 400, 413 for one event, 415, 422; an event too large for NATS; a
// subject that cannot be published): the same payload will be refused
// again. The delivery hands it to the sink's dead-letter; without one it
// parks the object and retries at the retry maxInterval, never recording
// it as delivered. A multi-event Send refused as a whole with a Permanent
// error is split until the culprit is alone, so a Permanent error for a
// batch means "one of these", not "all of these".
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// throttleError asks for a pause before the next attempt (e.g. Retry-After).
type throttleError struct {
	err   error
	delay time.Duration
}

func (e throttleError) Error() string { return e.err.Error() }
func (e throttleError) Unwrap() error { return e.err }

// Throttle marks err as retryable no sooner than after d: the destination
// asked for a pause (an HTTP Retry-After, an exec plugin's retryAfter).
func Throttle(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return throttleError{err, d}
}

// ThrottleDelay is the pause a Throttle error asks for, 0 if none.
func ThrottleDelay(err error) time.Duration {
	var te throttleError
	if errors.As(err, &te) {
		return te.delay
	}
	return 0
}

// IsThrottle reports whether err was marked with Throttle.
func IsThrottle(err error) bool {
	var t throttleError
	return errors.As(err, &t)
}

package sinks

import "errors"

// objectTargetError marks a refusal about where one event's request went.
type objectTargetError struct{ err error }

func (e objectTargetError) Error() string { return e.err.Error() }
func (e objectTargetError) Unwrap() error { return e.err }

// ObjectTarget marks a Destination refusal (401, 403, 404, 410, 3xx) as
// being about the target this event's request was sent to, when the sink
// computes that target from the event (a path, query or header built from
// the object): the receiver said something about that object's resource,
// not about the destination. The delivery then treats it as the object's
// own failure, as it does a 500 for one payload: the object is parked
// alone with its own backoff (and dead-lettered after retry.maxElapsed),
// its reason is still counted, and the other objects flow. Without it, an
// object author could stop a sink by naming an object so that its request
// gets a 404.
func ObjectTarget(err error) error {
	if err == nil {
		return nil
	}
	return objectTargetError{err}
}

// IsObjectTarget reports whether err was marked with ObjectTarget.
func IsObjectTarget(err error) bool {
	var o objectTargetError
	return errors.As(err, &o)
}

package sinks

// Why a sink handled an event without a request: the event counts as
// delivered (nothing is owed to the destination for it) but nothing went
// out, so a user asking "why no message?" needs it counted apart
// (kubebridge_sink_withheld_total{reason}).
const (
	// WithheldWhen: the request's when was false for the event.
	WithheldWhen = "when"
	// WithheldFor: the object had not been in the view for the request's
	// for yet; a replay asks again.
	WithheldFor = "for"
)

// WithheldReasons are the reasons a WithholdReporter is asked about.
var WithheldReasons = []string{WithheldWhen, WithheldFor}

// WithholdReporter is implemented by sinks that may handle an event
// without a request: Withheld is how many they handled so, by reason.
type WithholdReporter interface {
	Withheld(reason string) int64
}

// DigestGroupReporter is implemented by sinks that render digests:
// DigestGroupErrors is how many events they put in the default group
// because the digest's groupBy failed on them
// (kubebridge_sink_digest_group_errors_total).
type DigestGroupReporter interface {
	DigestGroupErrors() int64
}

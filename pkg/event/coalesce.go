package event

// Coalesce merges a pending event with a newer one for the same
// incarnation of an object (QueueKey: a replaced object's deleted and the
// new one's added are never merged). It is what a sink's queue merges
// with on overflow, and what a retry folds an object's events with. The
// newer state wins, but an object the consumer has not been sent yet
// stays added, and a change that was to be sent is not made quiet by a
// newer one that is not (e.g. an update outside the rule's changed
// paths). A fresh added (the sink held nothing of the object, quiet or
// not) and its deletion cancel out: keep is false and neither is sent,
// since the object was in neither the acknowledged view nor the desired
// one. What is merged was never attempted (a retried object's events are
// marked not fresh), so neither the consumer nor the checkpoint misses
// anything.
func Coalesce(pending, newer *Event) (merged *Event, keep bool) {
	if pending.Change == Added && pending.Fresh && newer.Change == Deleted {
		return nil, false
	}
	if pending.Change == Added && newer.Change == Updated && (!pending.Quiet || newer.Quiet) {
		return Build(newer.RuleInfo(), Transition{Change: Added, Object: newer.Object(), Subject: newer.Subject, Time: newer.Time,
			Entered: pending.Entered, Stamp: pending.Stamp, Replay: newer.Replay, Fresh: pending.Fresh, Quiet: pending.Quiet, Related: newer.Related()}), true
	}
	// What merges into a pending event that is not a fresh added is not
	// fresh either: a deletion queued before it (the object left the view,
	// then came back) must still reach the consumer.
	if newer.Fresh && !(pending.Change == Added && pending.Fresh) {
		newer = newer.WithFresh(false)
	}
	if pending.Change == newer.Change && newer.Quiet && !pending.Quiet {
		return newer.WithQuiet(false), true
	}
	return newer, true
}

// Fold coalesces consecutive events of one incarnation, in order, as a
// queue coalesces on overflow: what is retried once newer events of an
// object joined the ones that failed. It returns how many merged into a
// pending one (coalesced) and how many cancelled out (two per pair).
func Fold(events []*Event) (out []*Event, coalesced, cancelled uint64) {
	out = make([]*Event, 0, len(events))
	for _, e := range events {
		if n := len(out); n > 0 && out[n-1].QueueKey() == e.QueueKey() {
			if merged, keep := Coalesce(out[n-1], e); keep {
				out[n-1] = merged
				coalesced++
			} else {
				out = out[:n-1]
				cancelled += 2
			}
			continue
		}
		out = append(out, e)
	}
	return out, coalesced, cancelled
}

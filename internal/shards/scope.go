package shards

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Renewal is this replica's side of holding one Lease, the one fence of
// every kind of ownership (a shard's Lease, the leader Lease): open while
// the start of the last successful write of the Lease is at most
// RenewDeadline ago. Another replica may take the Lease only LeaseDuration
// after it saw the Lease change, so two holders never deliver at once,
// even when this process was frozen and resumes before its loop notices.
// The clock is monotonic: the fence does not move with the wall clock.
type Renewal struct {
	base     time.Time
	deadline time.Duration
	at       atomic.Int64  // when the last successful write started, in nanos since base, +1; 0: not held
	epoch    atomic.Uint64 // the Lease's transitions as last written: the fencing token's epoch
}

// NewRenewal returns the fence of a Lease renewed within renewDeadline,
// not held yet.
func NewRenewal(renewDeadline time.Duration) *Renewal {
	return &Renewal{base: time.Now(), deadline: renewDeadline}
}

// Renewed records that a write of the Lease, at epoch, that started at
// start succeeded.
func (r *Renewal) Renewed(start time.Time, epoch uint64) {
	r.epoch.Store(epoch)
	r.at.Store(int64(start.Sub(r.base)) + 1)
}

// End closes the fence: the Lease is no longer held.
func (r *Renewal) End() { r.at.Store(0) }

// Since is how long ago the last successful write started, and whether
// the Lease is held at all; never renewed, longer than any deadline.
func (r *Renewal) Since(now time.Time) (time.Duration, bool) {
	at := r.at.Load()
	if at == 0 {
		return time.Duration(math.MaxInt64), false
	}
	return now.Sub(r.base) - time.Duration(at-1), true
}

// Epoch is the Lease's transitions as this replica last wrote it.
func (r *Renewal) Epoch() uint64 { return r.epoch.Load() }

// errNotHeld is a closed fence's error for a Lease not held.
var errNotHeld = errors.New("not held by this replica")

// Check fails once the fence is closed: the Lease is not held, or its
// last renewal started more than RenewDeadline ago.
func (r *Renewal) Check() error {
	since, held := r.Since(time.Now())
	if !held {
		return errNotHeld
	}
	if since > r.deadline {
		return fmt.Errorf("lease last renewed %s ago", since.Round(time.Millisecond))
	}
	return nil
}

// Scope is one shard of the objects as this replica holds it: running
// alone, the one shard held forever (Forever); under leader election, the
// one behind the Lease; sharded, one of N (Owner.Scope). What delivers the
// shard's objects (the deliveries, the checkpoint recorder) takes it at
// construction and writes only through it.
type Scope struct {
	Shard, Shards int
	fence         func() error
	// hold bounds ctx by the holding the fence is passed under and
	// returns its epoch; nil: ctx as it is.
	hold func(ctx context.Context) (context.Context, context.CancelFunc, uint64)
}

// Forever is the scope of a replica that runs alone: one shard, held
// forever, unfenced (no other replica can have sent).
func Forever() Scope { return Scope{Shards: 1} }

// LeaseScope is the one shard held behind a Lease (leader election),
// fenced by its renewal; fence, when set, is checked instead of the
// renewal (it wraps the renewal's error).
func LeaseScope(r *Renewal, fence func() error) Scope {
	if fence == nil {
		fence = r.Check
	}
	return Scope{Shards: 1, fence: fence, hold: func(ctx context.Context) (context.Context, context.CancelFunc, uint64) {
		return ctx, func() {}, r.Epoch()
	}}
}

// Fence fails while this replica may not deliver the shard; held
// forever, never.
func (s Scope) Fence() error {
	if s.fence == nil {
		return nil
	}
	return s.fence()
}

// Hold returns ctx bounded by the holding the fence is passed under (a
// write must not outlive it, or it could land after another replica took
// the shard over) and carrying its fencing token (sinks.Fence) for
// destinations that check it. Held forever: ctx as it is. The CancelFunc
// releases its resources.
func (s Scope) Hold(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.hold == nil {
		return ctx, func() {}
	}
	ctx, release, epoch := s.hold(ctx)
	return sinks.WithFence(ctx, sinks.Fence{Shard: s.Shard, Shards: s.Shards, Epoch: epoch, Valid: s.Fence}), release
}

// Scope is shard i as this replica holds it: fenced by its Lease's
// renewal (Fence), its writes bounded by its holding (Hold).
func (o *Owner) Scope(i int) Scope {
	return Scope{Shard: i, Shards: o.opts.Shards, fence: func() error { return o.Fence(i) },
		hold: func(ctx context.Context) (context.Context, context.CancelFunc, uint64) {
			ctx, release := o.Hold(ctx, i)
			epoch, _ := HoldEpoch(ctx)
			return ctx, release, epoch
		}}
}

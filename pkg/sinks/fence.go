package sinks

import (
	"context"
	"errors"
	"fmt"
)

// Fence is the fencing token of the ownership a send runs under: the shard
// (0 when not sharded), the number of shards (0 when running alone), and
// the epoch of the shard's Lease, which every change of owner raises. A
// destination that remembers the highest epoch it saw per shard can refuse
// a write that a replica which gave the shard up sent before it knew (a
// send cut short on our side may still land: a buffer, a socket, a proxy).
// Sinks whose destination can check a write themselves (JetStream publish
// expectations, KV revisions) fence there and need no token; the others
// carry it (a webhook's Kubebridge-Fence header, under its signature).
type Fence struct {
	Shard  int
	Shards int
	Epoch  uint64
	// Valid, when set, fails once the ownership may have moved: the fence
	// on our side, computed from this process's clock when called. A sink
	// that learns from a destination's refusal what another writer wrote
	// asks it before writing on top (a context's end can come late: a
	// process frozen, then resumed before its watchdog).
	Valid func() error
}

// Check fails when the ownership f is may have moved (Valid); a zero
// Fence (running alone) never fails.
func (f Fence) Check() error {
	if f.Valid == nil {
		return nil
	}
	return f.Valid()
}

// String is the token as a header carries it: "shard=3/16;epoch=7".
func (f Fence) String() string {
	return fmt.Sprintf("shard=%d/%d;epoch=%d", f.Shard, f.Shards, f.Epoch)
}

type fenceKey struct{}

// WithFence returns ctx carrying f for the sends made under it. The
// delivery's hold sets it: the context of a send is request-scoped.
func WithFence(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceFrom returns the fencing token ctx carries; ok is false when the
// send runs under no ownership that can move (a replica running alone).
func FenceFrom(ctx context.Context) (f Fence, ok bool) {
	f, ok = ctx.Value(fenceKey{}).(Fence)
	return f, ok
}

// MayWrite fails when a send under ctx may no longer write on top of what
// another writer wrote: ctx ended, or its ownership's fence fails.
func MayWrite(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f, ok := FenceFrom(ctx); ok {
		return f.Check()
	}
	return nil
}

// ErrFenced is what a destination's refusal of a stale write wraps: another
// writer wrote the object (or the key) after the state this write was
// based on, so this writer may no longer own it. Such an event is neither
// delivered nor dead-lettered; the delivery retries it only while its own
// fence is open, and a writer that still owns the object adopts what it
// finds and writes again.
var ErrFenced = errors.New("refused by the destination's fence: written meanwhile by another writer")

// Fenced marks err as a refusal by the destination's fence (ErrFenced).
func Fenced(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrFenced, err)
}

// IsFenced reports whether err is a refusal by the destination's fence.
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// FenceReporter is implemented by sinks whose destination fences writes:
// FenceRefusals is how many writes it refused, the late ones of a Send
// that gave up included (kubebridge_sink_fence_refusals_total). A refusal
// is no loss: either the writer adopted what it found and wrote again, or
// it was a write that must not land (a replica that gave the object up).
type FenceReporter interface {
	FenceRefusals() int64
}

// TruncationReporter is implemented by sinks whose destination holds each
// object's state and stores one too large for it as a marker naming the
// object (a mirror's bucket): Truncations is how many it stored so
// (kubebridge_sink_truncated_total).
type TruncationReporter interface {
	Truncations() int64
}

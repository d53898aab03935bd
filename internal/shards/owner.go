package shards

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
)

// LabelGroup labels the Leases of one group of replicas (shard and member
// leases), so that one list reads them all.
const LabelGroup = "kubebridge.io/shards"

// labelRole says whether a Lease is a shard's or a member's.
const labelRole = "kubebridge.io/role"

// annotationInstance names the process that last wrote a Lease: an
// identity may be reused (a restarted pod keeps its name, a flag set
// twice), a process never is. A replica trusts a Lease as its own only
// when both match.
const annotationInstance = "kubebridge.io/instance"

// annotationPod is the uid of the Pod a member Lease's replica runs in
// (MemberPods).
const annotationPod = "kubebridge.io/pod-uid"

// Options configure an Owner.
type Options struct {
	// Leases is the Lease client of the namespace the group's Leases live in.
	Leases coordclient.LeaseInterface
	// Group names the replicas that share the shards: Leases <group>-shard-<i>
	// and <group>-member-<hash of identity>, labelled LabelGroup=<group>.
	Group string
	// Identity names this replica in the Leases; unique per process.
	Identity string
	// Shards is N.
	Shards int
	// LeaseDuration, RenewDeadline, RetryPeriod as in client-go's leader
	// election. Defaults 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
	// WaitOutCutSends makes a shard taken from a Lease its holder released
	// start delivering only LeaseDuration-RenewDeadline after it was
	// taken: the bound within which a send the holder cut short may still
	// land, at destinations that cannot refuse it (they do not fence). A
	// shard taken from an expired Lease has that gap already: its holder
	// stopped sending RenewDeadline after its last renewal, and the Lease
	// expires LeaseDuration after it. Asked at each take (a reload may
	// change the sinks); nil: never wait.
	WaitOutCutSends func() bool
	// Pods, when set, counts a member only when it is verifiably a
	// replica (MemberPods). Nil: every member Lease of the group counts
	// (replicas that are not Pods: tests, a bridge run by hand).
	Pods *MemberPods
}

// MemberPods makes membership verifiable. Each member shrinks every
// replica's share, so whoever may write Leases in the namespace could
// otherwise add members that take no shard, leaving shards undelivered.
// With it, a member Lease counts only when it is named after its holder
// (<group>-member-<hash of holder>), its holder names a Pod of Pods that
// exists, runs (phase Running, not being deleted) and matches Selector
// (the chart's selector labels), and the Lease carries that Pod's uid
// (annotationPod), which each replica writes from UID: a Pod's uid is
// new with every Pod, so a Lease cannot name a Pod that is gone or
// another one under the same name.
type MemberPods struct {
	Pods     coreclient.PodInterface // of the Leases' namespace
	Selector labels.Selector
	UID      string // this replica's Pod's uid
}

// Handler is what an Owner drives, per shard. Calls for one shard never
// overlap; calls for different shards may.
type Handler interface {
	// Acquired starts delivering shard: this replica holds its Lease. ctx
	// ends when it stops holding it (or at Halt): an Acquired in progress
	// returns early then. An error gives the shard back (after Release).
	Acquired(ctx context.Context, shard int) error
	// Release stops delivering shard and writes what it acknowledged: the
	// replica gives it to another (or shuts down). The Lease is renewed
	// until it returns, then released.
	Release(shard int)
	// Lost stops delivering shard at once, writing nothing: another
	// replica holds its Lease, or its Lease was written by another since
	// this replica's hold lapsed.
	Lost(shard int)
}

// Fencer is a Handler that can cut what it does for a shard short at
// once: Fenced is called, before Lost and without waiting for the shard's
// call in progress, when its Lease is lost, so that sends in flight end
// now rather than when Lost gets its turn. It must not block.
type Fencer interface {
	Fenced(shard int)
}

// Stats are an Owner's counts.
type Stats struct {
	Owned                 []int // shards held and delivering or starting, ascending (lapsed ones included)
	Lapsed                []int // of those, the ones whose renewal is overdue: fenced until renewed or lost
	Acquired, Released    uint64
	Lost, AcquireFailures uint64
	// Lapses counts holds that lapsed (a renewal overdue), Resumed those
	// of them renewed again with nobody having written the Lease between.
	Lapses, Resumed uint64
	Members         int // live replicas this one sees, itself included
}

// Owner holds a fair share of N shard Leases for this replica: every
// retry period it reads the group's Leases in one list, renews its member
// Lease and the shard Leases it holds, and compares the number it holds
// with its share of the live members (N/R, one more for the first N%R
// identities in order). It gives back what it holds beyond its share
// (Release, then the Lease) and takes free or expired shards up to it
// (Lease, then Acquired). A shard's Lease counts as expired when it did not
// change for LeaseDuration as this replica observed it (client-go's rule:
// clocks are not compared), and a holder delivers only within
// RenewDeadline of starting its last successful renewal (Fence), so two
// replicas never deliver one shard at once.
//
// A renewal overdue past RenewDeadline closes the fence (Fence fails, Hold
// contexts end) but does not drop the shard: the hold has lapsed. The
// Handler keeps its queue, sending nothing. Once the group's Leases can be
// read again, a shard whose Lease this process still wrote last (its
// identity and its instance, annotationInstance) is renewed, conditionally
// on that version: nobody else held the shard in between, and delivery
// resumes where it stopped, nothing lost. If anyone else wrote it (another
// replica took it after it expired), the shard is Lost. An apiserver
// outage thus costs every replica its fences, not its queues.
type Owner struct {
	opts   Options
	h      Handler
	logger *slog.Logger
	member string // this replica's member Lease
	// instance is unique to this process: written into every Lease it
	// writes (annotationInstance).
	instance string
	renewals []*Renewal       // per shard: its fence
	seen     map[string]*seen // by Lease name: its last version and when it changed (the loop's)
	// holds, per shard, is cancelled when the hold lapses or ends: sends
	// under it stop then (Hold). Replaced when a hold starts or resumes.
	holds  []hold
	lastOK time.Time // when the last list succeeded (the loop's)
	// pods are the running Pods of the replicas by name, as last listed
	// (Options.Pods; the loop's): a failed list keeps the last ones.
	pods map[string]*corev1.Pod

	mu     sync.Mutex
	claims map[int]*claim
	// busy holds, per shard, a channel closed when the shard's last
	// Handler call returned: calls for one shard never overlap, even
	// across claims (a shard lost and taken again waits for its Lost).
	busy   []chan struct{}
	halted bool

	acquired, released, lost, failures, lapses, resumed atomic.Uint64
	members                                             atomic.Int64

	stop    context.CancelFunc
	loop    sync.WaitGroup // the loop
	changes sync.WaitGroup // Acquired, Release and Lost calls
}

// seen is what a replica observed of one Lease.
type seen struct {
	version string
	at      time.Time
}

// claim is a shard this replica holds.
type claim struct {
	lease     *coordinationv1.Lease // as last written by this replica
	releasing bool
	lapsed    bool               // renewal overdue: fenced until renewed from lease's version, or lost
	cancel    context.CancelFunc // ends Acquired's ctx
}

// hold is the context sends for one shard run under.
type hold struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	epoch  uint64 // the Lease's transitions when taken: the fencing token's epoch
}

// errLapsed ends the sends of a shard whose hold lapsed.
var errLapsed = errors.New("the shard's lease was not renewed in time")

// New returns an Owner of opts's shards driving h; Run starts it.
func New(opts Options, h Handler) (*Owner, error) {
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Shards < 1 || opts.Shards > MaxShards {
		return nil, fmt.Errorf("shards: %d is not between 1 and %d", opts.Shards, MaxShards)
	}
	if msgs := validation.IsValidLabelValue(opts.Group); len(msgs) > 0 || opts.Group == "" {
		return nil, fmt.Errorf("shard lease group %q: must be a label value (at most 63 characters): %s", opts.Group, strings.Join(msgs, "; "))
	}
	if opts.Identity == "" {
		return nil, errors.New("shard owner: an identity is required")
	}
	if opts.Pods != nil && (opts.Pods.Pods == nil || opts.Pods.Selector == nil || opts.Pods.UID == "") {
		return nil, errors.New("shard owner: verifying members by their Pods needs the Pods' client, their selector and this replica's Pod uid")
	}
	o := &Owner{
		opts: opts, h: h, logger: opts.Logger.With("identity", opts.Identity),
		member:   fmt.Sprintf("%s-member-%016x", opts.Group, Hash(opts.Identity)), // memberLease
		instance: newInstance(),
		renewals: make([]*Renewal, opts.Shards),
		seen:     map[string]*seen{},
		claims:   map[int]*claim{},
		busy:     make([]chan struct{}, opts.Shards),
		holds:    make([]hold, opts.Shards),
		stop:     func() {},
	}
	for i := range o.busy {
		o.renewals[i] = NewRenewal(opts.RenewDeadline)
		o.busy[i] = closed
		o.holds[i] = endedHold
	}
	return o, nil
}

// newInstance returns a random name for this process.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// mine reports whether l was last written by this process.
func (o *Owner) mine(l *coordinationv1.Lease) bool {
	return l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == o.opts.Identity &&
		l.Annotations[annotationInstance] == o.instance
}

// closed is a closed channel: no change in progress.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// endedHold is the hold of a shard not held.
var endedHold = func() hold {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("the shard is not held by this replica"))
	return hold{ctx: ctx, cancel: cancel}
}()

// openHold starts a new hold for shard i under l, as written; o.mu held.
func (o *Owner) openHold(i int, l *coordinationv1.Lease) {
	ctx, cancel := context.WithCancelCause(context.Background())
	o.holds[i] = hold{ctx: ctx, cancel: cancel, epoch: Epoch(l)}
}

type epochKey struct{}

// HoldEpoch returns the epoch of the hold a context of Hold runs under.
func HoldEpoch(ctx context.Context) (uint64, bool) {
	e, ok := ctx.Value(epochKey{}).(uint64)
	return e, ok
}

// Epoch is a shard Lease's epoch: its transitions, which every change of
// holder raises (leaseFor), and which the apiserver's optimistic
// concurrency makes unique to one holding.
func Epoch(l *coordinationv1.Lease) uint64 {
	if l == nil || l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 0 {
		return 0
	}
	return uint64(*l.Spec.LeaseTransitions)
}

// endHold ends shard i's hold with cause; o.mu held.
func (o *Owner) endHold(i int, cause error) {
	o.holds[i].cancel(cause)
	o.holds[i] = endedHold
}

// Hold returns ctx cut short (with the cause) when this replica's hold on
// shard lapses or ends: a send to a destination must not outlive the
// fence it passed, or it could reach the destination after another
// replica took the shard over. ctx carries the hold's epoch (HoldEpoch),
// for a fencing token destinations can check. The CancelFunc releases its
// resources.
func (o *Owner) Hold(ctx context.Context, shard int) (context.Context, context.CancelFunc) {
	o.mu.Lock()
	hd := o.holds[shard]
	o.mu.Unlock()
	h := hd.ctx
	ctx = context.WithValue(ctx, epochKey{}, hd.epoch)
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(h, func() { cancel(context.Cause(h)) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

// mark records that a write of shard i's Lease l that started at start
// succeeded.
func (o *Owner) mark(i int, l *coordinationv1.Lease, start time.Time) {
	o.renewals[i].Renewed(start, Epoch(l))
}

// sinceRenewal is how long ago shard i's last successful write started,
// and whether it is held.
func (o *Owner) sinceRenewal(i int, now time.Time) (time.Duration, bool) {
	return o.renewals[i].Since(now)
}

// ShardLease is the name of shard i's Lease in group.
func ShardLease(group string, i int) string { return group + "-shard-" + strconv.Itoa(i) }

// Fence fails while this replica may not deliver shard: it does not hold
// its Lease, or its last renewal started more than RenewDeadline ago.
func (o *Owner) Fence(shard int) error {
	err := o.renewals[shard].Check()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNotHeld):
		return fmt.Errorf("shard %d is not held by this replica", shard)
	}
	return fmt.Errorf("shard %d: %w", shard, err)
}

// Run starts the loop; it runs until Release. A watchdog beside it stops
// delivering a shard as soon as its renewal is overdue, whatever the loop
// is waiting for (a slow list).
func (o *Owner) Run() {
	ctx, cancel := context.WithCancel(context.Background())
	o.stop = cancel
	o.loop.Add(2)
	go func() {
		defer o.loop.Done()
		t := time.NewTicker(max(o.opts.RetryPeriod/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				o.expire(now)
			}
		}
	}()
	go func() {
		defer o.loop.Done()
		first := true
		for {
			o.tick(ctx, first)
			first = false
			select {
			case <-ctx.Done():
				return
			case <-time.After(o.opts.RetryPeriod):
			}
		}
	}()
}

// Halt takes no shard from now on and cuts Acquired calls in progress
// short, waiting for them. Held shards stay held (renewed) until Release:
// the caller stops delivering them meanwhile.
func (o *Owner) Halt() {
	o.mu.Lock()
	o.halted = true
	for _, c := range o.claims {
		c.cancel()
	}
	busy := slices.Clone(o.busy)
	o.mu.Unlock()
	for _, b := range busy {
		<-b
	}
}

// Release ends the loop, waits for every change in progress and releases
// every Lease this replica holds, its member Lease included, so that the
// others take its shards at once. Call it after Halt, once the caller
// stopped delivering.
func (o *Owner) Release() {
	o.stop()
	o.loop.Wait()
	o.changes.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), o.opts.RenewDeadline)
	defer cancel()
	o.mu.Lock()
	claims := o.claims
	o.claims = map[int]*claim{}
	o.mu.Unlock()
	for i, c := range claims {
		o.renewals[i].End()
		o.mu.Lock()
		o.endHold(i, errors.New("this replica released the shard"))
		o.mu.Unlock()
		o.releaseLease(ctx, i, c.lease)
	}
	if err := o.opts.Leases.Delete(ctx, o.member, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		o.logger.Warn("could not delete the member lease; the others count this replica until it expires", "lease", o.member, "error", err)
	}
}

// Stats returns the counts.
func (o *Owner) Stats() Stats {
	o.mu.Lock()
	owned := make([]int, 0, len(o.claims))
	var lapsed []int
	for i, c := range o.claims {
		if !c.releasing {
			owned = append(owned, i)
			if c.lapsed {
				lapsed = append(lapsed, i)
			}
		}
	}
	o.mu.Unlock()
	slices.Sort(owned)
	slices.Sort(lapsed)
	return Stats{Owned: owned, Lapsed: lapsed, Acquired: o.acquired.Load(), Released: o.released.Load(), Lost: o.lost.Load(),
		AcquireFailures: o.failures.Load(), Lapses: o.lapses.Load(), Resumed: o.resumed.Load(), Members: int(o.members.Load())}
}

// tick is one round: read, renew, rebalance. The first round only renews
// and observes: a replica learns who is alive before taking its share.
func (o *Owner) tick(ctx context.Context, first bool) {
	lctx, cancel := context.WithTimeout(ctx, o.opts.RenewDeadline/2)
	list, err := o.opts.Leases.List(lctx, metav1.ListOptions{LabelSelector: LabelGroup + "=" + o.opts.Group})
	cancel()
	now := time.Now()
	if err != nil {
		if ctx.Err() == nil {
			o.logger.Warn("cannot read the shard leases; retrying", "error", err)
		}
		o.expire(now)
		return
	}
	// What this replica did not see, it cannot count as unchanged: the
	// time it could not list (beyond one period) is taken off every
	// observation, or after an outage every Lease would look expired and
	// every replica would take every shard.
	if blind := now.Sub(o.lastOK) - 2*o.opts.RetryPeriod; !o.lastOK.IsZero() && blind > 0 {
		for _, s := range o.seen {
			s.at = s.at.Add(blind)
		}
	}
	o.lastOK = now
	leases := map[string]*coordinationv1.Lease{}
	for i := range list.Items {
		l := &list.Items[i]
		leases[l.Name] = l
		if s := o.seen[l.Name]; s == nil || s.version != l.ResourceVersion {
			o.seen[l.Name] = &seen{version: l.ResourceVersion, at: now}
		}
	}
	for name := range o.seen {
		if leases[name] == nil {
			delete(o.seen, name)
		}
	}
	o.renewMember(ctx, leases[o.member])
	o.renewShards(ctx, leases)
	o.expire(time.Now())
	members := o.liveMembers(ctx, leases, now)
	o.members.Store(int64(len(members)))
	if first || ctx.Err() != nil {
		return
	}
	o.rebalance(ctx, leases, members, now)
	o.collect(ctx, leases, now)
}

// writeTimeout bounds one Lease write: a slow one must not hold up the
// renewal of the others past their deadline.
func (o *Owner) writeTimeout() time.Duration { return max(o.opts.RenewDeadline/4, time.Second) }

// expired reports whether Lease l did not change for LeaseDuration as
// this replica observed it.
func (o *Owner) expired(l *coordinationv1.Lease, now time.Time) bool {
	s := o.seen[l.Name]
	return s != nil && now.Sub(s.at) >= o.opts.LeaseDuration
}

// liveMembers returns the identities of the live members, sorted, this
// replica included: the holders of member Leases that changed within
// LeaseDuration and, with Options.Pods, are verifiably replicas.
func (o *Owner) liveMembers(ctx context.Context, leases map[string]*coordinationv1.Lease, now time.Time) []string {
	ids := []string{o.opts.Identity}
	var candidates []*coordinationv1.Lease
	for _, l := range leases {
		if l.Labels[labelRole] != "member" || l.Name == o.member || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || o.expired(l, now) {
			continue
		}
		candidates = append(candidates, l)
	}
	if o.opts.Pods != nil && len(candidates) > 0 {
		o.listPods(ctx)
	}
	for _, l := range candidates {
		id := *l.Spec.HolderIdentity
		if o.opts.Pods != nil && !o.verified(l, id) {
			continue
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// listPods reads the running Pods of the replicas (Options.Pods) into
// o.pods; on failure the last ones stay, so that an apiserver hiccup does
// not make this replica alone.
func (o *Owner) listPods(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, o.writeTimeout())
	defer cancel()
	list, err := o.opts.Pods.Pods.List(lctx, metav1.ListOptions{LabelSelector: o.opts.Pods.Selector.String()})
	if err != nil {
		if ctx.Err() == nil {
			o.logger.Warn("cannot list the replicas' pods to verify the shard members; counting the last ones seen", "error", err)
		}
		return
	}
	o.pods = make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && o.opts.Pods.Selector.Matches(labels.Set(p.Labels)) {
			o.pods[p.Name] = p
		}
	}
}

// verified reports whether member Lease l of holder id is a replica's:
// named after id, id a running Pod of the replicas whose uid l carries.
func (o *Owner) verified(l *coordinationv1.Lease, id string) bool {
	p := o.pods[id]
	ok := l.Name == o.memberLease(id) && p != nil && l.Annotations[annotationPod] != "" && l.Annotations[annotationPod] == string(p.UID)
	if !ok {
		o.logger.Debug("not counting a member lease: it names no running replica pod with its uid", "lease", l.Name, "holder", id)
	}
	return ok
}

// memberLease is the name of the member Lease of replica id.
func (o *Owner) memberLease(id string) string {
	return fmt.Sprintf("%s-member-%016x", o.opts.Group, Hash(id))
}

// share is this replica's fair share of the shards among members.
func (o *Owner) share(members []string) int {
	n, r := o.opts.Shards, len(members)
	idx := slices.Index(members, o.opts.Identity)
	share := n / r
	if idx < n%r {
		share++
	}
	return share
}

// leaseFor is a Lease of this group held by this replica, renewed now.
func (o *Owner) leaseFor(name, role string, base *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{}
	if base != nil {
		l = base.DeepCopy()
	}
	l.Name = name
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelGroup], l.Labels[labelRole] = o.opts.Group, role
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[annotationInstance] = o.instance
	id := o.opts.Identity
	secs := int32(o.opts.LeaseDuration / time.Second)
	t := metav1.NewMicroTime(now)
	if !o.mine(base) {
		// Every new holding raises the transitions, a released Lease's
		// too: they are the shard's epoch (Epoch), which a fencing token
		// carries and a destination may compare.
		l.Spec.AcquireTime = &t
		transitions := int32(0)
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions
		}
		transitions++
		l.Spec.LeaseTransitions = &transitions
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &id, &secs, &t
	return l
}

// write creates l (base nil) or updates it from base's version.
func (o *Owner) write(ctx context.Context, l *coordinationv1.Lease, create bool) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, o.writeTimeout())
	defer cancel()
	if create {
		return o.opts.Leases.Create(ctx, l, metav1.CreateOptions{})
	}
	return o.opts.Leases.Update(ctx, l, metav1.UpdateOptions{})
}

// renewMember writes this replica's member Lease, with its Pod's uid when
// members are verified (Options.Pods).
func (o *Owner) renewMember(ctx context.Context, current *coordinationv1.Lease) {
	l := o.leaseFor(o.member, "member", current, time.Now())
	if o.opts.Pods != nil {
		l.Annotations[annotationPod] = o.opts.Pods.UID
	}
	if _, err := o.write(ctx, l, current == nil); err != nil && ctx.Err() == nil {
		o.logger.Warn("cannot renew the member lease", "lease", o.member, "error", err)
	}
}

// renewShards renews the Lease of every shard held, conditionally on the
// version just read. One whose Lease this process did not write last
// (another replica holds it, or took it and gave it back, or another
// process under this identity did) is lost. A lapsed one whose Lease this
// process still wrote last resumes: every write of this process is
// conditional on a version it wrote itself (renewals) or on a free or
// expired one (take, never for a shard it holds), so nobody else held the
// shard in between.
func (o *Owner) renewShards(ctx context.Context, leases map[string]*coordinationv1.Lease) {
	o.mu.Lock()
	held := make(map[int]*claim, len(o.claims))
	for i, c := range o.claims {
		held[i] = c
	}
	o.mu.Unlock()
	// In parallel, a few at a time: one slow write must not push the
	// others past their deadline.
	sem := make(chan struct{}, renewers)
	var wg sync.WaitGroup
	for i, c := range held {
		current := leases[ShardLease(o.opts.Group, i)]
		if !o.mine(current) {
			o.lose(i, c, "another replica (or process) wrote its lease")
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			start := time.Now()
			l, err := o.write(ctx, o.leaseFor(current.Name, "shard", current, start), false)
			if err != nil { // a conflict included: the next list says who wrote it
				if ctx.Err() == nil {
					o.logger.Warn("cannot renew a shard lease", "shard", i, "error", err)
				}
				return
			}
			o.mu.Lock()
			resumed := false
			if o.claims[i] == c {
				c.lease = l
				o.mark(i, l, start)
				if since, _ := o.sinceRenewal(i, time.Now()); c.lapsed && since <= o.opts.RenewDeadline {
					c.lapsed, resumed = false, true
					o.openHold(i, l)
				}
			}
			o.mu.Unlock()
			if resumed {
				o.resumed.Add(1)
				o.logger.Info("renewed a shard's lapsed lease, which nobody wrote meanwhile; delivering it again, nothing dropped", "shard", i)
			}
		}()
	}
	wg.Wait()
}

// renewers bounds the Lease renewals in flight at once.
const renewers = 8

// expire lapses the holds of shards not renewed within RenewDeadline.
func (o *Owner) expire(now time.Time) {
	o.mu.Lock()
	var late []int
	for i, c := range o.claims {
		if since, held := o.sinceRenewal(i, now); held && since > o.opts.RenewDeadline && !c.lapsed {
			late = append(late, i)
		}
	}
	o.mu.Unlock()
	for _, i := range late {
		o.mu.Lock()
		c := o.claims[i]
		since, held := o.sinceRenewal(i, time.Now()) // renewed since the scan?
		lapse := c != nil && held && since > o.opts.RenewDeadline && !c.lapsed
		if lapse {
			c.lapsed = true
			o.endHold(i, errLapsed)
		}
		o.mu.Unlock()
		if lapse {
			o.lapses.Add(1)
			o.logger.Warn("a shard's lease was not renewed in time; its deliveries wait until it is renewed (or lost to another replica)",
				"shard", i, "lastRenewal", since.Round(time.Millisecond))
		}
	}
}

// lose stops delivering shard i at once (Lost) and forgets it.
func (o *Owner) lose(i int, c *claim, why string) {
	o.mu.Lock()
	if o.claims[i] != c {
		o.mu.Unlock()
		return
	}
	delete(o.claims, i)
	o.renewals[i].End()
	o.endHold(i, errors.New("another replica took the shard"))
	c.cancel()
	prev := o.busy[i]
	done := make(chan struct{})
	o.busy[i] = done
	o.mu.Unlock()
	if f, ok := o.h.(Fencer); ok {
		f.Fenced(i) // at once, not behind the shard's call in progress
	}
	o.lost.Add(1)
	o.logger.Warn("lost a shard; stopped delivering it", "shard", i, "reason", why)
	o.changes.Add(1)
	go func() {
		defer o.changes.Done()
		defer close(done)
		<-prev
		o.h.Lost(i)
	}()
}

// rebalance gives back what this replica holds beyond its share and
// takes free shards up to it.
func (o *Owner) rebalance(ctx context.Context, leases map[string]*coordinationv1.Lease, members []string, now time.Time) {
	share := o.share(members)
	o.mu.Lock()
	if o.halted {
		o.mu.Unlock()
		return
	}
	var active []int
	for i, c := range o.claims {
		if !c.releasing {
			active = append(active, i)
		}
	}
	slices.Sort(active)
	o.mu.Unlock()
	if extra := len(active) - share; extra > 0 {
		for _, i := range active[len(active)-extra:] {
			o.giveBack(i, "rebalancing", len(members))
		}
		return
	}
	want := share - len(active)
	if want <= 0 {
		return
	}
	// The shards taken in this round start together, once all are
	// claimed: a Handler that lists what is held (the informers' shard
	// selector) then lists once for all of them.
	var starts []func()
	defer func() {
		for _, start := range starts {
			start()
		}
	}()
	// Start looking at this replica's own part of the ring: replicas that
	// take shards at the same time mostly try different ones.
	idx := slices.Index(members, o.opts.Identity)
	from := idx * o.opts.Shards / len(members)
	for k := 0; k < o.opts.Shards && want > 0; k++ {
		i := (from + k) % o.opts.Shards
		o.mu.Lock()
		_, mine := o.claims[i]
		busy := o.busy[i] != closed
		if busy {
			select {
			case <-o.busy[i]:
				busy = false
			default:
			}
		}
		o.mu.Unlock()
		if mine || busy { // held, or its last change (a Lost, a Release) still running
			continue
		}
		current := leases[ShardLease(o.opts.Group, i)]
		if current != nil {
			holder := ""
			if current.Spec.HolderIdentity != nil {
				holder = *current.Spec.HolderIdentity
			}
			if holder != "" && !o.mine(current) && !o.expired(current, now) {
				continue
			}
		}
		if start := o.take(ctx, i, current, len(members)); start != nil {
			starts = append(starts, start)
			want--
		}
	}
}

// take writes shard i's Lease for this replica (conditional on the
// version read: of two replicas taking it, one succeeds) and claims it; it
// returns what starts delivering it (Acquired), nil if not taken. The
// caller must call it.
func (o *Owner) take(ctx context.Context, i int, current *coordinationv1.Lease, members int) func() {
	start := time.Now()
	l, err := o.write(ctx, o.leaseFor(ShardLease(o.opts.Group, i), "shard", current, start), current == nil)
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
			o.logger.Warn("cannot take a shard lease", "shard", i, "error", err)
		}
		return nil
	}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := &claim{lease: l, cancel: cancel}
	o.mu.Lock()
	if o.halted {
		o.mu.Unlock()
		cancel()
		rctx, rcancel := context.WithTimeout(ctx, o.writeTimeout())
		defer rcancel()
		o.releaseLease(rctx, i, l)
		return nil
	}
	o.claims[i] = c
	o.busy[i] = done
	o.mark(i, l, start)
	o.openHold(i, l)
	o.mu.Unlock()
	o.acquired.Add(1)
	var wait time.Duration
	if o.opts.WaitOutCutSends != nil && o.opts.WaitOutCutSends() && current != nil && (current.Spec.HolderIdentity == nil || *current.Spec.HolderIdentity == "") {
		wait = o.opts.LeaseDuration - o.opts.RenewDeadline
	}
	o.logger.Info("took a shard; delivering it", "shard", i, "members", members, "after", wait)
	o.changes.Add(1)
	return func() {
		go func() {
			defer o.changes.Done()
			if wait > 0 { // a released Lease: its holder's cut sends may still land
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-actx.Done():
				}
				t.Stop()
			}
			err := o.h.Acquired(actx, i)
			close(done)
			o.mu.Lock()
			halted := o.halted
			o.mu.Unlock()
			if err != nil && actx.Err() == nil && !halted {
				o.failures.Add(1)
				o.logger.Error("could not start delivering a shard; giving it back", "shard", i, "error", err)
				o.giveBack(i, "failed to start", members)
			}
		}()
	}
}

// giveBack stops delivering shard i (Release, renewing meanwhile), then
// releases its Lease.
func (o *Owner) giveBack(i int, why string, members int) {
	o.mu.Lock()
	c := o.claims[i]
	if c == nil || c.releasing {
		o.mu.Unlock()
		return
	}
	c.releasing = true
	c.cancel()
	prev := o.busy[i]
	done := make(chan struct{})
	o.busy[i] = done
	o.mu.Unlock()
	o.logger.Info("giving a shard back", "shard", i, "reason", why, "members", members)
	o.changes.Add(1)
	go func() {
		defer o.changes.Done()
		defer close(done)
		<-prev
		o.h.Release(i)
		o.mu.Lock()
		if o.claims[i] != c { // lost meanwhile
			o.mu.Unlock()
			return
		}
		delete(o.claims, i)
		o.renewals[i].End()
		o.endHold(i, errors.New("this replica gave the shard back"))
		lease := c.lease
		o.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), o.opts.RenewDeadline)
		defer cancel()
		o.releaseLease(ctx, i, lease)
		o.released.Add(1)
	}()
}

// releaseLease empties the holder of shard i's Lease (from the version
// last written): another replica may take it at once.
func (o *Owner) releaseLease(ctx context.Context, i int, l *coordinationv1.Lease) {
	if l == nil {
		return
	}
	for range 2 { // a renewal may have written it meanwhile: read it again once
		l = l.DeepCopy()
		empty := ""
		l.Spec.HolderIdentity = &empty
		_, err := o.opts.Leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if apierrors.IsConflict(err) {
			fresh, gerr := o.opts.Leases.Get(ctx, l.Name, metav1.GetOptions{})
			if gerr == nil && o.mine(fresh) {
				l = fresh
				continue
			}
			return // another replica holds it already
		}
		o.logger.Warn("could not release a shard lease; another replica takes it when it expires", "shard", i, "error", err)
		return
	}
}

// collect deletes member Leases that expired long ago (replicas killed
// without releasing theirs), conditional on the version observed.
func (o *Owner) collect(ctx context.Context, leases map[string]*coordinationv1.Lease, now time.Time) {
	for name, l := range leases {
		if l.Labels[labelRole] != "member" || name == o.member {
			continue
		}
		if s := o.seen[name]; s != nil && now.Sub(s.at) >= 10*o.opts.LeaseDuration {
			rv := l.ResourceVersion
			dctx, cancel := context.WithTimeout(ctx, o.writeTimeout())
			_ = o.opts.Leases.Delete(dctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
			cancel()
		}
	}
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubebridge/kubebridge/internal/backoff"
	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// sharded is ownership by shards (config sharding): a shards.Owner holds
// this replica's share of the shard Leases and drives one deliverer per
// shard held, each with the shard's own views and checkpoint keys, fenced
// by the shard's Lease. The informers are shared: notifications are
// routed by the object's shard, and where the apiserver filters by shard
// (KEP-5866) the informers list only the shards held (Reselect).
type sharded struct {
	opts   shardedOptions
	space  shards.Space
	owner  *shards.Owner
	logger *slog.Logger
	// filter: the apiserver serves shardSelector, so the informers ask
	// for the shards held; otherwise they list everything and routing
	// alone filters.
	filter bool

	store      checkpoint.Store // the KV bucket the shards' stores share
	closeStore func() error
	sinks      *sharedSinks

	mu      sync.Mutex
	byShard map[int]*shardRun
	table   atomic.Pointer[[]*deliverer] // by shard: those delivering, for the informers' goroutines

	// turn keeps reloads and shard changes apart: a shard's start (until
	// its views are loaded) and stop hold it for reading, side by side; a
	// reload holds it for writing, so it applies to every shard registered,
	// and a shard starts on the config in force.
	turn     sync.RWMutex
	selectMu sync.Mutex
	selected []bool // the shards the informers' selector asks for (filter)

	halted     chan struct{} // closed at teardown: what a Reselect or a give-back waits for at most
	haltedOnce sync.Once
	// listed closes once the informers started and synced: a shard taken
	// before waits for it (the owner runs from the process's start, so
	// that replicas starting together see each other before the lists).
	listed chan struct{}

	// fenced: every sink of the config in force fences where its writes
	// land (fencedAtDestinations), set at the start and by a reload.
	fenced        atomic.Bool
	startFailures atomic.Uint64
	starting      map[int]bool // shards held whose Acquired has not returned (s.mu)
}

// shardRun is a held shard's deliverer, whether its views were loaded
// (started) and whether it reconciled once (ready).
type shardRun struct {
	d       *deliverer
	started atomic.Bool
	ready   atomic.Bool
}

// shardedOptions are what sharding is built with: the bridge's settings
// and the parts of the bridge it shares.
type shardedOptions struct {
	Sharding config.Sharding
	Lease    LeaderElection // the shard Leases' settings, defaults applied
	Clients  func() (*Clients, error)
	Registry *sinks.Registry
	Host     *host
	Logger   *slog.Logger
	Latency  *prometheus.HistogramVec
	// CheckpointInterval is the shards' deliverers'; ReloadDrain bounds a
	// shard's drain when it is given back; SyncTimeout a relist (Reselect).
	CheckpointInterval, ReloadDrain, SyncTimeout time.Duration
	// Config returns the config in force (a reload replaces it while it
	// holds the turn for writing).
	Config func() *config.Config
	// Watched returns the rules and informers in force. Caches is held for
	// reading while views are reconciled against them, and for writing
	// while they are replaced (a reload, a Reselect).
	Watched func() ([]*filters.Rule, *informer.Informers)
	Caches  *sync.RWMutex
	// Fail ends the bridge (Bridge.Fatal).
	Fail func(error)
}

func newSharded(opts shardedOptions) *sharded {
	sc := opts.Sharding
	s := &sharded{opts: opts, space: shards.Space{N: sc.Shards, Key: sc.Key}, logger: opts.Logger, byShard: map[int]*shardRun{},
		selected: make([]bool, sc.Shards), starting: map[int]bool{}, halted: make(chan struct{})}
	s.sinks = newSharedSinks(opts.Registry, opts.Host, opts.Logger)
	s.listed = make(chan struct{})
	empty := make([]*deliverer, sc.Shards)
	s.table.Store(&empty)
	return s
}

// start opens the checkpoint bucket, checks its layout, finds whether the
// apiserver filters by shard, starts the informers and then the owner.
func (s *sharded) start(ctx, syncCtx context.Context) error {
	le, cfg := s.opts.Lease, s.opts.Config()
	clients, err := s.opts.Clients()
	if err != nil {
		return err
	}
	cs := clients.Kube
	store, ok, err := s.opts.Host.checkpointStore(ctx, cfg)
	if !ok {
		err = errors.New("sharding needs the NATS KV checkpoint (checkpoint.natsKV)")
	}
	if err != nil {
		return err
	}
	s.store, s.closeStore = store, store.Close
	if err := checkShardLayout(ctx, store, cfg); err != nil {
		return err
	}
	s.filter = apiserverFiltersShards(ctx, cs, le.Namespace, s.space)
	rules, in := s.opts.Watched()
	if s.filter {
		in.SetShardSelector(s.space.Selector(s.selected))
		s.logger.Info("the apiserver filters by shard (ShardedListAndWatch): this replica lists and watches only the shards it holds")
	} else {
		s.logger.Info("the apiserver does not filter by shard (gate ShardedListAndWatch off, or older than 1.36): every replica lists every object and keeps its shards'")
	}
	// One list and a write per shard held every retry period: client-go's
	// default 5 requests/s would starve the renewals of many shards.
	lcs, err := clients.leases(float32(2*(s.space.N+2))/float32(max(le.RetryPeriod.Seconds(), 0.1)), 2*(s.space.N+2))
	if err != nil {
		return err
	}
	s.fenced.Store(fencedAtDestinations(s.opts.Registry, cfg.Sinks))
	var members *shards.MemberPods
	if le.MemberSelector != nil {
		members = &shards.MemberPods{Pods: lcs.CoreV1().Pods(le.Namespace), Selector: le.MemberSelector, UID: le.PodUID}
	}
	s.owner, err = shards.New(shards.Options{Leases: lcs.CoordinationV1().Leases(le.Namespace), Group: le.Name, Identity: le.Identity, Shards: s.space.N,
		LeaseDuration: le.LeaseDuration, RenewDeadline: le.RenewDeadline, RetryPeriod: le.RetryPeriod, Logger: s.logger, Pods: members,
		WaitOutCutSends: s.waitOutCutSends}, s)
	if err != nil {
		return err
	}
	// The owner first: it registers this replica among the members at
	// once, so that replicas started together share the shards from the
	// start instead of the first one to finish its list taking them all.
	s.owner.Run()
	if err := in.Start(syncCtx); err != nil {
		return err
	}
	close(s.listed)
	s.logger.Info("bridge started; sharing the shards", "shards", s.space.N, "key", s.space.Key, "identity", le.Identity,
		"informers", in.Specs(), "rules", len(rules))
	return nil
}

// waitOutCutSends is shards.Options.WaitOutCutSends: whether a sink of
// the config in force does not fence at its destination.
func (s *sharded) waitOutCutSends() bool { return !s.fenced.Load() }

// fencedAtDestinations says whether every sink is fenced where its writes
// land (sinks.Factory.Fences): then a shard handed over starts delivering
// at once, its predecessor's late writes refused by the destinations.
func fencedAtDestinations(reg *sinks.Registry, cfgs []config.Sink) bool {
	for _, sc := range cfgs {
		if !reg.Fences(sc) {
			return false
		}
	}
	return true
}

// apiserverFiltersShards asks the apiserver a list with a shard selector
// that matches everything: one that applies it says so (shardInfo).
func apiserverFiltersShards(ctx context.Context, cs kubernetes.Interface, ns string, space shards.Space) bool {
	all := make([]bool, space.N)
	for i := range all {
		all[i] = true
	}
	list, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{Limit: 1, ShardSelector: space.Selector(all)})
	return err == nil && list.ShardInfo != nil
}

// Acquired starts delivering shard i (shards.Handler): its deliverer
// loads the shard's views from the checkpoint, the informers are asked
// for the shard where the apiserver filters, and once they synced the
// views are reconciled. A start that fails (the checkpoint's bucket
// unreachable for a moment) is tried again, with backoff, until it
// succeeds or the shard is no longer held: the shard stays with this
// replica, not ready, rather than bounce between replicas.
func (s *sharded) Acquired(ctx context.Context, i int) error {
	s.mu.Lock()
	s.starting[i] = true // not ready until it returns, retries included
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.starting, i)
		s.mu.Unlock()
	}()
	retry := backoff.Backoff{Initial: 200 * time.Millisecond, Max: 10 * time.Second}
	var run *shardRun
	for {
		if err := lockCtx(ctx, s.turn.TryRLock); err != nil {
			return err
		}
		cfg := s.opts.Config()
		d := newDeliverer(delivererOptions{
			Registry:           s.opts.Registry,
			Host:               s.opts.Host,
			Logger:             s.logger.With("shard", i),
			Sinks:              s.sinks,
			DeadLetter:         s.sinks.deadLetter,
			Source:             s.source(i),
			OpenStore:          s.openStore(i),
			CheckpointInterval: s.opts.CheckpointInterval,
			Scope:              s.owner.Scope(i),
			Reading:            s.reading,
			Owns: func(h sinks.HeldObject) bool {
				v := h.UID
				if s.space.Key == shards.KeyNamespace {
					v = h.Namespace
				}
				return s.space.OfHash(shards.Hash(v)) == i
			},
			Latency: s.opts.Latency,
		})
		run = &shardRun{d: d}
		s.mu.Lock()
		s.byShard[i] = run
		s.publish()
		s.mu.Unlock()
		err := d.start(ctx, cfg, cfg.Sinks)
		if err == nil {
			run.started.Store(true)
			s.turn.RUnlock()
			break
		}
		s.startFailures.Add(1)
		s.stopShard(cancelled(), i, true)
		s.turn.RUnlock()
		wait := retry.Next()
		s.logger.Error("could not start delivering a shard; trying again", "shard", i, "retryIn", wait, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	select {
	case <-s.listed:
	case <-ctx.Done():
	}
	if err := ctx.Err(); err != nil {
		return err // lost or halted meanwhile: no relist for it
	}
	if err := s.selectHeld(); err != nil {
		return err
	}
	s.opts.Caches.RLock()
	defer s.opts.Caches.RUnlock()
	_, in := s.opts.Watched()
	if err := in.WaitSynced(ctx); err != nil {
		return err
	}
	n := run.d.reconcileAll()
	run.ready.Store(true)
	s.logger.Info("delivering a shard", "shard", i, "replayedFromCheckpoint", n)
	return nil
}

// Release stops delivering shard i, draining for up to the drain timeout
// (cut short by a shutdown, which drains on its own clock) and writing
// what was acknowledged (shards.Handler).
func (s *sharded) Release(i int) {
	s.turn.RLock()
	defer s.turn.RUnlock()
	ctx, cancel := s.untilHalted(s.opts.ReloadDrain)
	defer cancel()
	s.stopShard(ctx, i, false)
}

// Fenced cuts shard i's sends in flight at once: its Lease is lost
// (shards.Fencer). Lost follows and stops the rest.
func (s *sharded) Fenced(i int) {
	s.mu.Lock()
	run := s.byShard[i]
	s.mu.Unlock()
	if run != nil {
		run.d.abort()
	}
}

// Lost stops delivering shard i at once, writing nothing
// (shards.Handler): its next owner reconciles from the checkpoint. A
// reload in progress finishes first; Fenced has cut the shard's sends
// already, and its fence refuses any other.
func (s *sharded) Lost(i int) {
	s.turn.RLock()
	defer s.turn.RUnlock()
	s.stopShard(cancelled(), i, true)
}

// lockCtx takes a lock by tryLock, or fails once ctx ends first.
func lockCtx(ctx context.Context, tryLock func() bool) error {
	for !tryLock() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// reloading holds the shards still for a reload: no shard starts or stops
// (the turn), and no Reselect lists the informers the reload stops and
// replaces. done lets them go on.
func (s *sharded) reloading(ctx context.Context) (done func(), err error) {
	if err := lockCtx(ctx, s.turn.TryLock); err != nil {
		return nil, err
	}
	s.selectMu.Lock()
	return func() {
		s.selectMu.Unlock()
		s.turn.Unlock()
	}, nil
}

// reloaded takes cfg, which a reload put in force, and asks in, the
// informers it built, for the shards the informers it replaces asked for
// (where the apiserver filters); the caches are held for writing.
func (s *sharded) reloaded(cfg *config.Config, in *informer.Informers) {
	s.fenced.Store(fencedAtDestinations(s.opts.Registry, cfg.Sinks))
	if s.filter {
		in.SetShardSelector(s.space.Selector(s.selected))
	}
}

func (s *sharded) stopShard(ctx context.Context, i int, abandon bool) {
	s.mu.Lock()
	run := s.byShard[i]
	delete(s.byShard, i)
	s.publish()
	s.mu.Unlock()
	if run == nil {
		return
	}
	left, err := run.d.stop(ctx, abandon)
	if err != nil || left > 0 {
		s.logger.Warn("stopped delivering a shard", "shard", i, "undelivered", left, "error", err)
	}
}

// stopAll stops every shard's deliverer (teardown), draining until ctx
// ends; it returns how many events were left.
func (s *sharded) stopAll(ctx context.Context) (left int, err error) {
	s.mu.Lock()
	runs := s.byShard
	s.byShard = map[int]*shardRun{}
	s.publish()
	s.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for _, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, e := run.d.stop(ctx, false)
			mu.Lock()
			left += l
			errs = append(errs, e)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return left, errors.Join(errs...)
}

// publish makes the deliverers the informers' goroutines see; s.mu held.
func (s *sharded) publish() {
	t := make([]*deliverer, s.space.N)
	for i, run := range s.byShard {
		t[i] = run.d
	}
	s.table.Store(&t)
}

// selectHeld points the informers at the shards held or being taken,
// where the apiserver filters (one relist for several shards taken at
// once: the first caller's selector covers the others). The informers are
// replaced under the caches' write lock, and every shard whose views are
// loaded is reconciled against the new caches before anyone reads them:
// an object the new list lacks was never notified as gone.
func (s *sharded) selectHeld() error {
	if !s.filter {
		return nil
	}
	s.selectMu.Lock()
	defer s.selectMu.Unlock()
	want := make([]bool, s.space.N)
	s.mu.Lock()
	for i := range s.byShard {
		want[i] = true
	}
	s.mu.Unlock()
	// And every shard claimed whose start has not registered yet: the
	// owner claims a round's shards before starting any, so one list
	// covers them all (at 100,000 objects each list costs ~20 CPU-s).
	for _, i := range s.owner.Stats().Owned {
		want[i] = true
	}
	covered := true
	for i := range want {
		if want[i] && !s.selected[i] {
			covered = false
		}
	}
	if covered {
		return nil
	}
	s.opts.Caches.Lock()
	defer s.opts.Caches.Unlock()
	_, in := s.opts.Watched()
	// The bridge's lifetime, not the shard's: once the informers are
	// replaced, the other shards need the new lists whatever becomes of
	// the shard that asked. Lists that do not come in time leave every
	// shard held without its objects: the bridge stops (its Leases
	// released, the shards go to the others).
	ctx, cancel := s.untilHalted(s.opts.SyncTimeout)
	defer cancel()
	if err := in.Reselect(ctx, s.space.Selector(want)); err != nil {
		if !s.isHalted() {
			s.opts.Fail(fmt.Errorf("listing the shards held again: %w", err))
		}
		return fmt.Errorf("listing the shards held: %w", err)
	}
	s.selected = want
	// Only the shards the new lists cover: one whose views loaded after
	// want was taken waits for its own selectHeld.
	s.mu.Lock()
	var loaded []*shardRun
	for i, run := range s.byShard {
		if want[i] && run.started.Load() {
			loaded = append(loaded, run)
		}
	}
	s.mu.Unlock()
	for _, run := range loaded {
		run.d.resync()
	}
	return nil
}

// notify routes a notification to the deliverer of the object's shard
// (and of its previous incarnation's, when it was replaced), each seeing
// only its shard's objects in the cache.
func (s *sharded) notify(n informer.Notification) {
	table := *s.table.Load()
	obj := n.Object
	if obj == nil {
		obj = n.Gone
	}
	if obj == nil {
		if item, ok, err := n.Cache.GetByKey(n.Key); err == nil && ok {
			obj, _ = item.(*unstructured.Unstructured)
		}
	}
	if obj == nil { // no state to place it by: every shard checks its own
		for i, d := range table {
			if d != nil {
				d.notify(s.scoped(n, i))
			}
		}
		return
	}
	i := s.space.Of(obj)
	if d := table[i]; d != nil {
		d.notify(s.scoped(n, i))
	}
	if n.Replaced != nil {
		if j := s.space.Of(n.Replaced); j != i && table[j] != nil {
			gone := s.scoped(n, j)
			gone.Object, gone.Meta, gone.Initial, gone.Resync = nil, event.Meta{}, false, false // read the shard's cache: the key is gone from it
			table[j].notify(gone)
		}
	}
}

// scoped is n as shard i sees it: its cache holds only the shard's objects.
func (s *sharded) scoped(n informer.Notification, i int) informer.Notification {
	n.Cache = shardCache{c: n.Cache, space: s.space, shard: i}
	return n
}

// shardCache is a cache that holds only one shard's objects.
type shardCache struct {
	c     cache.KeyGetter
	space shards.Space
	shard int
}

func (c shardCache) GetByKey(key string) (any, bool, error) {
	item, ok, err := c.c.GetByKey(key)
	if err != nil || !ok {
		return item, ok, err
	}
	if u, isU := item.(*unstructured.Unstructured); isU && c.space.Of(u) != c.shard {
		return nil, false, nil
	}
	return item, ok, err
}

// shardSource is a source as shard i sees it.
type shardSource struct {
	in    source
	space shards.Space
	shard int
}

func (s shardSource) View(r *filters.Rule) []*unstructured.Unstructured {
	return slices.DeleteFunc(s.in.View(r), func(u *unstructured.Unstructured) bool { return s.space.Of(u) != s.shard })
}

func (s shardSource) Cache(r *filters.Rule, key string) cache.KeyGetter {
	c := s.in.Cache(r, key)
	if c == nil {
		return nil
	}
	return shardCache{c: c, space: s.space, shard: s.shard}
}

func (s *sharded) source(i int) func() ([]*filters.Rule, source) {
	return func() ([]*filters.Rule, source) {
		rules, in := s.opts.Watched()
		if in == nil {
			return rules, nil
		}
		return rules, shardSource{in: in, space: s.space, shard: i}
	}
}

// openStore opens shard i's part of the shared bucket; the shared store
// stays open (closed at teardown).
func (s *sharded) openStore(i int) func(context.Context) (checkpoint.Store, func() error, error) {
	return func(context.Context) (checkpoint.Store, func() error, error) {
		return shardStore{Store: s.store, suffix: fmt.Sprintf(".shard-%d", i)}, nil, nil
	}
}

// shardStore is one shard's views in a store shared by all: its sinks'
// keys carry the shard (<sink>.shard-<i>.<rule>.<key> in the KV).
type shardStore struct {
	checkpoint.Store
	suffix string
}

func (s shardStore) Load(ctx context.Context, sink, rule string) (map[string]checkpoint.Entry, error) {
	return s.Store.Load(ctx, sink+s.suffix, rule)
}

func (s shardStore) Apply(ctx context.Context, changes []checkpoint.Change) error {
	scoped := make([]checkpoint.Change, len(changes))
	for i, c := range changes {
		c.Sink += s.suffix
		scoped[i] = c
	}
	return s.Store.Apply(ctx, scoped)
}

func (shardStore) Close() error { return nil }

// ready reports whether every shard held has reconciled.
func (s *sharded) ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.starting) > 0 {
		return false
	}
	for _, run := range s.byShard {
		if !run.ready.Load() {
			return false
		}
	}
	return true
}

// heldShard is a shard held and its deliverer.
type heldShard struct {
	shard int
	d     *deliverer
}

// held returns the shards held with their deliverers, by shard.
func (s *sharded) held() []heldShard {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]heldShard, 0, len(s.byShard))
	for i, run := range s.byShard {
		out = append(out, heldShard{shard: i, d: run.d})
	}
	slices.SortFunc(out, func(a, b heldShard) int { return a.shard - b.shard })
	return out
}

// runs returns the deliverers of the shards held, by shard.
func (s *sharded) runs() []*deliverer {
	held := s.held()
	out := make([]*deliverer, len(held))
	for k, h := range held {
		out[k] = h.d
	}
	return out
}

// layoutSink, layoutRule and layoutKey hold, in the checkpoint, how its
// views are laid out: sharding's shards and key. A sink name cannot start
// with "_", so no sink's views collide with it.
const layoutSink, layoutRule, layoutKey = "_layout", "sharding", "sharding"

// checkShardLayout refuses a checkpoint whose views were written with
// another layout (sharding on or off, another shard count or key): they
// would be read under the wrong keys, and deletions made meanwhile lost.
// A sharded config marks the bucket with its layout; no mark is "off".
func checkShardLayout(ctx context.Context, store checkpoint.Store, cfg *config.Config) error {
	want := "off"
	if sc := cfg.Sharding; sc != nil {
		want = fmt.Sprintf("%d shards by %s", sc.Shards, sc.Key)
	}
	got, err := store.Load(ctx, layoutSink, layoutRule)
	if err != nil {
		return fmt.Errorf("reading the checkpoint's layout: %w", err)
	}
	have := "off"
	if e, marked := got[layoutKey]; marked {
		have = e.Name
	}
	switch {
	case have == want:
		return nil
	case have != "off":
		return layoutError(have, want)
	}
	// An unmarked bucket: unsharded views, or none yet.
	for _, r := range cfg.Rules {
		for _, sink := range r.Sinks {
			views, err := store.Load(ctx, sink, r.Name)
			if err != nil {
				return fmt.Errorf("reading the checkpoint's layout: %w", err)
			}
			if len(views) > 0 {
				return layoutError(have, want)
			}
		}
	}
	return store.Apply(ctx, []checkpoint.Change{{Sink: layoutSink, Rule: layoutRule, Key: layoutKey, Entry: &checkpoint.Entry{UID: "-", ResourceVersion: "1", Name: want}}})
}

func layoutError(have, want string) error {
	return fmt.Errorf("the checkpoint bucket holds views written with sharding %s, and the config asks for sharding %s: "+
		"its views cannot be read that way (deletions made meanwhile would be lost); keep the sharding it was written with, "+
		"or name a new checkpoint.natsKV.bucket (every object is then delivered again)", have, want)
}

// shardedStats are a sharded bridge's counts for metrics.
func (s *sharded) stats() shards.Stats {
	if s.owner == nil {
		return shards.Stats{}
	}
	return s.owner.Stats()
}

// halt ends what a Reselect or a give-back waits for, so that an Acquired
// in progress returns, and takes no shard from now on; the held ones stay
// renewed until release.
func (s *sharded) halt() {
	s.haltedOnce.Do(func() { close(s.halted) })
	if s.owner != nil {
		s.owner.Halt()
	}
}

// deliverers are the deliverers of the shards held, by shard.
func (s *sharded) deliverers() []*deliverer { return s.runs() }

// still holds the shards still for a reload (reloading).
func (s *sharded) still(ctx context.Context) (func(), error) { return s.reloading(ctx) }

// stop stops every shard's deliverer (stopAll).
func (s *sharded) stop(ctx context.Context) (int, error) { return s.stopAll(ctx) }

// release releases the shard Leases, after the shards' last checkpoint
// writes, and closes the shared store.
func (s *sharded) release() error {
	if s.owner != nil {
		s.owner.Release()
	}
	return s.closeShared()
}

func (s *sharded) isHalted() bool {
	select {
	case <-s.halted:
		return true
	default:
		return false
	}
}

// untilHalted returns a context that ends after d, or at halting.
func (s *sharded) untilHalted(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	stop := afterClose(s.halted, cancel)
	return ctx, func() { stop(); cancel() }
}

// reading runs fn while the caches are not replaced.
func (s *sharded) reading(fn func()) {
	s.opts.Caches.RLock()
	defer s.opts.Caches.RUnlock()
	fn()
}

// closeShared closes the shared store once every shard stopped.
func (s *sharded) closeShared() error {
	if s.closeStore == nil {
		return nil
	}
	err := s.closeStore()
	s.closeStore = nil
	return err
}

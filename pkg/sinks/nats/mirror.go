package nats

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/mirror"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Mirroring. With mirror set, the sink keeps each rule's view in a KV
// bucket of its own (pkg/mirror lays out keys and values): an event that
// puts an object in the view, or changes it there, stores its envelope
// under the object's key; one that takes it out deletes the key. A key's
// events in a batch fold into the one state it is to hold (fold), written
// once; its outcome is every such event's.
//
// Every write expects the key's last revision (its stream sequence), which
// the stream checks where it stores it, as the checkpoint's writes do. The
// sink knows what each key holds (revision, incarnation, resourceVersion,
// the holding that wrote it: keyState), from its acknowledgements and from
// Held, which the bridge calls whenever it loads the sink's views. A write
// refused because someone wrote the key meanwhile reads the key and is
// decided again: refused outright when a newer holding of the shard wrote
// it (writer.supersededBy), moot when the key holds a newer incarnation,
// written otherwise. A key not known costs a read before a deletion, a
// refusal before a put.
//
// The bridge diffs the view against what Held reads from the bucket, so
// the bucket converges to the view whatever its checkpoint says (a bucket
// recreated, a checkpoint lost, a write that landed after a crash).
//
// A deleted key leaves a marker, which a consumer resuming a watch needs;
// markers older than markerRetention are purged (compact), after the
// bucket's mirror.CompactedKey is raised past them, so a consumer that
// resumes from before lists again instead of missing a deletion.

// mirrorState is a mirroring sink's memory of its buckets.
type mirrorState struct {
	cfg     Mirror
	keys    *keyStates
	ensured sync.Map // bucket name -> struct{}: created or updated by this sink
	// created is each bucket's stream's creation time as this sink first
	// found it, and rules the rule of each bucket: a bucket found created
	// again lost what it held (loss).
	created   sync.Map // bucket name -> time.Time
	rules     sync.Map // bucket name -> rule
	mu        sync.Mutex
	notify    map[chan string]struct{}
	truncated atomic.Int64

	stop context.CancelFunc
	done chan struct{}
}

func newMirrorState(c *Mirror) *mirrorState {
	return &mirrorState{cfg: *c, keys: newKeyStates(), notify: map[chan string]struct{}{}}
}

// NotifyLost tells of rules whose bucket was found created anew while the
// sink ran (sinks.LossNotifier): an operator deleted it, or a memory
// stream restarted empty.
func (m Mirroring) NotifyLost() (<-chan string, func()) {
	ch := make(chan string, 16)
	m.mirror.mu.Lock()
	m.mirror.notify[ch] = struct{}{}
	m.mirror.mu.Unlock()
	return ch, func() {
		m.mirror.mu.Lock()
		delete(m.mirror.notify, ch)
		m.mirror.mu.Unlock()
	}
}

var _ sinks.LossNotifier = Mirroring{}

// lost tells every reader that bucket lost what it held.
func (m *mirrorState) lost(bucket string) {
	r, ok := m.rules.Load(bucket)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for ch := range m.notify {
		select {
		case ch <- r.(string):
		default:
		}
	}
}

func (m *mirrorState) hash(bucket, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(m.keys.seed)
	h.WriteString(bucket)
	h.WriteByte(0)
	h.WriteString(key)
	return h.Sum64()
}

// keyState is what a key holds as far as the sink knows: its revision,
// the incarnation (uidHash; 0: none, a deletion marker) and its
// resourceVersion (0: unknown), the incarnation a deletion marker
// deleted, and whether it is a marker of an object
// too large.
type keyState struct {
	rev, uid, rv uint64
	gone         uint64 // with uid 0: the incarnation the deletion marker deleted (0: unknown)
	marker       bool
	writer       writer // who wrote it, when known (the Kubebridge-Fence header)
}

// writer is the ownership a write was made under: the shard (i of N) and
// the epoch of its holding (sinks.Fence). Zero: unknown, or written by a
// replica running alone.
type writer struct {
	shard uint32 // i<<16 | N, +1; 0: unknown
	epoch uint64
}

func writerOf(f sinks.Fence, ok bool) writer {
	if !ok || f.Shards <= 0 {
		return writer{}
	}
	return writer{shard: uint32(f.Shard)<<16 | uint32(f.Shards) + 1, epoch: f.Epoch}
}

// parseWriter reads a Kubebridge-Fence header ("shard=i/N;epoch=e").
func parseWriter(v string) writer {
	var f sinks.Fence
	if _, err := fmt.Sscanf(v, "shard=%d/%d;epoch=%d", &f.Shard, &f.Shards, &f.Epoch); err != nil || f.Shard < 0 || f.Shard >= 1<<15 || f.Shards <= 0 || f.Shards >= 1<<15 {
		return writer{}
	}
	return writerOf(f, true)
}

// supersededBy says whether a write of w over a key last written by last
// must be refused: the same shard, held since by a newer holding. A
// replica that gave the shard up (paused, partitioned) finds it so where
// the key is, whatever its own clock says.
func (w writer) supersededBy(last writer) bool {
	return w.shard != 0 && w.shard == last.shard && last.epoch > w.epoch
}

// keyStates is each key's state, by hash of bucket NUL key, bounded like
// the fence's sequences (maxRemembered): a key forgotten is read again
// before a deletion, and costs a refusal before a put.
type keyStates struct {
	seed   maphash.Seed
	shards [32]struct {
		mu sync.Mutex
		m  map[uint64]keyState
	}
}

func newKeyStates() *keyStates {
	k := &keyStates{seed: maphash.MakeSeed()}
	for i := range k.shards {
		k.shards[i].m = map[uint64]keyState{}
	}
	return k
}

func (k *keyStates) get(h uint64) (keyState, bool) {
	sh := &k.shards[h%uint64(len(k.shards))]
	sh.mu.Lock()
	st, ok := sh.m[h]
	sh.mu.Unlock()
	return st, ok
}

func (k *keyStates) set(h uint64, st keyState) {
	sh := &k.shards[h%uint64(len(k.shards))]
	sh.mu.Lock()
	if _, ok := sh.m[h]; !ok && len(sh.m) >= maxRemembered/len(k.shards) {
		for old := range sh.m {
			delete(sh.m, old)
			break
		}
	}
	sh.m[h] = st
	sh.mu.Unlock()
}

// clear forgets every key's state.
func (k *keyStates) clear() {
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		sh.m = map[uint64]keyState{}
		sh.mu.Unlock()
	}
}

// forgetBucket forgets what the sink knew of bucket's keys (all keys'
// states: they are not kept by bucket; a bucket is rarely created anew).
func (m *mirrorState) forgetBucket(string) { m.keys.clear() }

func (k *keyStates) forget(h uint64) {
	sh := &k.shards[h%uint64(len(k.shards))]
	sh.mu.Lock()
	delete(sh.m, h)
	sh.mu.Unlock()
}

var uidSeed = maphash.MakeSeed()

// uidHash identifies an incarnation in a keyState (0: none).
func uidHash(uid string) uint64 {
	if uid == "" {
		return 0
	}
	return maphash.String(uidSeed, uid) | 1
}

// Truncations is how many events the sink stored as markers because they
// were larger than the bucket takes (sinks.TruncationReporter).
func (m Mirroring) Truncations() int64 { return m.mirror.truncated.Load() }

// ensureBucket creates or updates bucket, once per sink (again after a
// write found no stream), and returns it.
func (s *Sink) ensureBucket(ctx context.Context, l *link, bucket string) (jetstream.KeyValue, error) {
	if _, ok := s.mirror.ensured.Load(bucket); ok {
		kv, err := l.js.KeyValue(ctx, bucket)
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return kv, classify(err)
		}
		s.mirror.ensured.Delete(bucket)
	}
	storage := jetstream.FileStorage
	if s.mirror.cfg.Storage == "memory" {
		storage = jetstream.MemoryStorage
	}
	kv, err := l.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: bucket, History: 1, Storage: storage, Replicas: s.mirror.cfg.Replicas,
		Description: "kubebridge: the view of a rule, one key per object (docs/mirror.md)",
	})
	if err != nil {
		return nil, classify(fmt.Errorf("mirror bucket %s: %w", bucket, err))
	}
	if st, err := l.js.Stream(ctx, "KV_"+bucket); err == nil {
		c := st.CachedInfo().Created
		if first, had := s.mirror.created.Swap(bucket, c); had && !first.(time.Time).Equal(c) {
			// Created anew since: what the sink wrote is gone, and the
			// keys' states it knows are another bucket's.
			s.logger.Warn("a mirror bucket was created anew while the sink ran: its rule's view is written again", "sink", s.name, "bucket", bucket)
			s.mirror.forgetBucket(bucket)
			s.mirror.lost(bucket)
		}
	}
	s.mirror.ensured.Store(bucket, struct{}{})
	return kv, nil
}

// mirrorOp is the write of one key in a batch: its events, in the order
// of their resourceVersions, fold into the one state the key is to hold
// (fold), which is written if it differs from what the key holds.
type mirrorOp struct {
	evs         []int // the key's events
	bucket, key string
	h           uint64
	tries       uint8
	marker      bool // the put is written as a marker (too large)
	write       int  // the event written: a put's envelope, or a deletion; -1: none (moot)
	to          keyState
	err         error
}

// sendMirror writes the batch into the rules' buckets.
func (s *Sink) sendMirror(ctx context.Context, l *link, events []*event.Event) error {
	n := len(events)
	ops := make([]mirrorOp, 0, n)
	opOf := make([]int, n)
	byKey := make(map[string]int, n)
	for i, e := range events {
		bucket := s.mirror.cfg.BucketOf(e.Rule())
		if i == 0 || e.Rule() != events[i-1].Rule() {
			s.mirror.rules.Store(bucket, e.Rule())
		}
		key := mirror.Key(e.Namespace(), e.Name())
		k := bucket + "\x00" + key
		if j, ok := byKey[k]; ok {
			ops[j].evs, opOf[i] = append(ops[j].evs, i), j
			continue
		}
		byKey[k], opOf[i] = len(ops), len(ops)
		ops = append(ops, mirrorOp{evs: []int{i}, bucket: bucket, key: key, h: s.mirror.hash(bucket, key)})
	}
	failed := map[string]error{}
	for i := range ops {
		b := ops[i].bucket
		if _, seen := failed[b]; !seen {
			var err error
			if _, ok := s.mirror.ensured.Load(b); !ok {
				_, err = s.ensureBucket(ctx, l, b)
			}
			failed[b] = err
		}
		ops[i].err = failed[b]
	}
	limit := l.nc.MaxPayload()
	todo := make([]int, 0, len(ops))
	for i := range ops {
		if ops[i].err == nil {
			todo = append(todo, i)
		}
	}
	for len(todo) > 0 {
		todo = s.mirrorRound(ctx, l, events, ops, todo, limit)
	}
	out := outcomes{n: n}
	for i := range events {
		if err := ops[opOf[i]].err; err != nil {
			out.fail(i, err)
		}
	}
	return out.result()
}

type mirrorFlight struct {
	op int
	f  jetstream.PubAckFuture
}

// mirrorRound writes ops[todo] at once (window permitting) and waits for
// them; it returns those to write again: refused by the stream's revision
// check while this sink may still write (the key is read again, and the
// write decided again), or too large to be anything but a marker.
func (s *Sink) mirrorRound(ctx context.Context, l *link, events []*event.Event, ops []mirrorOp, todo []int, limit int64) (again []int) {
	flights := make([]mirrorFlight, 0, len(todo))
	var stop error
	settle := func(fl mirrorFlight) {
		s.release()
		op := &ops[fl.op]
		var ack *jetstream.PubAck
		var err error
		select {
		case ack = <-fl.f.Ok():
		case err = <-fl.f.Err():
		case <-ctx.Done():
			err = ctx.Err()
		case <-l.closed:
			err = natsgo.ErrConnectionClosed
		}
		if err == nil {
			op.to.rev, op.to.marker = ack.Sequence, op.marker
			s.mirror.keys.set(op.h, op.to)
			op.err = nil
			return
		}
		if _, _, ok := fenceRefused(err); ok {
			if op.tries < maxAdopt && sinks.MayWrite(ctx) == nil {
				// Someone else wrote the key since what this sink knows of
				// it: read it, and decide again from what it holds.
				op.tries++
				st, lerr := s.readKey(ctx, l, op.bucket, op.key)
				if lerr != nil {
					op.err = classify(lerr)
					return
				}
				s.mirror.keys.set(op.h, st)
				again = append(again, fl.op)
				return
			}
			op.err = sinks.Fenced(err)
			return
		}
		if errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) && !op.marker && op.write >= 0 && events[op.write].Change != event.Deleted {
			op.marker = true // a bucket that takes less than the server
			again = append(again, fl.op)
			return
		}
		if errors.Is(err, natsgo.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			s.mirror.ensured.Delete(op.bucket) // the bucket may be gone: create it on the next try
		}
		op.err = classify(err)
		if stop == nil && stopsBatch(err) {
			stop = err
		}
	}
	for _, j := range todo {
		op := &ops[j]
		if stop != nil {
			op.err = notPublished(stop)
			continue
		}
		from, known := s.mirror.keys.get(op.h)
		if !known && op.tries == 0 && hasDeletion(events, op.evs) {
			// A deletion applies only to the incarnation the key holds:
			// read which one (a put expects "nothing", and is refused and
			// decided again if the key holds something).
			st, err := s.readKey(ctx, l, op.bucket, op.key)
			if err != nil {
				op.err = classify(err)
				if stopsBatch(err) {
					stop = err
				}
				continue
			}
			s.mirror.keys.set(op.h, st)
			from = st
		}
		mine := writerOf(sinks.FenceFrom(ctx))
		if mine.supersededBy(from.writer) {
			s.refused.Add(1)
			op.err = sinks.Fenced(fmt.Errorf("key %s of bucket %s was written under a newer holding of shard (epoch %d > %d)", op.key, op.bucket, from.writer.epoch, mine.epoch))
			continue
		}
		op.write, op.to = fold(from, events, op.evs)
		op.to.writer = mine
		if op.write < 0 {
			op.err = nil // moot: the key holds a newer state, or none of a deleted incarnation
			continue
		}
		for !s.tryAcquire() {
			if len(flights) > 0 {
				settle(flights[0])
				flights = flights[1:]
				continue
			}
			if err := s.acquire(ctx, l); err != nil {
				stop = err
			}
			break
		}
		if stop != nil {
			op.err = notPublished(stop)
			continue
		}
		msg, err := s.mirrorMsg(ctx, events[op.write], op, from.rev, limit)
		var f jetstream.PubAckFuture
		if err == nil {
			f, err = l.js.PublishMsgAsync(msg, pubOpts...)
			err = classify(err)
		}
		if err != nil {
			s.release()
			op.err = err
			if !sinks.IsPermanent(err) {
				stop = err
			}
			continue
		}
		flights = append(flights, mirrorFlight{j, f})
	}
	for _, fl := range flights {
		settle(fl)
	}
	return again
}

func hasDeletion(events []*event.Event, evs []int) bool {
	for _, i := range evs {
		if events[i].Change == event.Deleted {
			return true
		}
	}
	return false
}

// fold applies a key's events to the state it holds, from, in the order
// of their resourceVersions (one name holds one object at a time, and an
// apiserver's resourceVersions order every change of a resource, across
// incarnations): a put of an incarnation applies when it is newer than what
// the key holds (for another incarnation, strictly); a deletion applies
// only to the incarnation the key holds. It returns the event to write
// (-1: none applies) and the state the key then holds. So a replica that
// writes an older incarnation after a newer one (its late writes, or shards
// by uid delivering the old and the new object of one name) changes
// nothing.
func fold(from keyState, events []*event.Event, evs []int) (write int, to keyState) {
	order := evs
	if len(evs) > 1 {
		order = slices.Clone(evs)
		slices.SortStableFunc(order, func(a, b int) int {
			ra, oka := rvOf(events[a])
			rb, okb := rvOf(events[b])
			if !oka || !okb {
				return 0 // unordered: as the batch has them
			}
			return cmp.Compare(ra, rb)
		})
	}
	write, to = -1, from
	for _, i := range order {
		e := events[i]
		u := uidHash(e.UID())
		r, ordered := rvOf(e)
		if e.Change == event.Deleted {
			if to.uid == u && u != 0 {
				write, to = i, keyState{gone: u, rv: r}
			}
			continue
		}
		switch {
		case to.uid == u && r >= to.rv, // a newer state of the incarnation held
			to.uid == 0 && to.gone == u,                          // the incarnation that left enters again
			to.uid != u && (!ordered || to.rv == 0 || r > to.rv): // another, newer one
			write, to = i, keyState{uid: u, rv: r}
		}
	}
	return write, to
}

// rvOf is the resourceVersion of e's object as a number; ok is false when
// it has none that is (an aggregated API's own scheme).
func rvOf(e *event.Event) (uint64, bool) {
	o := e.Object()
	if o == nil {
		return 0, false
	}
	r, err := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	return r, err == nil && r > 0
}

// Headers a mirror's deletion markers carry: the incarnation deleted and
// the resourceVersion of its deletion, so that a write decided against the
// marker knows what is newer.
const (
	uidHeader = "Kubebridge-Uid"
	rvHeader  = "Kubebridge-Resource-Version"
	// fenceHeader is on every write made under an ownership that can move
	// (sinks.Fence): which shard, under which holding.
	fenceHeader = "Kubebridge-Fence"
)

// readKey reads what key holds now: its revision, the incarnation (none
// for no value, a deletion marker, a value without one) and its
// resourceVersion.
func (s *Sink) readKey(ctx context.Context, l *link, bucket, key string) (keyState, error) {
	st, err := l.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return keyState{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+bucket+"."+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return keyState{}, nil
	}
	if err != nil {
		return keyState{}, err
	}
	return stateOf(key, m.Sequence, m.Header.Get("KV-Operation") != "", m.Header, m.Data), nil
}

// stateOf is the state of key whose last message is (rev, deleted,
// header, data).
func stateOf(key string, rev uint64, deleted bool, h natsgo.Header, data []byte) keyState {
	w := parseWriter(h.Get(fenceHeader))
	if deleted {
		r, _ := strconv.ParseUint(h.Get(rvHeader), 10, 64)
		return keyState{rev: rev, rv: r, gone: uidHash(h.Get(uidHeader)), writer: w}
	}
	var v heldValue
	_ = json.Unmarshal(data, &v)
	uid := heldUID(key, rev, &v)
	r, _ := strconv.ParseUint(v.Data.Object.Metadata.ResourceVersion, 10, 64)
	if uid != v.Data.Object.Metadata.UID {
		r = 0 // not this key's object's: its resourceVersion orders nothing
	}
	return keyState{rev: rev, uid: uidHash(uid), rv: r, marker: v.Truncated != "", writer: w}
}

// heldUID is the incarnation a value of key at revision rev holds: its
// object's uid, or, for a value that is no envelope of this key's object
// (a foreign writer's), a uid of its own, which no object has, so that the
// diff deletes or replaces it.
func heldUID(key string, rev uint64, v *heldValue) string {
	md := v.Data.Object.Metadata
	if md.UID == "" || mirror.Key(md.Namespace, md.Name) != key {
		return "kubebridge-unreadable-" + strconv.FormatUint(rev, 10)
	}
	return md.UID
}

// mirrorMsg renders the write of op (events[op.write] is e): a deletion
// marker, the event's envelope, or a marker naming the object when the
// envelope is larger than limit (the server's max_payload) or the bucket
// took. It expects the key's revision to be last.
func (s *Sink) mirrorMsg(ctx context.Context, e *event.Event, op *mirrorOp, last uint64, limit int64) (*natsgo.Msg, error) {
	msg := &natsgo.Msg{Subject: "$KV." + op.bucket + "." + op.key, Header: natsgo.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
	if f, ok := sinks.FenceFrom(ctx); ok {
		msg.Header.Set(fenceHeader, f.String())
	}
	if len(msg.Subject) > MaxSubject {
		return nil, sinks.Permanent(fmt.Errorf("event %s: the key %s is too long for a NATS subject", e.ID, op.key))
	}
	if e.Change == event.Deleted {
		msg.Header.Set("KV-Operation", "DEL")
		msg.Header.Set(uidHeader, e.UID())
		if op.to.rv > 0 {
			msg.Header.Set(rvHeader, strconv.FormatUint(op.to.rv, 10))
		}
		return msg, nil
	}
	hdr := hdrPreamble
	for k, vs := range msg.Header {
		for _, v := range vs {
			hdr += len(k) + len(v) + hdrPerField
		}
	}
	room := limit - int64(hdr)
	if !op.marker {
		body, err := e.Structured()
		if err != nil {
			return nil, sinks.Permanent(fmt.Errorf("encoding event %s: %w", e.ID, err))
		}
		if limit <= 0 || int64(len(body)) <= room {
			msg.Data = body
			return msg, nil
		}
		op.marker = true
		why := fmt.Sprintf("%d bytes > %d", len(body), room)
		s.mirror.truncated.Add(1)
		s.logger.Warn("an object's event is larger than the mirror takes: stored as a marker that names it", "sink", s.name, "rule", e.Rule(), "object", e.Subject, "why", why)
		msg.Data, err = markerOf(e, why)
		if err != nil {
			return nil, sinks.Permanent(err)
		}
	} else {
		body, err := markerOf(e, "larger than the bucket takes")
		if err != nil {
			return nil, sinks.Permanent(err)
		}
		s.mirror.truncated.Add(1)
		msg.Data = body
	}
	if limit > 0 && int64(len(msg.Data)) > room {
		return nil, sinks.Permanent(fmt.Errorf("event %s: even its marker is %d bytes, over the %d the server takes", e.ID, len(msg.Data), room))
	}
	return msg, nil
}

// markerOf is e's envelope with data.object cut to its identity and
// mirror.TruncatedAnnotation saying why (pkg/mirror).
func markerOf(e *event.Event, why string) ([]byte, error) {
	body, err := e.Structured()
	if err != nil {
		return nil, fmt.Errorf("encoding event %s: %w", e.ID, err)
	}
	var env map[string]any
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("event %s: %w", e.ID, err)
	}
	md := map[string]any{"name": e.Name(), "uid": e.UID(), "annotations": map[string]any{mirror.TruncatedAnnotation: why}}
	if ns := e.Namespace(); ns != "" {
		md["namespace"] = ns
	}
	obj := map[string]any{"metadata": md}
	if o := e.Object(); o != nil {
		if v := o.GetAPIVersion(); v != "" {
			obj["apiVersion"] = v
		}
		if k := o.GetKind(); k != "" {
			obj["kind"] = k
		}
		if rv := o.GetResourceVersion(); rv != "" {
			md["resourceVersion"] = rv
		}
		if l := o.GetLabels(); len(l) > 0 && len(l) <= 64 {
			md["labels"] = l
		}
	}
	env["data"] = map[string]any{"object": obj}
	env[mirror.TruncatedExtension] = why
	return json.Marshal(env)
}

// heldValue is what Held reads of a value.
type heldValue struct {
	Data struct {
		Object struct {
			Metadata struct {
				Namespace       string            `json:"namespace"`
				Name            string            `json:"name"`
				UID             string            `json:"uid"`
				ResourceVersion string            `json:"resourceVersion"`
				Labels          map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"object"`
	} `json:"data"`
	Truncated string `json:"kbtruncated"`
}

// Mirroring is a nats sink with mirror set: its destination holds the
// rules' views (sinks.Holder), which a sink publishing changes does not.
type Mirroring struct{ *Sink }

var _ sinks.Holder = Mirroring{}

// Held lists what rule's bucket holds (sinks.Holder), learning every key's
// revision, deletion markers' included. A value this sink did not write
// (no uid) is held under a uid of its own, so the diff deletes or replaces
// it; a key that is no object's is left alone.
func (m Mirroring) Held(ctx context.Context, rule string) ([]sinks.HeldObject, error) {
	s := m.Sink
	l, err := s.link()
	if err != nil {
		return nil, err
	}
	if err := waitConnected(ctx, l.nc, s.logger); err != nil {
		return nil, err
	}
	bucket := s.mirror.cfg.BucketOf(rule)
	s.mirror.rules.Store(bucket, rule)
	kv, err := s.ensureBucket(ctx, l, bucket)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("mirror bucket %s: %w", bucket, err)
	}
	defer func() { _ = w.Stop() }()
	var out []sinks.HeldObject
	for {
		var en jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("mirror bucket %s: the watch closed", bucket)
			}
			if e == nil {
				return out, nil
			}
			en = e
		}
		key := en.Key()
		deleted := en.Operation() != jetstream.KeyValuePut
		// (A marker's headers are not read: a put then applies whatever
		// its resourceVersion; readKey reads them when a write is refused.)
		s.mirror.keys.set(s.mirror.hash(bucket, key), stateOf(key, en.Revision(), deleted, nil, en.Value()))
		if deleted {
			continue
		}
		ns, name, hashed, err := mirror.ParseKey(key)
		if err != nil {
			continue // the bridge's own keys, or no object's
		}
		var v heldValue
		if json.Unmarshal(en.Value(), &v) != nil {
			v = heldValue{}
		}
		md := v.Data.Object.Metadata
		switch {
		case md.UID == "" || mirror.Key(md.Namespace, md.Name) != key:
			// Not an envelope of this key: replaced or deleted by the diff.
			if hashed {
				continue // no name to address it by
			}
			out = append(out, sinks.HeldObject{Namespace: ns, Name: name, UID: heldUID(key, en.Revision(), &v)})
		default:
			rv := md.ResourceVersion
			if v.Truncated != "" {
				rv = "" // a marker: sent again, it may fit now
			}
			out = append(out, sinks.HeldObject{Namespace: md.Namespace, Name: md.Name, UID: md.UID, ResourceVersion: rv, Labels: md.Labels})
		}
	}
}

// compactEvery is how often markers are compacted, as a fraction of their
// retention.
const compactEvery = 4

// startCompactor runs compact on every bucket the sink ensured, every
// markerRetention/compactEvery, until Close.
func (s *Sink) startCompactor() {
	ctx, cancel := context.WithCancel(context.Background())
	s.mirror.stop, s.mirror.done = cancel, make(chan struct{})
	go func() {
		defer close(s.mirror.done)
		t := time.NewTicker(max(s.mirror.cfg.MarkerRetention.D()/compactEvery, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.mirror.ensured.Range(func(b, _ any) bool {
				if err := s.compact(ctx, b.(string), time.Now().Add(-s.mirror.cfg.MarkerRetention.D())); err != nil && ctx.Err() == nil {
					s.logger.Warn("compacting a mirror bucket's deletion markers", "sink", s.name, "bucket", b, "error", err)
				}
				return ctx.Err() == nil
			})
		}
	}()
}

// compactTimeout bounds one bucket's compaction.
const compactTimeout = time.Minute

// compact purges bucket's deletion markers made before cutoff. First it
// raises mirror.CompactedKey to the highest revision it purges, so that a
// watch resumed from before is refused (410) rather than miss them; each
// purge removes only the marker's subject up to the marker's revision,
// never a write that came after it.
func (s *Sink) compact(ctx context.Context, bucket string, cutoff time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, compactTimeout)
	defer cancel()
	l, err := s.link()
	if err != nil {
		return err
	}
	kv, err := l.js.KeyValue(ctx, bucket)
	if err != nil {
		return err
	}
	st, err := l.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return err
	}
	created := st.CachedInfo().Created
	// same says the bucket is the one listed: one recreated meanwhile holds
	// other revisions, which must be neither raised past nor purged.
	same := func() error {
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if !info.Created.Equal(created) {
			return fmt.Errorf("bucket %s was recreated while compacting", bucket)
		}
		return nil
	}
	w, err := kv.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return err
	}
	type marker struct {
		key string
		rev uint64
	}
	var markers []marker
	var upTo uint64
	for done := false; !done; {
		select {
		case <-ctx.Done():
			_ = w.Stop()
			return ctx.Err()
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				_ = w.Stop()
				return errors.New("the watch closed")
			case e == nil:
				done = true
			case e.Operation() != jetstream.KeyValuePut && e.Created().Before(cutoff):
				markers = append(markers, marker{e.Key(), e.Revision()})
				upTo = max(upTo, e.Revision())
			}
		}
	}
	_ = w.Stop()
	if len(markers) == 0 {
		return nil
	}
	if err := same(); err != nil {
		return err
	}
	cur, err := kv.Get(ctx, mirror.CompactedKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		_, err = kv.Create(ctx, mirror.CompactedKey, []byte(strconv.FormatUint(upTo, 10)))
	case err != nil:
	default:
		if n, perr := strconv.ParseUint(string(cur.Value()), 10, 64); perr != nil || n < upTo {
			_, err = kv.Update(ctx, mirror.CompactedKey, []byte(strconv.FormatUint(upTo, 10)), cur.Revision())
		}
	}
	if err != nil {
		return fmt.Errorf("raising %s: %w", mirror.CompactedKey, err)
	}
	if err := same(); err != nil {
		return err
	}
	for _, m := range markers {
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+m.key), jetstream.WithPurgeSequence(m.rev+1)); err != nil {
			return err
		}
		s.mirror.keys.forget(s.mirror.hash(bucket, m.key))
	}
	return nil
}

// stopCompactor stops the compactor and waits for it.
func (m *mirrorState) stopCompactor() {
	if m.stop != nil {
		m.stop()
		<-m.done
	}
}

package nats

import (
	"context"
	"errors"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Fencing at the stream. A send cut short on our side (a shard given up, a
// lease lapsed) takes back nothing already written: the client's buffer,
// the socket or a stalled link may still deliver it after another replica
// took the object over. So every JetStream publish carries an expectation
// the server enforces: the sequence of the last message of the object's
// subjects (Nats-Expected-Last-Subject-Sequence over the subject filter
// Nats-Expected-Last-Subject-Sequence-Subject: the event's subject with its
// per-event tokens, {type} and {rule}, as "*"). A publish that lands after
// anyone else stored a message of the object is refused: a late write of a
// replica that gave the object up can land only before every write of its
// successor, never after, so the stream's last message of an object is
// always its current owner's.
//
// The sequence is what this sink last stored for the object (its PubAck);
// unknown (a restart, an object the sink never published) it is 0, "none
// yet". A writer that finds another sequence while it may still write
// (sinks.MayWrite: its context is live and its ownership's fence, asked
// after the refusal, holds, so nobody else can have taken the object)
// adopts the stream's and publishes again: whatever landed before is older
// than what it sends now. The sequences live in memory, bounded
// (maxRemembered), keyed by a 64-bit hash of the filter (a collision costs
// a refusal, never a wrong write), and are forgotten when an object is
// deleted.

// maxAdopt bounds how often one event is published again after its
// expectation was refused within one Send: more means others keep writing
// the object too (a template without {namespace}, two rules racing), and
// the delivery's backoff spaces the next try.
const maxAdopt = 3

// maxRemembered bounds the sequences a sink remembers (about 40 B each):
// past it, an arbitrary one is forgotten for each new one. A forgotten
// object costs one refusal and one more publish, never a wrong write; a
// rule without deletions, objects another replica deleted, shards given
// back leave entries that only this bound removes.
const maxRemembered = 1 << 18

// lastSeqs is the sequence of the last message stored per object filter.
type lastSeqs struct {
	seed   maphash.Seed
	shards [32]struct {
		mu sync.Mutex
		m  map[uint64]uint64
	}
}

func newLastSeqs() *lastSeqs {
	l := &lastSeqs{seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].m = map[uint64]uint64{}
	}
	return l
}

func (l *lastSeqs) hash(filter []byte) uint64 { return maphash.Bytes(l.seed, filter) }

func (l *lastSeqs) get(h uint64) uint64 {
	s := &l.shards[h%uint64(len(l.shards))]
	s.mu.Lock()
	v := s.m[h]
	s.mu.Unlock()
	return v
}

// set records seq for h unless a later one is known (a duplicate's
// PubAck names the sequence of the message it duplicates).
func (l *lastSeqs) set(h, seq uint64) {
	s := &l.shards[h%uint64(len(l.shards))]
	s.mu.Lock()
	if cur, ok := s.m[h]; !ok {
		l.room(s.m)
		s.m[h] = seq
	} else if seq > cur {
		s.m[h] = seq
	}
	s.mu.Unlock()
}

// adopt replaces h's sequence with the stream's (which may be lower: its
// messages expired, or were purged).
func (l *lastSeqs) adopt(h, seq uint64) {
	s := &l.shards[h%uint64(len(l.shards))]
	s.mu.Lock()
	if seq == 0 {
		delete(s.m, h)
	} else {
		if _, ok := s.m[h]; !ok {
			l.room(s.m)
		}
		s.m[h] = seq
	}
	s.mu.Unlock()
}

// room forgets an arbitrary entry of a full shard map m; its lock held.
func (l *lastSeqs) room(m map[uint64]uint64) {
	if len(m) < maxRemembered/len(l.shards) {
		return
	}
	for k := range m {
		delete(m, k)
		return
	}
}

func (l *lastSeqs) forget(h uint64) {
	s := &l.shards[h%uint64(len(l.shards))]
	s.mu.Lock()
	delete(s.m, h)
	s.mu.Unlock()
}

// len is how many objects have a sequence (tests, metrics).
func (l *lastSeqs) len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// fenceRefused reports whether err is the stream refusing an expectation
// (the last sequence of the filter is another), and the sequence it found
// when the server said (10071 "wrong last sequence: N"; a replicated
// stream may answer 10164, without it).
func fenceRefused(err error) (found uint64, known, ok bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return 0, false, false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence:
		d := apiErr.Description
		if i := strings.LastIndexByte(d, ':'); i >= 0 {
			if n, perr := strconv.ParseUint(strings.TrimSpace(d[i+1:]), 10, 64); perr == nil {
				return n, true, true
			}
		}
		return 0, false, true
	case jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return 0, false, true
	}
	return 0, false, false
}

// lastStored asks the stream that captures filter for the sequence of its
// last message matching filter (0: none).
func lastStored(ctx context.Context, js jetstream.JetStream, filter string) (uint64, error) {
	name, err := js.StreamNameBySubject(ctx, filter)
	if err != nil {
		return 0, err
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	m, err := st.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

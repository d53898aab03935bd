package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// HoldingSink is a Sink with a state topic: its destination holds each
// rule's view, which Held reads back (sinks.Holder). A sink without one
// is a plain *Sink, which holds nothing the bridge could diff against.
type HoldingSink struct{ *Sink }

var _ sinks.Holder = HoldingSink{}

// Limits of reading a state topic back: it is the destination's, which
// anyone with access may have written to.
const (
	// maxHeld bounds the objects (uids) a state topic may hold.
	maxHeld = 4 << 20
	// maxKey bounds a key: an object's uid (36 bytes for Kubernetes').
	maxKey = 256
	// heldFetchBytes bounds what one fetch brings back.
	heldFetchBytes = 32 << 20
	// maxHeldBytes bounds what the objects read keep (names, labels).
	maxHeldBytes = 512 << 20
)

// heldTimeout bounds a read of a state topic; heldIdle is how long it
// waits for records of partitions not read to their watermark yet, in
// polls of heldPoll (variables for tests).
var (
	heldTimeout = 2 * time.Minute
	heldIdle    = 5 * time.Second
	heldPoll    = time.Second
)

// Held reads rule's state topic from the start to each partition's high
// watermark, with a client of its own, and returns the objects whose
// last record is not a tombstone. A record that does not parse (not a
// structured CloudEvent of an object) is skipped and counted; when it is
// its uid's last, the uid is dropped: the topic no longer says what it
// holds of it. A topic that does not exist holds nothing.
func (s HoldingSink) Held(ctx context.Context, rule string) ([]sinks.HeldObject, error) {
	topic := s.StateTopic(rule)
	if err := checkTopic(topic); err != nil {
		return nil, sinks.Permanent(fmt.Errorf("stateTopic of rule %q: %w", rule, err))
	}
	ctx, cancel := context.WithTimeout(ctx, heldTimeout)
	defer cancel()

	meta, err := kgo.NewClient(s.opts...)
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(meta)
	starts, err := adm.ListStartOffsets(ctx, topic)
	var ends kadm.ListedOffsets
	if err == nil {
		ends, err = adm.ListEndOffsets(ctx, topic)
	}
	meta.Close()
	if err == nil {
		err = starts.Error()
	}
	if err == nil {
		err = ends.Error()
	}
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID):
		return nil, nil
	case err != nil:
		return nil, classify(fmt.Errorf("listing the offsets of state topic %s: %w", topic, err))
	}
	from := map[int32]kgo.Offset{}
	end := map[int32]int64{} // partitions still to read, up to their high watermark
	ends.Each(func(o kadm.ListedOffset) {
		if o.Topic != topic {
			return
		}
		start := int64(0)
		if so, ok := starts.Lookup(topic, o.Partition); ok {
			start = so.Offset
		}
		if o.Offset > start {
			from[o.Partition] = kgo.NewOffset().At(start)
			end[o.Partition] = o.Offset
		}
	})
	if len(end) == 0 {
		return nil, nil
	}

	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), s.opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // compacted or trimmed below where it was listed
		kgo.FetchMaxBytes(heldFetchBytes),
		kgo.FetchMaxPartitionBytes(int32(max(s.maxRecordBytes(), 1<<20))),
		kgo.MaxConcurrentFetches(2),
	)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	held := map[string]*sinks.HeldObject{}
	skipped := 0
	size := 0 // what held keeps, about
	idleSince := time.Now()
	got := map[int32]bool{} // partitions records came from
	for len(end) > 0 {
		pctx, pcancel := context.WithTimeout(ctx, heldPoll)
		fetches := cl.PollFetches(pctx)
		pcancel()
		if err := ctx.Err(); err != nil {
			return nil, sinks.Unavailable(fmt.Errorf("reading state topic %s: %d partitions not read to their end: %w", topic, len(end), err))
		}
		if fetches.NumRecords() > 0 {
			idleSince = time.Now()
		} else if time.Since(idleSince) >= heldIdle {
			// Nothing more comes though the watermark listed is ahead:
			// the partition's last records were compacted away (old
			// tombstones), or the broker does not serve it now. Taken as
			// read only when records of each such partition came and the
			// broker answers; otherwise the destination is not readable
			// now, and the bridge reads it again later.
			for p := range end {
				if !got[p] {
					return nil, sinks.Unavailable(fmt.Errorf("reading state topic %s: nothing came from partition %d for %s", topic, p, heldIdle))
				}
			}
			if _, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic); err != nil {
				return nil, sinks.Unavailable(fmt.Errorf("reading state topic %s: %d partitions stalled before their end, and the broker does not answer: %w", topic, len(end), err))
			}
			s.logger.Warn("state topic partitions end before the watermark listed; taken as read", "topic", topic, "rule", rule, "partitions", len(end))
			break
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if ferr == nil {
				ferr = err
			}
		})
		if ferr != nil && !errors.Is(ferr, context.Canceled) {
			return nil, classify(fmt.Errorf("reading state topic %s: %w", topic, ferr))
		}
		var overflow bool
		fetches.EachRecord(func(r *kgo.Record) {
			got[r.Partition] = true
			e, ok := end[r.Partition]
			if !ok || r.Offset >= e {
				return // read past the watermark listed: not what it held then
			}
			if r.Offset+1 >= e {
				delete(end, r.Partition)
			}
			uid := string(r.Key)
			if len(uid) == 0 || len(uid) > maxKey {
				skipped++
				return
			}
			if old, have := held[uid]; have {
				size -= heldSize(old)
				delete(held, uid)
			}
			if r.Value == nil {
				return
			}
			o, ok := parseHeld(uid, r.Value)
			if !ok {
				skipped++
				return
			}
			if len(held) >= maxHeld || size+heldSize(o) > maxHeldBytes {
				overflow = true
				return
			}
			held[uid] = o
			size += heldSize(o)
		})
		if overflow {
			return nil, sinks.Permanent(fmt.Errorf("state topic %s holds more than %d objects or %d MiB of names and labels", topic, maxHeld, maxHeldBytes>>20))
		}
	}
	if skipped > 0 {
		s.logger.Warn("records of the state topic that are no object's state were skipped", "topic", topic, "rule", rule, "skipped", skipped)
	}
	out := make([]sinks.HeldObject, 0, len(held))
	for _, o := range held {
		out = append(out, *o)
	}
	return out, nil
}

// heldSize is about what o keeps in memory.
func heldSize(o *sinks.HeldObject) int {
	n := 128 + len(o.Namespace) + len(o.Name) + len(o.UID) + len(o.ResourceVersion)
	for k, v := range o.Labels {
		n += 32 + len(k) + len(v)
	}
	return n
}

// stateValue is what Held reads of a state record: a structured
// CloudEvent of the sink's (data.object as the rule includes it).
type stateValue struct {
	ID      string `json:"id"`
	Subject string `json:"subject"`
	Data    struct {
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
}

// parseHeld reads the object a state record of uid holds: its namespace
// and name from data.object.metadata (or, when the rule does not include
// the object, the event's subject), its resourceVersion likewise (or the
// id's), its labels. ok is false for a value that names no object of
// uid.
func parseHeld(uid string, value []byte) (*sinks.HeldObject, bool) {
	var v stateValue
	if err := json.Unmarshal(value, &v); err != nil {
		return nil, false
	}
	md := v.Data.Object.Metadata
	if md.UID != "" && md.UID != uid {
		return nil, false
	}
	o := &sinks.HeldObject{Namespace: md.Namespace, Name: md.Name, UID: uid, ResourceVersion: md.ResourceVersion, Labels: md.Labels}
	if o.Name == "" {
		ns, name, cut := strings.Cut(v.Subject, "/")
		if !cut {
			ns, name = "", v.Subject
		}
		o.Namespace, o.Name = ns, name
	}
	if o.ResourceVersion == "" {
		// <uid>.<tag>.<resourceVersion>.<type>
		if parts := strings.Split(v.ID, "."); len(parts) == 4 && parts[0] == uid {
			o.ResourceVersion = parts[2]
		}
	}
	if o.Name == "" || strings.Contains(o.Name, "/") || strings.Contains(o.Namespace, "/") {
		return nil, false
	}
	return o, true
}

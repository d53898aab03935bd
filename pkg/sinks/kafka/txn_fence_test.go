package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Not the sink's behaviour: evidence for the follow-up in docs/kafka.md
// ("Fencing and handover"). Two producers with one transactional.id, as
// two owners of one shard would be: once the second has initialized (its
// InitProducerID bumps the id's epoch), the first's transaction can no
// longer commit, and what it produced is never read by a read_committed
// consumer. kfake fences as Kafka does.
func TestTransactionalIDFencesAStaleOwner(t *testing.T) {
	t.Parallel()
	b := startBroker(t, kfakeSeed("fenced"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newOwner := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs()...), kgo.TransactionalID("kubebridge-shard-3"), kgo.DefaultProduceTopic("fenced"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	old := newOwner()
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := old.ProduceSync(ctx, &kgo.Record{Key: []byte("uid-a"), Value: []byte("old owner, before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := old.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	cur := newOwner()
	if err := cur.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cur.ProduceSync(ctx, &kgo.Record{Key: []byte("uid-a"), Value: []byte("new owner")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cur.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	// The stale owner writes late.
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	perr := old.ProduceSync(ctx, &kgo.Record{Key: []byte("uid-a"), Value: []byte("old owner, late")}).FirstErr()
	cerr := old.EndTransaction(ctx, kgo.TryCommit)
	if perr == nil && cerr == nil {
		t.Fatal("the stale owner's late transaction committed")
	}
	t.Logf("stale owner: produce %v; commit %v", perr, cerr)
	if !errors.Is(perr, kerr.InvalidProducerEpoch) && !errors.Is(perr, kerr.ProducerFenced) &&
		!errors.Is(cerr, kerr.InvalidProducerEpoch) && !errors.Is(cerr, kerr.ProducerFenced) {
		t.Errorf("refused, but not by the epoch: %v / %v", perr, cerr)
	}
	// A read_committed consumer; commit markers take offsets it never
	// returns, so it reads for a while rather than to the watermark.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs()...), kgo.ConsumeTopics("fenced"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var values []string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(values) < 3; {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
		pcancel()
	}
	if len(values) != 2 || values[0] != "old owner, before" || values[1] != "new owner" {
		t.Errorf("a read_committed consumer reads %q, want the old owner's record before the handover, then the new owner's", values)
	}
}

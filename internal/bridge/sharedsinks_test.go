package bridge

import (
	"context"
	"slices"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// The shards a replica holds share one sink per name and settings. A
// reload that changes a sink's settings builds the new one beside the old
// one, which stays open until its last shard retired it: a shard swapped
// first must not get the old sink back, nor close it under the others.
func TestSharedSinksAreSharedBySettings(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	shared := newSharedSinks(reg, newHost(discard, reg), discard)
	create := func(tag string) sinks.Sink {
		t.Helper()
		s, err := shared.Create(ctx, sinkCfg("a", tag), discard)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	old0, old1 := create("1"), create("1") // shards 0 and 1, before the reload
	if unwrap(old0) != unwrap(old1) {
		t.Fatal("two shards with the same settings got two sinks")
	}
	new0 := create("2") // shard 0 swapped: the new settings
	if unwrap(new0) == unwrap(old0) {
		t.Fatal("changed settings got the sink of the old ones")
	}
	if got, want := ts.events(), []string{"create a", "create a"}; !slices.Equal(got, want) {
		t.Fatalf("sinks built: %v, want %v", got, want)
	}
	closeOK(t, old0) // shard 0 retires its old sink: shard 1 still sends to it
	if slices.Contains(ts.events(), "close a") {
		t.Fatalf("the old sink closed while a shard still uses it: %v", ts.events())
	}
	new1 := create("2") // shard 1 swapped
	if unwrap(new1) != unwrap(new0) {
		t.Fatal("shards with the new settings got two sinks")
	}
	for _, s := range []sinks.Sink{old1, new0, new1} {
		closeOK(t, s)
	}
	if got, want := ts.events(), []string{"create a", "create a", "close a", "close a"}; !slices.Equal(got, want) {
		t.Fatalf("sinks built and closed: %v, want %v", got, want)
	}
}

func closeOK(t *testing.T, s sinks.Sink) {
	t.Helper()
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

type orderedSink struct {
	sinks.Sink
	ordered bool
}

func (s orderedSink) Ordered() bool { return s.ordered }

// A shared sink keeps its order contract: the delivery asks sinks.Ordered
// of what it is given (a sharded replica's digest and batch webhooks got
// an object's events one send at a time when sharing hid it).
func TestSharedSinkKeepsItsOrder(t *testing.T) {
	for _, tc := range []struct {
		sink sinks.Sink
		want bool
	}{{orderedSink{ordered: true}, true}, {orderedSink{}, false}, {struct{ sinks.Sink }{}, false}} {
		o, ok := shareSink(tc.sink, nil).(sinks.Ordered)
		if got := ok && o.Ordered(); got != tc.want {
			t.Errorf("%T (Ordered %v): shared, Ordered %v", tc.sink, tc.want, got)
		}
	}
}

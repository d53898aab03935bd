package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// testSinks is a sink type for these tests: it records what each sink
// took and when sinks were built and closed, and can be held or failed.
type testSinks struct {
	mu      sync.Mutex
	log     []string // "create a", "close a"
	taken   map[string][]string
	changes map[string][]string // "<change> <uid>"
	hold    chan struct{}       // while open, Send blocks
	failFor string              // Create of this sink name fails
}

type testSinkConfig struct {
	// Tag changes a sink's config without changing its name.
	Tag string `yaml:"tag"`
}

func (ts *testSinks) registry(t *testing.T) *sinks.Registry {
	t.Helper()
	r, err := sinks.NewRegistry(sinks.Factory{
		Type:      "test",
		NewConfig: func() any { return &testSinkConfig{} },
		Create: func(_ context.Context, s sinks.Settings) (sinks.Sink, error) {
			ts.mu.Lock()
			defer ts.mu.Unlock()
			if s.Name == ts.failFor {
				return nil, errors.New("refused")
			}
			ts.log = append(ts.log, "create "+s.Name)
			return &testSink{ts: ts, name: s.Name}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (ts *testSinks) events() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.log)
}

type testSink struct {
	ts   *testSinks
	name string
}

func (s *testSink) Send(ctx context.Context, evs []*event.Event) error {
	if h := s.ts.hold; h != nil {
		select {
		case <-h:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.ts.mu.Lock()
	defer s.ts.mu.Unlock()
	if s.ts.taken == nil {
		s.ts.taken = map[string][]string{}
	}
	if s.ts.changes == nil {
		s.ts.changes = map[string][]string{}
	}
	for _, e := range evs {
		s.ts.taken[s.name] = append(s.ts.taken[s.name], e.Name())
		s.ts.changes[s.name] = append(s.ts.changes[s.name], fmt.Sprintf("%s %s", e.Change, e.UID()))
	}
	return nil
}

func (s *testSink) Close(context.Context) error {
	s.ts.mu.Lock()
	defer s.ts.mu.Unlock()
	s.ts.log = append(s.ts.log, "close "+s.name)
	return nil
}

func sinkCfg(name, tag string) config.Sink {
	return config.Sink{Name: name, Type: "test", Spec: &testSinkConfig{Tag: tag}, Workers: 1,
		Queue: config.Queue{Capacity: 100},
		Retry: config.Retry{InitialInterval: config.Duration(time.Millisecond), MaxInterval: config.Duration(10 * time.Millisecond)}}
}

var discard = slog.New(slog.DiscardHandler)

// A reload keeps the runs of unchanged sinks (their queues and views go
// on), rebuilds changed ones and retires changed and removed ones; the
// config order is kept.
func TestBuildSinkSetDiffs(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	prev, retired, err := buildSinkSet(ctx, reg, []config.Sink{sinkCfg("a", "1"), sinkCfg("b", "1"), sinkCfg("c", "1")}, nil, discard)
	if err != nil || len(retired) != 0 {
		t.Fatal(err, retired)
	}
	next, retired, err := buildSinkSet(ctx, reg, []config.Sink{sinkCfg("d", "1"), sinkCfg("b", "2"), sinkCfg("a", "1")}, prev, discard)
	if err != nil {
		t.Fatal(err)
	}
	if next.byName["a"] != prev.byName["a"] {
		t.Error("unchanged sink a was rebuilt")
	}
	if next.byName["b"] == prev.byName["b"] {
		t.Error("changed sink b was kept")
	}
	var names []string
	for _, r := range next.order {
		names = append(names, r.cfg.Name)
	}
	if fmt.Sprint(names) != "[d b a]" {
		t.Errorf("order = %v", names)
	}
	var gone []string
	for _, r := range retired {
		gone = append(gone, r.cfg.Name)
	}
	if fmt.Sprint(gone) != "[b c]" {
		t.Errorf("retired = %v, want the old b and c", gone)
	}
	if got := fmt.Sprint(ts.events()); got != "[create a create b create c create d create b]" {
		t.Errorf("log = %s", got)
	}
}

// A sink that cannot be built leaves everything as it was: what was built
// for the new set is closed, the previous set is not touched.
func TestBuildSinkSetFailureClosesWhatItBuilt(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	prev, _, err := buildSinkSet(ctx, reg, []config.Sink{sinkCfg("a", "1")}, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	ts.failFor = "z"
	_, _, err = buildSinkSet(ctx, reg, []config.Sink{sinkCfg("a", "1"), sinkCfg("n", "1"), sinkCfg("z", "1")}, prev, discard)
	if err == nil || err.Error() != `sink "z": refused` {
		t.Fatalf("err = %v", err)
	}
	if got := fmt.Sprint(ts.events()); got != "[create a create n close n]" {
		t.Errorf("log = %s (the kept sink a must stay open, the new n must be closed)", got)
	}
	if prev.byName["a"].sink == nil {
		t.Error("prev's sink a was closed")
	}
}

func testEvent(name string) *event.Event {
	obj := &unstructured.Unstructured{}
	obj.SetNamespace("ns")
	obj.SetName(name)
	obj.SetUID(types.UID("uid-" + name))
	obj.SetResourceVersion("1")
	r := &event.Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}
	return event.New(r, event.Added, obj, nil, time.Now())
}

// A retired sink drains its queue into the sink before it closes, so a
// reload loses nothing a sink had queued; one that cannot drain in time is
// stopped and closed anyway (the next reconciliation resends its queue).
func TestRetireDrainsThenCloses(t *testing.T) {
	ctx := context.Background()
	for _, stuck := range []bool{false, true} {
		t.Run(fmt.Sprintf("stuck=%v", stuck), func(t *testing.T) {
			ts := &testSinks{}
			if stuck {
				ts.hold = make(chan struct{})
			}
			d := testDeliverer(ts.registry(t), discard, nil)
			cfg := &config.Config{Sinks: []config.Sink{sinkCfg("a", "1")}}
			if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
				t.Fatal(err)
			}
			run := d.runs()[0]
			for i := range 50 {
				run.delivery.Offer(testEvent(fmt.Sprint("o", i)))
			}
			start := time.Now()
			run.retire(ctx, 200*time.Millisecond, discard)
			ts.mu.Lock()
			taken := len(ts.taken["a"])
			ts.mu.Unlock()
			switch {
			case !stuck && taken != 50:
				t.Errorf("retired after %d of 50 events", taken)
			case stuck && taken != 0:
				t.Errorf("a held sink took %d events", taken)
			case stuck && time.Since(start) > 5*time.Second:
				t.Errorf("retire of a stuck sink took %s", time.Since(start))
			}
			if got := ts.events(); got[len(got)-1] != "close a" {
				t.Errorf("log = %v, want the sink closed last", got)
			}
			if _, err := d.stop(cancelled(), false); err != nil {
				t.Error(err)
			}
			if got := ts.events(); got[len(got)-1] != "close a" || len(got) != 2 {
				t.Errorf("log = %v, want the retired sink closed once", got)
			}
		})
	}
}

package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/filters"
	"github.com/kubebridge/kubebridge/pkg/informer"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// testDeliverer is a deliverer with the seams a test sets: the sink types,
// the source it reconciles against (nil: none) and the checkpoint file
// ("": none).
func testDeliverer(reg *sinks.Registry, logger *slog.Logger, src *fakeSource, checkpointFile ...string) *deliverer {
	opts := delivererOptions{Registry: reg, Host: newHost(logger, reg), Logger: logger, CheckpointInterval: time.Hour,
		Source: func() ([]*filters.Rule, source) {
			if src == nil {
				return nil, nil
			}
			return src.rules, src
		}}
	if len(checkpointFile) > 0 {
		opts.OpenStore = func(context.Context) (checkpoint.Store, func() error, error) {
			store, err := checkpoint.OpenBolt(checkpointFile[0], false)
			if err != nil {
				return nil, nil, err
			}
			return store, store.Close, nil
		}
	}
	return newDeliverer(opts)
}

// fakeSource is the caches of the tests' rules: one store of ConfigMaps.
type fakeSource struct {
	rules []*filters.Rule
	store cache.Store
}

func newFakeSource(t *testing.T, reg *sinks.Registry, names ...string) *fakeSource {
	t.Helper()
	rules := testenv.CompileRules(t, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: t
sinks:
  - name: a
    test: {tag: "1"}
rules:
  - name: cms
    resource: v1/configmaps
    sinks: [a]
`, reg, nil)
	src := &fakeSource{rules: rules, store: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	for _, n := range names {
		src.put(n, "1")
	}
	return src
}

func (f *fakeSource) put(name, rv string) {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ConfigMap")
	obj.SetNamespace("ns")
	obj.SetName(name)
	obj.SetUID(types.UID("uid-" + name))
	obj.SetResourceVersion(rv)
	_ = f.store.Add(obj)
}

func (f *fakeSource) View(r *filters.Rule) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range f.store.List() {
		if u := o.(*unstructured.Unstructured); r.InView(u) {
			out = append(out, u)
		}
	}
	return out
}

func (f *fakeSource) Cache(*filters.Rule, string) cache.KeyGetter { return f.store }

func (ts *testSinks) took(sink string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.taken[sink])
}

// The deliverer hands each sink its view, and a stop with time to drain
// delivers what is queued, writes what was acknowledged and closes the
// sink after its worker: the next start finds the view in the checkpoint
// and sends only what changed meanwhile (here: one deletion).
func TestDelivererStopDrainsAndCheckpoints(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	file := filepath.Join(t.TempDir(), "state.db")
	src := newFakeSource(t, reg, "x", "y")
	cfg := &config.Config{Sinks: []config.Sink{sinkCfg("a", "1")}}

	d := testDeliverer(reg, discard, src, file)
	d.notify(informer.Notification{}) // before start: nothing to deliver to, dropped
	if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
		t.Fatal(err)
	}
	if n := d.reconcileAll(); n != 2 {
		t.Errorf("reconcileAll sent %d events, want 2", n)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if left, err := d.stop(stopCtx, false); left != 0 || err != nil {
		t.Fatalf("stop: %d left, %v", left, err)
	}
	if got := ts.took("a"); fmt.Sprint(got) != "[x y]" && fmt.Sprint(got) != "[y x]" {
		t.Errorf("sink a took %v, want x and y", got)
	}
	if got := ts.events(); fmt.Sprint(got) != "[create a close a]" {
		t.Errorf("log = %v", got)
	}
	if d.delivering() || d.lag() != 0 {
		t.Error("a stopped deliverer still delivers")
	}
	if left, err := d.stop(stopCtx, false); left != 0 || err != nil {
		t.Errorf("a second stop: %d left, %v", left, err)
	}

	// Restart: y was deleted while stopped.
	_ = src.store.Delete(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"namespace": "ns", "name": "y"}}})
	d = testDeliverer(reg, discard, src, file)
	if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
		t.Fatal(err)
	}
	if n := d.reconcileAll(); n != 1 {
		t.Errorf("after a restart reconcileAll sent %d events, want 1 (y deleted)", n)
	}
	if left, err := d.stop(stopCtx, false); left != 0 || err != nil {
		t.Fatalf("stop: %d left, %v", left, err)
	}
	if got := ts.took("a"); len(got) != 3 || got[2] != "y" {
		t.Errorf("sink a took %v, want y's deletion last", got)
	}
}

// A lost lease stops at once: what is queued is dropped, the sink's send in
// progress is cancelled, and nothing more is written to the checkpoint
// (another replica owns it now), so the next owner sends it all again.
func TestDelivererStopAbandonedWritesNothing(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{hold: make(chan struct{})}
	reg := ts.registry(t)
	file := filepath.Join(t.TempDir(), "state.db")
	src := newFakeSource(t, reg, "x", "y")
	cfg := &config.Config{Sinks: []config.Sink{sinkCfg("a", "1")}}
	d := testDeliverer(reg, discard, src, file)
	if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
		t.Fatal(err)
	}
	d.reconcileAll()
	start := time.Now()
	left, err := d.stop(cancelled(), true)
	if err != nil || left == 0 {
		t.Fatalf("stop: %d left, %v; want the held events left", left, err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("an abandoning stop took %s", time.Since(start))
	}
	if len(ts.took("a")) != 0 {
		t.Errorf("a held sink took %v", ts.took("a"))
	}
	store, err := checkpoint.OpenBolt(file, false)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	view, err := checkpoint.LoadView(ctx, store, "a", "cms")
	if err != nil {
		t.Fatal(err)
	}
	for k, sl := range view {
		if sl.Acked != nil {
			t.Errorf("%s recorded as acknowledged after an abandoning stop", k)
		}
	}
}

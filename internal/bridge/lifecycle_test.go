package bridge

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// The runtime's lifecycle (start, reload, handover, stop) on client-go's
// fakes: no control plane. The real-component proofs are the e2e tests
// (TestHotReload*, TestLeaderFailover, TestModel).

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// fakeCluster serves ConfigMaps, answers discovery for them, allows every
// access review and holds Leases.
type fakeCluster struct {
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
}

func newFakeCluster() *fakeCluster {
	kube := fake.NewSimpleClientset()
	kube.Resources = []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{
		{Name: "configmaps", Namespaced: true, Kind: "ConfigMap", Verbs: []string{"get", "list", "watch"}},
	}}}
	kube.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	kube.PrependReactor("create", "selfsubjectreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, a.(k8stesting.CreateAction).GetObject(), nil // not stored: asked at every check
	})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	return &fakeCluster{kube: kube, dyn: dyn}
}

func (c *fakeCluster) clients() *Clients { return &Clients{Kube: c.kube, Dynamic: c.dyn} }

// put creates ConfigMap ns/name (uid "uid-<name>") with labels.
func (c *fakeCluster) put(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion("1")
	u.SetLabels(labels)
	if _, err := c.dyn.Resource(configMaps).Namespace("ns").Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// lifecycleConfig is a config over the test sinks; extra is YAML added
// to sinks and rules.
func lifecycleConfig(t *testing.T, reg *sinks.Registry, sinksYAML, rulesYAML string) *config.Config {
	t.Helper()
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: test\nsinks:\n" + sinksYAML + "rules:\n" + rulesYAML
	cfg, problems, err := config.Parse("c.yaml", []byte(doc), reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("config: %v %v\n%s", err, problems, doc)
	}
	return cfg
}

// waitTook waits until sink took exactly want (changes "<change> <uid>",
// in any order).
func waitTook(t *testing.T, ts *testSinks, sink string, want ...string) {
	t.Helper()
	var got []string
	ok := testenv.Poll(10*time.Second, 5*time.Millisecond, func() bool {
		ts.mu.Lock()
		got = slices.Clone(ts.changes[sink])
		ts.mu.Unlock()
		return slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
	})
	if !ok {
		t.Fatalf("sink %s took %v, want %v", sink, got, want)
	}
}

const (
	oneSink  = "  - name: one\n    test: {tag: x}\n    workers: 1\n"
	twoSink  = "  - name: two\n    test: {tag: x}\n    workers: 1\n"
	ruleOne  = "  - name: r1\n    resource: v1/configmaps\n    namespaces: [ns]\n    sinks: [one]\n"
	ruleKept = "  - name: r1\n    resource: v1/configmaps\n    namespaces: [ns]\n    labelSelector: keep=yes\n    sinks: [one]\n"
	ruleTwo  = "  - name: r2\n    resource: v1/configmaps\n    namespaces: [ns]\n    sinks: [two]\n"
)

// Alone: a start delivers the view, a change is delivered, a reload that
// narrows a rule deletes what it no longer selects and a new sink gets
// its rule's view, and a shutdown closes every sink.
func TestLifecycleAlone(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	c := newFakeCluster()
	c.put(t, "a", map[string]string{"keep": "yes"})
	c.put(t, "b", nil)
	b := New(Options{Config: lifecycleConfig(t, reg, oneSink, ruleOne), Clients: c.clients(), Sinks: reg, Logger: discard,
		CheckpointFile: filepath.Join(t.TempDir(), "state.db"), SyncTimeout: 10 * time.Second})
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitTook(t, ts, "one", "added uid-a", "added uid-b")
	c.put(t, "c", nil)
	waitTook(t, ts, "one", "added uid-a", "added uid-b", "added uid-c")

	if err := b.Reload(ctx, lifecycleConfig(t, reg, oneSink+twoSink, ruleKept+ruleTwo)); err != nil {
		t.Fatal(err)
	}
	waitTook(t, ts, "one", "added uid-a", "added uid-b", "added uid-c", "deleted uid-b", "deleted uid-c")
	waitTook(t, ts, "two", "added uid-a", "added uid-b", "added uid-c")
	if !b.Ready() {
		t.Error("not ready after the reload")
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ts.events(); !slices.Contains(got, "close one") || !slices.Contains(got, "close two") {
		t.Errorf("sinks not closed at shutdown: %v", got)
	}
	if err := b.Reload(ctx, lifecycleConfig(t, reg, oneSink, ruleOne)); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("a reload after shutdown: %v, want refused", err)
	}
}

// Under leader election: the leader delivers, the other waits; both
// reload (the waiting one its rules only); when the leader shuts down
// (releasing the Lease) the other leads on the new config, from the
// shared checkpoint: it sends what changed since, not the whole view.
func TestLifecycleLeaderHandover(t *testing.T) {
	ctx := context.Background()
	ts := &testSinks{}
	reg := ts.registry(t)
	c := newFakeCluster()
	c.put(t, "a", nil)
	state := filepath.Join(t.TempDir(), "state.db")
	replica := func(id string) *Bridge {
		return New(Options{Config: lifecycleConfig(t, reg, oneSink, ruleOne), Clients: c.clients(), Sinks: reg, Logger: discard,
			CheckpointFile: state, SyncTimeout: 10 * time.Second, CheckpointInterval: 10 * time.Millisecond,
			LeaderElection: &LeaderElection{Namespace: "default", Name: "kb", Identity: id,
				LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}})
	}
	a := replica("a")
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitTook(t, ts, "one", "added uid-a")
	b := replica("b")
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Shutdown(ctx) })
	if len(b.Deliveries()) != 0 {
		t.Fatal("the replica waiting for the Lease delivers")
	}
	v2 := func() *config.Config { return lifecycleConfig(t, reg, oneSink+twoSink, ruleOne+ruleTwo) }
	for _, r := range []*Bridge{a, b} {
		if err := r.Reload(ctx, v2()); err != nil {
			t.Fatal(err)
		}
	}
	waitTook(t, ts, "two", "added uid-a")
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	c.put(t, "b", nil)
	waitTook(t, ts, "one", "added uid-a", "added uid-b")
	waitTook(t, ts, "two", "added uid-a", "added uid-b")
	if len(b.Deliveries()) != 2 {
		t.Errorf("the new leader runs %d deliveries, want 2 (the new config's sinks)", len(b.Deliveries()))
	}
}

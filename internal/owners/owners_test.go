package owners

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/event"
)

func ref(kind, apiVersion string, m metav1.Object) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: m.GetName(), UID: m.GetUID(), Controller: &yes}
}

// must is v, failing the test (by panic, so the call reads on one line)
// when err is set.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var widgets = Resource{GVR: testenv.WidgetGVR, Kind: "Widget"}

// startResolver runs a resolver over what a Pod rule, a Job rule and an
// Event rule need, plus the test CRD and extra, until the test ends.
func startResolver(t *testing.T, mc metadata.Interface, extra ...Resource) *Resolver {
	t.Helper()
	var watches []Watch
	for _, res := range append(append(Needs(schema.GroupVersionResource{Version: "v1", Resource: "events"}), widgets), extra...) {
		watches = append(watches, Watch{Resource: res})
	}
	r := New(mc, watches, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, inf := range r.Informers() {
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
	}
	t.Cleanup(func() { r.Close(); cancel(); wg.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for !r.Synced() {
		if time.Now().After(deadline) {
			t.Fatal("the owners' caches did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}

// fullBudget gives r its whole wait budget back (a test's earlier waits
// spent some).
func fullBudget(r *Resolver) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.budget, r.budgetAt = budgetBurst, time.Now()
}

// podOwnedBy is a Pod just created (its owners may be waited for).
func podOwnedBy(ns, name string, refs ...metav1.OwnerReference) *unstructured.Unstructured {
	u, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), OwnerReferences: refs, CreationTimestamp: metav1.Now()}})
	return &unstructured.Unstructured{Object: u}
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// Against the real apiserver: a Pod's chain through its ReplicaSet to the
// Deployment, with their labels (an owner created a moment after the
// object is waited for); a Job's CronJob; a CRD owner; one of a kind not
// watched, or gone (its UID no longer the name's), named from the
// reference with the chain incomplete, and a reference waited for in
// vain not waited for again; a cycle in ownerReferences ends the chain;
// an Event's involved Pod with its owners.
func TestResolveAgainstTheAPIServer(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	mc := must(metadata.NewForConfig(cp.RESTConfig()))
	dyn := must(dynamic.NewForConfig(cp.RESTConfig()))
	testenv.InstallWidgetCRD(t, cp)
	const ns = "owners"
	testenv.EnsureNamespace(t, cp, ns)
	ctx := context.Background()
	r := startResolver(t, mc)
	wait := func(d time.Duration) time.Time { return time.Now().Add(d) }

	labels := map[string]string{"app": "web"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	d := must(cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"team": "payments"}},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}))
	rs := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{ref("Deployment", "apps/v1", d)}},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}))
	pod := podOwnedBy(ns, "web-6d4-x", ref("ReplicaSet", "apps/v1", rs))

	// Created a moment ago: waited for, not reported missing.
	rel := r.Related(podsGVR, pod, wait(10*time.Second))
	c := Chain{rel.Owners, rel.Incomplete}
	if c.Incomplete || c.String() != "ReplicaSet web-6d4 → Deployment web" {
		t.Fatalf("chain %+v", c)
	}
	if top, _ := rel.Top(); top.Labels["team"] != "payments" || top.UID != string(d.UID) || top.APIVersion != "apps/v1" {
		t.Errorf("top %+v", top)
	}

	// Job → CronJob.
	cj := must(cs.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Labels: map[string]string{"team": "data"}},
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}}}, metav1.CreateOptions{}))
	job := podOwnedBy(ns, "nightly-1", ref("CronJob", "batch/v1", cj))
	if rel := r.Related(schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, job, wait(10*time.Second)); rel.Incomplete ||
		len(rel.Owners) != 1 || rel.Owners[0].Kind != "CronJob" || rel.Owners[0].Labels["team"] != "data" {
		t.Errorf("job's chain %+v", rel)
	}

	// A CRD owner, served in another version than the reference names
	// (kinds are matched by group).
	w := must(dyn.Resource(testenv.WidgetGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.kubebridge.io/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "shop", "labels": map[string]any{"team": "payments"}}}}, metav1.CreateOptions{}))
	wref := ref("Widget", "example.kubebridge.io/v2", w)
	if rel := r.Related(podsGVR, podOwnedBy(ns, "shop-0", wref), wait(10*time.Second)); rel.Incomplete || len(rel.Owners) != 1 ||
		rel.Owners[0].Labels["team"] != "payments" {
		t.Errorf("CRD owner %+v", rel)
	}

	// A kind not watched: named, incomplete, at once.
	other := metav1.OwnerReference{APIVersion: "example.kubebridge.io/v1", Kind: "Gadget", Name: "g", UID: "g-uid"}
	start := time.Now()
	rel = r.Related(podsGVR, podOwnedBy(ns, "p2", other), wait(5*time.Second))
	if !rel.Incomplete || len(rel.Owners) != 1 || rel.Owners[0].Kind != "Gadget" || rel.Owners[0].Labels != nil || time.Since(start) > time.Second {
		t.Errorf("unwatched owner %+v after %s", rel, time.Since(start))
	}

	// Gone: the name's UID is another's. Waited for up to the wait, then
	// named; the next child of it does not wait again.
	stale := ref("ReplicaSet", "apps/v1", rs)
	stale.UID = "gone"
	start = time.Now()
	rel = r.Related(podsGVR, podOwnedBy(ns, "p3", stale), wait(300*time.Millisecond))
	if !rel.Incomplete || len(rel.Owners) != 1 || rel.Owners[0].Labels != nil || time.Since(start) < 300*time.Millisecond {
		t.Errorf("stale owner %+v after %s", rel, time.Since(start))
	}
	start = time.Now()
	if rel = r.Related(podsGVR, podOwnedBy(ns, "p3b", stale), wait(5*time.Second)); !rel.Incomplete || time.Since(start) > time.Second {
		t.Errorf("a reference missed before was waited for again: %+v after %s", rel, time.Since(start))
	}

	// Deleted: the caches saw it go, so its children do not wait for it.
	dead := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "dead"},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}))
	waitUntil(t, func() bool {
		return !r.Related(podsGVR, podOwnedBy(ns, "p-dead", ref("ReplicaSet", "apps/v1", dead)), time.Time{}).Incomplete
	})
	if err := cs.AppsV1().ReplicaSets(ns).Delete(ctx, "dead", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		return r.Related(podsGVR, podOwnedBy(ns, "p-dead", ref("ReplicaSet", "apps/v1", dead)), time.Time{}).Incomplete
	})
	time.Sleep(100 * time.Millisecond) // the delete handler runs after the cache has it
	start = time.Now()
	if rel = r.Related(podsGVR, podOwnedBy(ns, "p-dead2", ref("ReplicaSet", "apps/v1", dead)), wait(5*time.Second)); !rel.Incomplete || time.Since(start) > time.Second {
		t.Errorf("a deleted owner was waited for: %+v after %s", rel, time.Since(start))
	}

	// A cycle: two ReplicaSets owning each other end the chain.
	a := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}))
	b := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "b", OwnerReferences: []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", a)}},
		Spec: a.Spec}, metav1.CreateOptions{}))
	a.OwnerReferences = []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", b)}
	a = must(cs.AppsV1().ReplicaSets(ns).Update(ctx, a, metav1.UpdateOptions{}))
	waitUntil(t, func() bool {
		rel = r.Related(podsGVR, podOwnedBy(ns, "p4", ref("ReplicaSet", "apps/v1", a)), time.Time{})
		return len(rel.Owners) == 2
	})
	if c := (Chain{rel.Owners, rel.Incomplete}); c.Incomplete || c.String() != "ReplicaSet a → ReplicaSet b" {
		t.Errorf("cycle %+v", c)
	}

	// An Event about a Pod: the Pod's labels and its owners.
	p := must(cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4-y", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", rs)}}, Spec: tmpl.Spec}, metav1.CreateOptions{}))
	ev := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Event",
		"metadata": map[string]any{"name": "web-6d4-y.1", "namespace": ns}, "lastTimestamp": time.Now().UTC().Format(time.RFC3339),
		"involvedObject": map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": p.Name, "uid": string(p.UID)}}}
	rel = r.Related(schema.GroupVersionResource{Version: "v1", Resource: "events"}, ev, wait(10*time.Second))
	in := rel.Involved
	if in == nil || !in.Found || in.Incomplete || in.Labels["app"] != "web" || len(in.Owners) != 2 || in.Owners[1].Labels["team"] != "payments" {
		t.Fatalf("involved %+v", in)
	}
	// events.k8s.io/v1 names it regarding; a Node is not cached: named.
	ev = &unstructured.Unstructured{Object: map[string]any{"apiVersion": "events.k8s.io/v1", "kind": "Event",
		"metadata":  map[string]any{"name": "n.1", "namespace": "default"},
		"regarding": map[string]any{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "n1"}}}
	rel = r.Related(schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}, ev, wait(5*time.Second))
	if in := rel.Involved; in == nil || in.Found || !in.Incomplete || in.Kind != "Node" || in.Name != "node-1" {
		t.Errorf("involved node %+v", in)
	}

	// A chain longer than MaxDepth stops there and says so.
	var prev *appsv1.ReplicaSet
	for i := range MaxDepth + 2 {
		o := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("deep-%d", i)}, Spec: a.Spec}
		if prev != nil {
			o.OwnerReferences = []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", prev)}
		}
		prev = must(cs.AppsV1().ReplicaSets(ns).Create(ctx, o, metav1.CreateOptions{}))
	}
	rel = r.Related(podsGVR, podOwnedBy(ns, "deep", ref("ReplicaSet", "apps/v1", prev)), wait(10*time.Second))
	if !rel.Incomplete || len(rel.Owners) != MaxDepth || rel.Owners[0].Name != prev.Name {
		t.Errorf("deep chain: incomplete %v, %d owners", rel.Incomplete, len(rel.Owners))
	}

	// An owner created after its child's notification was evaluated is
	// waited for (a reference without a uid: the test cannot know the
	// owner's before creating it).
	later := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "later"}
	got := make(chan *event.Related)
	fullBudget(r)
	start = time.Now()
	go func() { got <- r.Related(podsGVR, podOwnedBy(ns, "early", later), wait(20*time.Second)) }()
	time.Sleep(300 * time.Millisecond)
	must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "later", Labels: map[string]string{"team": "late"},
		OwnerReferences: []metav1.OwnerReference{ref("Deployment", "apps/v1", d)}}, Spec: a.Spec}, metav1.CreateOptions{}))
	if rel := <-got; rel.Incomplete || len(rel.Owners) != 2 || rel.Owners[0].Labels["team"] != "late" || time.Since(start) < 300*time.Millisecond {
		t.Errorf("an owner created after its child: %+v after %s", rel, time.Since(start))
	}

	// Close ends a wait at once (the bridge is stopping).
	missing := ref("ReplicaSet", "apps/v1", rs)
	missing.Name, missing.UID = "not-yet", "not-yet"
	done := make(chan time.Duration)
	fullBudget(r) // else the budget, not Close, would end the wait
	start = time.Now()
	go func() {
		r.Related(podsGVR, podOwnedBy(ns, "p5", missing), wait(time.Minute))
		done <- time.Since(start)
	}()
	time.Sleep(100 * time.Millisecond)
	r.Close()
	if took := <-done; took > 700*time.Millisecond {
		t.Errorf("a wait outlived Close: %s", took)
	}
}

// An Event names its object by a reference its author writes: one in
// another namespace than the Event's is not looked up (its labels would
// choose where an Event anyone may create in their namespace goes), one
// in the Event's namespace, or cluster-scoped, is.
func TestInvolvedOnlyInTheEventsNamespace(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	mc := must(metadata.NewForConfig(cp.RESTConfig()))
	ctx := context.Background()
	testenv.EnsureNamespace(t, cp, "payments")
	testenv.EnsureNamespace(t, cp, "tenant-a")
	nodes := Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, Kind: "Node", Cluster: true}
	r := startResolver(t, mc, nodes)
	labels := map[string]string{"app": "ledger"}
	d := must(cs.AppsV1().Deployments("payments").Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "ledger", Labels: map[string]string{"team": "payments"}},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}, metav1.CreateOptions{}))
	n := must(cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "owners-node", Labels: map[string]string{"zone": "a"}}}, metav1.CreateOptions{}))
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	ledger := map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "payments", "name": "ledger", "uid": string(d.UID)}
	eventsGVR := schema.GroupVersionResource{Version: "v1", Resource: "events"}
	waitUntil(t, func() bool {
		return r.Related(eventsGVR, kubeEvent("payments", "e", ledger, time.Time{}), time.Time{}).Involved.Found
	})
	if in := r.Related(eventsGVR, kubeEvent("payments", "e", ledger, time.Time{}), time.Time{}).Involved; in.Labels["team"] != "payments" || in.Incomplete {
		t.Errorf("an Event of payments about its Deployment: %+v", in)
	}
	in := r.Related(eventsGVR, kubeEvent("tenant-a", "e", ledger, time.Time{}), time.Now().Add(5*time.Second)).Involved
	if in.Found || in.Labels != nil || in.Owners != nil || !in.Incomplete || in.Namespace != "payments" || in.Name != "ledger" || in.UID != string(d.UID) {
		t.Errorf("an Event of tenant-a about payments' Deployment: %+v", in)
	}
	node := map[string]any{"apiVersion": "v1", "kind": "Node", "name": n.Name}
	waitUntil(t, func() bool {
		return r.Related(eventsGVR, kubeEvent("default", "e", node, time.Time{}), time.Time{}).Involved.Found
	})
	if in := r.Related(eventsGVR, kubeEvent("tenant-a", "e", node, time.Time{}), time.Time{}).Involved; !in.Found || in.Labels["zone"] != "a" || in.UID != string(n.UID) {
		t.Errorf("an Event about a Node: %+v", in)
	}
}

// kubeEvent is an Event of namespace ns about involved, last reported at last
// (zero: no time).
func kubeEvent(ns, name string, involved map[string]any, last time.Time) *unstructured.Unstructured {
	ev := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Event",
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": "ev-" + name}, "involvedObject": involved}}
	if !last.IsZero() {
		ev.Object["lastTimestamp"] = last.UTC().Format(time.RFC3339)
	}
	return ev
}

// The owner wait runs on an informer's goroutine: it is spent only where it
// can help (a young object, a reference a cache can hold, not missed
// before) and within the resolver's budget, so that Events about Pods
// long gone (a start lists an hour of them), or Events anyone can write,
// do not add up to a stalled rule; the wait still finds an object created
// a moment after the Event about it.
func TestWaitOnlyWhereItHelps(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	mc := must(metadata.NewForConfig(cp.RESTConfig()))
	const ns = "owners-wait"
	testenv.EnsureNamespace(t, cp, ns)
	r := startResolver(t, mc)
	eventsGVR := schema.GroupVersionResource{Version: "v1", Resource: "events"}
	pod := func(name, uid string) map[string]any {
		m := map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name}
		if uid != "" {
			m["uid"] = uid
		}
		return m
	}
	timed := func(what string, max time.Duration, evs []*unstructured.Unstructured) {
		t.Helper()
		start := time.Now()
		for _, ev := range evs {
			if in := r.Related(eventsGVR, ev, time.Now().Add(time.Second)).Involved; in.Found || !in.Incomplete {
				t.Errorf("%s: %+v", what, in)
			}
		}
		if took := time.Since(start); took > max {
			t.Errorf("%s: %d Events took %s, more than %s", what, len(evs), took, max)
		}
	}

	// A start (or a relist) hands over an hour of Events about Pods
	// deleted since: none waits.
	var old []*unstructured.Unstructured
	for i := range 200 {
		old = append(old, kubeEvent(ns, fmt.Sprintf("old-%d", i), pod(fmt.Sprintf("gone-%d", i), fmt.Sprintf("u-%d", i)), time.Now().Add(-time.Hour)))
	}
	old = append(old, kubeEvent(ns, "untimed", pod("gone", "u"), time.Time{}))
	timed("old Events", 500*time.Millisecond, old)

	// References no cache can hold: a namespaced kind without a namespace
	// (a cluster-scoped child's reference to one), another namespace.
	fullBudget(r)
	start := time.Now()
	rel := r.Related(podsGVR, podOwnedBy("", "cluster-child", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs"}), time.Now().Add(time.Second))
	in := r.Related(eventsGVR, kubeEvent("elsewhere", "e", pod("p", "p"), time.Now()), time.Now().Add(time.Second)).Involved
	if !rel.Incomplete || !in.Incomplete || time.Since(start) > 200*time.Millisecond {
		t.Errorf("references no cache holds: %+v, %+v after %s", rel, in, time.Since(start))
	}

	// Young Events about missing Pods (the reviewer's case: with and
	// without uids): a reference waited for in vain is remembered (by name
	// without a uid), and all of them together wait no more than the budget.
	var young []*unstructured.Unstructured
	for i := range 5 {
		young = append(young, kubeEvent(ns, fmt.Sprintf("a-%d", i), pod("missing", ""), time.Now()))
	}
	for i := range 20 {
		young = append(young, kubeEvent(ns, fmt.Sprintf("b-%d", i), pod("missing", fmt.Sprintf("m-%d", i)), time.Now()))
	}
	fullBudget(r)
	timed("young Events", 3*budgetBurst, young) // 25 waits without the budget

	// The wait is still worth it: a Pod created a moment after the Event
	// about it is found.
	fullBudget(r)
	got := make(chan *event.Involved)
	go func() {
		got <- r.Related(eventsGVR, kubeEvent(ns, "early", pod("late", ""), time.Now()), time.Now().Add(time.Second)).Involved
	}()
	time.Sleep(100 * time.Millisecond)
	must(cs.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "late", Labels: map[string]string{"app": "late"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{}))
	if in := <-got; !in.Found || in.Labels["app"] != "late" {
		t.Errorf("a Pod created just after the Event about it: %+v", in)
	}
}

// The budget: at most budgetBurst of waiting at once, refilled at
// budgetBurst per budgetEvery.
func TestWaitBudget(t *testing.T) {
	r := New(nil, nil, nil)
	now := time.Now()
	r.budgetAt = now
	if !r.spend(budgetBurst, now) || r.spend(time.Millisecond, now) {
		t.Fatal("the burst is not the budget")
	}
	if !r.spend(budgetBurst/10, now.Add(budgetEvery/10)) || r.spend(time.Millisecond, now.Add(budgetEvery/10)) {
		t.Error("the refill is not the rate")
	}
	if !r.spend(budgetBurst, now.Add(time.Hour)) || r.spend(time.Millisecond, now.Add(time.Hour)) {
		t.Error("an idle hour refills more than the burst")
	}
}

func waitUntil(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The caches keep only the labels the rules show (their ownerLabels), or
// all of them; never annotations or managedFields.
func TestTrimKeepsTheLabelsShown(t *testing.T) {
	obj := func() *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "a", UID: "u",
			Labels: map[string]string{"team": "payments", "pod-template-hash": "6d4"}, Annotations: map[string]string{"big": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	}
	for _, tc := range []struct {
		keep []string
		want map[string]string
	}{{nil, map[string]string{"team": "payments", "pod-template-hash": "6d4"}}, {[]string{"team", "app"}, map[string]string{"team": "payments"}}, {[]string{}, map[string]string{}}} {
		got, err := trim(tc.keep)(obj())
		m := got.(*metav1.PartialObjectMetadata)
		if err != nil || !maps.Equal(m.Labels, tc.want) || m.Annotations != nil || m.ManagedFields != nil || m.UID != "u" || m.Name != "web" {
			t.Errorf("keep %v: %+v, %v", tc.keep, m.ObjectMeta, err)
		}
	}
}

// Against the real apiserver: OnChange reports an owner added, relabelled
// or deleted (not a change a chain does not read, an annotation), and
// Below walks down from a Deployment to its ReplicaSet and its Pod.
func TestOnChangeAndBelow(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	mc := must(metadata.NewForConfig(cp.RESTConfig()))
	const ns = "owners-below"
	testenv.EnsureNamespace(t, cp, ns)
	ctx := context.Background()
	var watches []Watch
	for _, res := range Needs(schema.GroupVersionResource{Version: "v1", Resource: "events"}) {
		watches = append(watches, Watch{Resource: res, Namespace: ns})
	}
	r := New(mc, watches, nil)
	var mu sync.Mutex
	var got []string
	err := r.OnChange(func(before, after metav1.Object) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case before == nil:
			got = append(got, "added "+after.GetName())
		case after == nil:
			got = append(got, "deleted "+before.GetName())
		default:
			got = append(got, fmt.Sprintf("changed %s %v", after.GetName(), after.GetLabels()))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, inf := range r.Informers() {
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(runCtx) }()
	}
	t.Cleanup(func() { r.Close(); cancel(); wg.Wait() })
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 30s (reported %q)", what, got)
			}
		}
	}
	eventually("synced", r.Synced)
	reported := func(want ...string) {
		t.Helper()
		eventually(fmt.Sprintf("reported %q", want), func() bool {
			mu.Lock()
			defer mu.Unlock()
			slices.Sort(got) // the informers of several kinds report in any order
			if !slices.Equal(got, want) {
				return false
			}
			got = nil
			return true
		})
	}

	labels := map[string]string{"app": "web"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	d := must(cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"team": "payments"}},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}))
	rs := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{ref("Deployment", "apps/v1", d)}},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}))
	pod := must(cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4-x", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", rs)}}, Spec: tmpl.Spec}, metav1.CreateOptions{}))
	reported("added web", "added web-6d4", "added web-6d4-x")
	below := r.Below(string(d.UID))
	slices.Sort(below)
	want := []string{string(rs.UID), string(pod.UID)}
	slices.Sort(want)
	if !slices.Equal(below, want) {
		t.Errorf("Below(Deployment) = %q, want its ReplicaSet's and Pod's %q", below, want)
	}
	if below := r.Below(string(pod.UID)); len(below) != 0 {
		t.Errorf("Below(Pod) = %q, want none", below)
	}

	d.Annotations = map[string]string{"note": "x"}
	d = must(cs.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}))
	d.Labels = map[string]string{"team": "search"}
	must(cs.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}))
	reported("changed web map[team:search]") // the annotation: not reported
	if err := cs.AppsV1().ReplicaSets(ns).Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	reported("deleted web-6d4")
}

package owners

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/kubebridge/kubebridge/internal/testenv"
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

func startResolver(t *testing.T, cs kubernetes.Interface, mc metadata.Interface) *Resolver {
	t.Helper()
	r := New(mc, DefaultResources)
	ctx, cancel := context.WithCancel(context.Background())
	r.Start(ctx)
	t.Cleanup(func() { cancel(); r.Shutdown() })
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !r.WaitForSync(sctx) {
		t.Fatal("the owners' caches did not sync")
	}
	return r
}

// Against the real apiserver: a Pod's chain through its ReplicaSet to the
// Deployment, with their labels; an owner created a moment after the
// object is waited for; one of a kind not watched, or gone (its UID no
// longer the name's), is named from the reference and the chain says it
// is incomplete; a cycle in ownerReferences ends the chain.
func TestResolveAgainstTheAPIServer(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	mc, err := metadata.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "owners"
	testenv.EnsureNamespace(t, cp, ns)
	ctx := context.Background()
	r := startResolver(t, cs, mc)

	labels := map[string]string{"app": "web"}
	d := must(cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"team": "payments"}},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}},
		metav1.CreateOptions{}))
	rs := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{ref("Deployment", "apps/v1", d)}},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}},
		metav1.CreateOptions{}))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-6d4-x", Namespace: ns, UID: "pod-uid",
		OwnerReferences: []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", rs)}}}

	// Created a moment ago: waited for, not reported missing.
	c := r.Resolve(ctx, pod, 10*time.Second)
	if !c.Complete || c.String() != "ReplicaSet web-6d4 → Deployment web" {
		t.Fatalf("chain %+v", c)
	}
	if top, _ := c.Top(); top.Labels["team"] != "payments" || top.UID != d.UID || !top.Resolved {
		t.Errorf("top %+v", top)
	}

	// A kind not watched: named, incomplete, at once.
	widget := metav1.OwnerReference{APIVersion: "example.kubebridge.io/v1", Kind: "Widget", Name: "w", UID: "w-uid"}
	start := time.Now()
	c = r.Resolve(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p2", Namespace: ns, OwnerReferences: []metav1.OwnerReference{widget}}}, 5*time.Second)
	if c.Complete || len(c.Owners) != 1 || c.Owners[0].Kind != "Widget" || c.Owners[0].Resolved || time.Since(start) > time.Second {
		t.Errorf("unwatched owner %+v after %s", c, time.Since(start))
	}

	// Gone: the name's UID is another's. Waited for up to the wait, then named.
	stale := ref("ReplicaSet", "apps/v1", rs)
	stale.UID = "gone"
	start = time.Now()
	c = r.Resolve(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p3", Namespace: ns, OwnerReferences: []metav1.OwnerReference{stale}}}, 300*time.Millisecond)
	if c.Complete || len(c.Owners) != 1 || c.Owners[0].Resolved || time.Since(start) < 300*time.Millisecond {
		t.Errorf("stale owner %+v after %s", c, time.Since(start))
	}

	// A cycle: two ReplicaSets owning each other end the chain.
	a := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}},
		metav1.CreateOptions{}))
	b := must(cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "b", OwnerReferences: []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", a)}},
		Spec: a.Spec}, metav1.CreateOptions{}))
	a.OwnerReferences = []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", b)}
	a = must(cs.AppsV1().ReplicaSets(ns).Update(ctx, a, metav1.UpdateOptions{}))
	c = r.Resolve(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p4", Namespace: ns, OwnerReferences: []metav1.OwnerReference{ref("ReplicaSet", "apps/v1", a)}}}, 10*time.Second)
	if len(c.Owners) > MaxDepth || c.String() != "ReplicaSet a → ReplicaSet b" {
		t.Errorf("cycle %+v", c)
	}
}

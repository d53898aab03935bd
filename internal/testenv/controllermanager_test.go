package testenv_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// With kube-controller-manager the cluster reconciles: a Deployment gets a
// ReplicaSet and its Pods, the controllers write their Events, and a deleted
// namespace goes away.
func TestControllerManagerReconciles(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t)
	cp.StartControllerManager(t)
	cs := cp.Clientset(t)
	ctx := context.Background()

	const ns = "kcm"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var rsName string
	var pods int
	var reasons map[string]bool
	ok := testenv.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		rss, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(rss.Items) != 1 {
			return false
		}
		rsName = rss.Items[0].Name
		ps, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		pods = 0
		for _, p := range ps.Items {
			for _, o := range p.OwnerReferences {
				if o.Kind == "ReplicaSet" && o.Name == rsName {
					pods++
				}
			}
		}
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		reasons = map[string]bool{}
		for _, e := range evs.Items {
			reasons[e.Reason] = true
		}
		return pods == 2 && reasons["ScalingReplicaSet"] && reasons["SuccessfulCreate"]
	})
	if !ok {
		t.Fatalf("after 60s: ReplicaSet %q, %d of 2 Pods owned by it, Event reasons %v (want ScalingReplicaSet, SuccessfulCreate)", rsName, pods, reasons)
	}

	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !testenv.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}) {
		t.Fatal("the deleted namespace still exists after 60s")
	}
}

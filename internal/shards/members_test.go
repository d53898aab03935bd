package shards_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Whoever may write Leases in the namespace cannot add shard members: member
// Leases renewed by such a writer (naming no Pod, a Pod not running, one
// without the replicas' labels, or a replica's Pod without its uid) are not
// counted, so the one real replica keeps delivering every shard; a second
// real replica, in its running Pod, is counted and gets its share.
func TestFakeMembersTakeNoShards(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := "shard-members"
	testenv.EnsureNamespace(t, cp, ns)
	cs := cp.Clientset(t)
	ctx := context.Background()
	leases, pods := cs.CoordinationV1().Leases(ns), cs.CoreV1().Pods(ns)
	group := fmt.Sprintf("m%d", time.Now().UnixNano()%1e6)
	replicaLabels := map[string]string{"app": group}
	pod := func(name string, lbls map[string]string, phase corev1.PodPhase) *corev1.Pod {
		t.Helper()
		p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "bridge", Image: "kubebridge"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		if p, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
		return p
	}
	start := func(p *corev1.Pod) *recorder {
		o, rec := startOwner(t, shards.Options{Leases: leases, Group: group, Identity: p.Name, Shards: 4,
			LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond,
			Pods: &shards.MemberPods{Pods: pods, Selector: labels.SelectorFromSet(replicaLabels), UID: string(p.UID)}})
		t.Cleanup(func() { o.Halt(); o.Release() })
		return rec
	}
	delivering := func(rec *recorder) []int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var out []int
		for i := range rec.delivering {
			out = append(out, i)
		}
		slices.Sort(out)
		return out
	}

	a := start(pod(group+"-a", replicaLabels, corev1.PodRunning))
	stranger := pod(group+"-stranger", map[string]string{"app": "other"}, corev1.PodRunning)
	pending := pod(group+"-pending", replicaLabels, corev1.PodPending)
	// The fakes, as a Lease writer makes them: named and labelled as a
	// replica's member Lease, renewed every 200 ms.
	fakes := map[string]string{ // holder -> the pod uid its Lease claims
		"fake-no-pod":  "0b6b0a4e-0000-4000-8000-000000000000",
		stranger.Name:  string(stranger.UID),
		pending.Name:   string(pending.UID),
		group + "-a-2": "", // a second Lease for no Pod
	}
	fakeCtx, stopFakes := context.WithCancel(ctx)
	defer stopFakes()
	go func() {
		for fakeCtx.Err() == nil {
			for holder, uid := range fakes {
				name := fmt.Sprintf("%s-member-%016x", group, shards.Hash(holder))
				now, secs := metav1.NewMicroTime(time.Now()), int32(2)
				l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name,
					Labels:      map[string]string{shards.LabelGroup: group, "kubebridge.io/role": "member"},
					Annotations: map[string]string{"kubebridge.io/pod-uid": uid}},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &now}}
				if cur, err := leases.Get(fakeCtx, name, metav1.GetOptions{}); err == nil {
					l.ResourceVersion = cur.ResourceVersion
					_, _ = leases.Update(fakeCtx, l, metav1.UpdateOptions{})
				} else {
					_, _ = leases.Create(fakeCtx, l, metav1.CreateOptions{})
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	// The fakes are renewed well past a lease duration and several
	// rounds: the real replica still delivers all 4 shards.
	if !testenv.Poll(15*time.Second, 50*time.Millisecond, func() bool { return len(delivering(a)) == 4 }) {
		t.Fatalf("the replica delivers shards %v beside the fake members; want all 4", delivering(a))
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if got := delivering(a); len(got) != 4 {
			t.Fatalf("fake members took shards from the real replica: it delivers %v", got)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A real replica is counted: the two share the shards.
	b := start(pod(group+"-b", replicaLabels, corev1.PodRunning))
	if !testenv.Poll(15*time.Second, 50*time.Millisecond, func() bool { return len(delivering(a)) == 2 && len(delivering(b)) == 2 }) {
		t.Fatalf("with a second real replica: a delivers %v, b %v; want 2 each", delivering(a), delivering(b))
	}
}

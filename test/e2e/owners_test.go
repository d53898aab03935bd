package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// ownersData is what include: [owners] adds to an event's data.
type ownersData struct {
	Owners     []ownerRef `json:"owners"`
	Incomplete bool       `json:"ownersIncomplete"`
	Involved   *struct {
		Kind, Namespace, Name, UID string
		Labels                     map[string]string
		Owners                     []ownerRef
		OwnersIncomplete           bool
	} `json:"involved"`
}

type ownerRef struct {
	APIVersion, Kind, Name, UID string
	Labels                      map[string]string
}

func (d ownersData) chain() string {
	var s []string
	for _, o := range d.Owners {
		s = append(s, o.Kind+" "+o.Name)
	}
	return strings.Join(s, " → ")
}

func ownersOf(t *testing.T, e ce) ownersData {
	t.Helper()
	var env struct {
		Data ownersData `json:"data"`
	}
	must(t, json.Unmarshal(e.raw, &env))
	return env.Data
}

func controllerRef(kind, apiVersion string, m metav1.Object) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: m.GetName(), UID: m.GetUID(), Controller: &yes}}
}

// deploymentChain creates by hand what the Deployment controller would:
// Deployment name (labels dl) → ReplicaSet name-6d4 → Pods name-6d4-<i>.
func deploymentChain(t *testing.T, cs kubernetes.Interface, ns, name string, dl map[string]string, pods int) (*appsv1.Deployment, *appsv1.ReplicaSet) {
	t.Helper()
	ctx := context.Background()
	sel := map[string]string{"app": name}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	d, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: dl},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tmpl}}, metav1.CreateOptions{})
	must(t, err)
	rs, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name + "-6d4", Labels: sel,
		OwnerReferences: controllerRef("Deployment", "apps/v1", d)},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tmpl}}, metav1.CreateOptions{})
	must(t, err)
	for i := range pods {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-6d4-" + string(rune('a'+i)), Labels: sel,
			OwnerReferences: controllerRef("ReplicaSet", "apps/v1", rs)}, Spec: tmpl.Spec}, metav1.CreateOptions{})
		must(t, err)
	}
	return d, rs
}

// include: [owners] against the real apiserver, chains made by hand (no
// controller-manager needed): a Pod's ReplicaSet and Deployment with their
// labels, top controller last; a Job's CronJob; a CRD owner (an
// ownerResource); a cycle of ReplicaSets ends; an owner the bridge never
// finds is waited for, then named from its reference, the chain marked
// incomplete and counted; Events about Pods (core/v1 and events.k8s.io/v1)
// carry the Pod with its owners, and a where on them lets through exactly
// the Events of Pods whose Deployment has team=payments.
func TestOwnersInEnvelopeAndWhere(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	testenv.InstallWidgetCRD(t, cp)
	const ns = "e2e-owners"
	testenv.EnsureNamespace(t, cp, ns)
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "events.jsonl")
	// Every rule names the labels it shows: the caches keep those only.
	payments := "    include: [owners]\n    ownerLabels: [team, app]\n    where: \"involved.owners.exists(o, o.kind == 'Deployment' && o.labels.team == 'payments')\"\n"
	b := startBridge(t, cp, fileConfig(out,
		rule("pods", "v1/pods", ns)+"    include: [object, owners]\n    ownerLabels: [team, app]\n    ownerResources: [example.kubebridge.io/v1/widgets, v1/nodes]\n",
		rule("jobs", "batch/v1/jobs", ns)+"    include: [metadata, owners]\n    ownerLabels: [team]\n",
		rule("warnings", "v1/events", ns)+payments,
		rule("new-warnings", "events.k8s.io/v1/events", ns)+payments))

	deploymentChain(t, cs, ns, "web", map[string]string{"team": "payments", "cost-center": "4711"}, 2)
	deploymentChain(t, cs, ns, "shop", map[string]string{"team": "search"}, 1)
	cj, err := cs.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Labels: map[string]string{"team": "data"}},
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}}}, metav1.CreateOptions{})
	must(t, err)
	_, err = cs.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly-29000000", OwnerReferences: controllerRef("CronJob", "batch/v1", cj)},
		Spec: cj.Spec.JobTemplate.Spec}, metav1.CreateOptions{})
	must(t, err)
	w, err := dyn.Resource(testenv.WidgetGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.kubebridge.io/v1", "kind": "Widget", "metadata": map[string]any{"name": "shop-widget", "labels": map[string]any{"team": "search"}}}},
		metav1.CreateOptions{})
	must(t, err)
	podSpec := corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "widget-0", OwnerReferences: controllerRef("Widget", "example.kubebridge.io/v1", w)},
		Spec: podSpec}, metav1.CreateOptions{})
	must(t, err)
	// A cluster-scoped owner of a namespaced Pod: a Node (as the kubelet
	// makes its static Pods' mirror Pods).
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "e2e-owners-node", Labels: map[string]string{"team": "infra"}}}, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy-x", OwnerReferences: controllerRef("Node", "v1", node)},
		Spec: podSpec}, metav1.CreateOptions{})
	must(t, err)
	// A cycle: ReplicaSets a and b own each other; a Pod of a.
	rsSpec := appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "loop"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "loop"}}, Spec: podSpec}}
	a, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "loop-a"}, Spec: rsSpec}, metav1.CreateOptions{})
	must(t, err)
	bb, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "loop-b", OwnerReferences: controllerRef("ReplicaSet", "apps/v1", a)}, Spec: rsSpec}, metav1.CreateOptions{})
	must(t, err)
	a.OwnerReferences = controllerRef("ReplicaSet", "apps/v1", bb)
	a, err = cs.AppsV1().ReplicaSets(ns).Update(ctx, a, metav1.UpdateOptions{})
	must(t, err)
	time.Sleep(500 * time.Millisecond) // the cycle is in the caches before its Pod
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "loop-a-x", OwnerReferences: controllerRef("ReplicaSet", "apps/v1", a)},
		Spec: podSpec}, metav1.CreateOptions{})
	must(t, err)
	// An owner that never comes: its reference names a ReplicaSet no cache
	// will hold (the apiserver does not check; the garbage collector, not
	// running here, would).
	ghost := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "ghost", UID: "0badc0de-0000-4000-8000-000000000000"}}
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orphan", OwnerReferences: controllerRef("ReplicaSet", "apps/v1", ghost)},
		Spec: podSpec}, metav1.CreateOptions{})
	must(t, err)

	// Warning Events about web's Pod (team payments) and shop's (search).
	for _, p := range []string{"web-6d4-a", "shop-6d4-a"} {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, p, metav1.GetOptions{})
		must(t, err)
		now := metav1.Now()
		_, err = cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: p + ".backoff"},
			InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: p, UID: pod.UID},
			Type:           "Warning", Reason: "BackOff", Message: "Back-off restarting failed container c", Count: 1,
			FirstTimestamp: now, LastTimestamp: now, Source: corev1.EventSource{Component: "kubelet"}}, metav1.CreateOptions{})
		must(t, err)
	}

	evs := waitEvents(t, out, "every object's added", func(evs []ce) bool {
		return has(evs, "pods", ns+"/web-6d4-b", "added") && has(evs, "pods", ns+"/shop-6d4-a", "added") && has(evs, "pods", ns+"/widget-0", "added") &&
			has(evs, "pods", ns+"/loop-a-x", "added") && has(evs, "pods", ns+"/kube-proxy-x", "added") && has(evs, "pods", ns+"/orphan", "added") && has(evs, "jobs", ns+"/nightly-29000000", "added") &&
			has(evs, "warnings", ns+"/web-6d4-a.backoff", "added") && has(evs, "new-warnings", ns+"/web-6d4-a.backoff", "added")
	})
	first := map[string]ownersData{}
	for _, e := range evs {
		if _, ok := first[e.Rule+" "+e.Subject]; !ok && e.change() == "added" {
			first[e.Rule+" "+e.Subject] = ownersOf(t, e)
		}
	}
	for key, want := range map[string]string{
		"pods " + ns + "/web-6d4-a":        "ReplicaSet web-6d4 → Deployment web",
		"pods " + ns + "/shop-6d4-a":       "ReplicaSet shop-6d4 → Deployment shop",
		"pods " + ns + "/widget-0":         "Widget shop-widget",
		"pods " + ns + "/loop-a-x":         "ReplicaSet loop-a → ReplicaSet loop-b",
		"pods " + ns + "/kube-proxy-x":     "Node e2e-owners-node",
		"jobs " + ns + "/nightly-29000000": "CronJob nightly",
	} {
		if got := first[key]; got.chain() != want || got.Incomplete {
			t.Errorf("%s: owners %q (incomplete %v), want %q", key, got.chain(), got.Incomplete, want)
		}
	}
	if top := first["pods "+ns+"/web-6d4-a"].Owners[1]; top.Labels["team"] != "payments" || len(top.Labels) != 1 || top.APIVersion != "apps/v1" || top.UID == "" {
		t.Errorf("web's top owner %+v", top)
	}
	if w := first["pods "+ns+"/widget-0"].Owners[0]; w.Labels["team"] != "search" {
		t.Errorf("the CRD owner %+v", w)
	}
	if o := first["pods "+ns+"/orphan"]; !o.Incomplete || o.chain() != "ReplicaSet ghost" || o.Owners[0].Labels != nil {
		t.Errorf("an owner never found: %+v", o)
	}
	for _, r := range []string{"warnings", "new-warnings"} {
		in := first[r+" "+ns+"/web-6d4-a.backoff"].Involved
		if in == nil || in.Kind != "Pod" || in.Name != "web-6d4-a" || in.Labels["app"] != "web" || len(in.Owners) != 2 || in.Owners[1].Labels["team"] != "payments" {
			t.Errorf("%s: involved %+v", r, in)
		}
		if has(evs, r, ns+"/shop-6d4-a.backoff", "added") {
			t.Errorf("%s: the Event of a Pod of team search passed the where", r)
		}
	}
	_, text := get(t, b.adminURL()+"/metrics")
	if !regexp.MustCompile(`kubebridge_owners_incomplete_total\{rule="pods"\} [1-9]`).MatchString(text) {
		t.Errorf("the incomplete chain is not counted:\n%s", grepLines(text, "owners"))
	}
	if !regexp.MustCompile(`kubebridge_informer_cached_objects\{informer="owners:apps/v1/deployments in ` + ns + `"\} 2`).MatchString(text) {
		t.Errorf("the owners' caches are not reported:\n%s", grepLines(text, "cached"))
	}
	if strings.Contains(text, `rule_where_errors_total{rule="warnings"} 1`) {
		t.Errorf("the where failed:\n%s", grepLines(text, "where"))
	}
}

// With the real kube-controller-manager: a Deployment's ReplicaSet and
// Pods, made by its controllers, carry their owners (a Pod: its
// ReplicaSet, then the Deployment with its labels); the controllers' own
// Events (ScalingReplicaSet about the Deployment, SuccessfulCreate about
// the ReplicaSet) carry the object they are about with its owners, and a
// where on the Deployment's team lets through the Events of its
// ReplicaSet only (the Deployment owns it; nothing owns the Deployment).
func TestOwnersFromTheControllerManager(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t)
	cp.StartControllerManager(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "kcm-owners"
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(t, err)
	out := filepath.Join(t.TempDir(), "events.jsonl")
	startBridge(t, cp, fileConfig(out,
		rule("pods", "v1/pods", ns)+"    include: [metadata, owners]\n",
		rule("replicasets", "apps/v1/replicasets", ns)+"    include: [metadata, owners]\n",
		rule("events", "v1/events", ns)+"    include: [owners]\n",
		rule("payments", "v1/events", ns)+"    include: [owners]\n    where: \"involved.owners.exists(o, o.kind == 'Deployment' && o.labels.team == 'payments')\"\n"))

	sel := map[string]string{"app": "web"}
	replicas := int32(2)
	_, err = cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"team": "payments"}},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}}}}},
		metav1.CreateOptions{})
	must(t, err)

	reason := func(e ce) string {
		var env struct {
			Data struct {
				Object struct{ Reason string } `json:"object"`
			} `json:"data"`
		}
		_ = json.Unmarshal(e.raw, &env)
		return env.Data.Object.Reason
	}
	evs := waitEvents(t, out, "the Pods, the ReplicaSet and the controllers' Events", func(evs []ce) bool {
		pods, rs, reasons := 0, 0, map[string]bool{}
		for _, e := range evs {
			switch e.Rule {
			case "pods":
				pods++
			case "replicasets":
				rs++
			case "events":
				reasons[reason(e)] = true
			}
		}
		return pods >= 2 && rs >= 1 && reasons["ScalingReplicaSet"] && reasons["SuccessfulCreate"]
	})
	var rsName string
	for _, e := range evs {
		if e.Rule == "replicasets" && e.change() == "added" {
			rsName = e.Subject[len(ns)+1:]
			if got := ownersOf(t, e); got.chain() != "Deployment web" || got.Incomplete || got.Owners[0].Labels["team"] != "payments" {
				t.Errorf("ReplicaSet %s: owners %+v", e.Subject, got)
			}
		}
	}
	for _, e := range evs {
		switch e.Rule {
		case "pods":
			if got := ownersOf(t, e); got.chain() != "ReplicaSet "+rsName+" → Deployment web" || got.Incomplete {
				t.Errorf("Pod %s (%s): owners %q incomplete %v", e.Subject, e.change(), got.chain(), got.Incomplete)
			}
		case "events", "payments":
			in := ownersOf(t, e).Involved
			switch r := reason(e); r {
			case "ScalingReplicaSet":
				if in == nil || in.Kind != "Deployment" || in.Name != "web" || in.Labels["team"] != "payments" || len(in.Owners) != 0 || in.OwnersIncomplete {
					t.Errorf("%s %s: involved %+v", e.Rule, r, in)
				}
				if e.Rule == "payments" {
					t.Errorf("the Deployment's own Event passed the where on its owners")
				}
			case "SuccessfulCreate":
				if in == nil || in.Kind != "ReplicaSet" || in.Name != rsName || len(in.Owners) != 1 || in.Owners[0].Name != "web" || in.OwnersIncomplete {
					t.Errorf("%s %s: involved %+v", e.Rule, r, in)
				}
			}
		}
	}
	waitEvents(t, out, "the ReplicaSet's Events through the where", func(evs []ce) bool {
		for _, e := range evs {
			if e.Rule == "payments" && reason(e) == "SuccessfulCreate" {
				return true
			}
		}
		return false
	})
}

// A start of an Events rule with include: [owners] over Events about Pods
// deleted before it (Events outlive their Pods by an hour): what the
// informer lists is not waited for (the owners' caches synced first), so
// the start does not cost a wait per Event, serially, on the informer's
// goroutine; each is sent with its object named from the reference,
// incomplete, and counted.
func TestOwnersColdStartOverEventsAboutGonePods(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	const ns, n = "e2e-owners-cold", 60
	testenv.EnsureNamespace(t, cp, ns)
	ctx := context.Background()
	for i := range n {
		now := metav1.Now()
		name := fmt.Sprintf("gone-%d", i)
		_, err := cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name + ".killing"},
			InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("0badc0de-0000-4000-8000-%012d", i))},
			Type:           "Normal", Reason: "Killing", Message: "Stopping container c", Count: 1,
			FirstTimestamp: now, LastTimestamp: now, Source: corev1.EventSource{Component: "kubelet"}}, metav1.CreateOptions{})
		must(t, err)
	}
	out := filepath.Join(t.TempDir(), "events.jsonl")
	start := time.Now()
	b := startBridge(t, cp, fileConfig(out, rule("events", "v1/events", ns)+"    include: [owners]\n"))
	evs := waitEvents(t, out, "every Event", func(evs []ce) bool {
		for i := range n {
			if !has(evs, "events", fmt.Sprintf("%s/gone-%d.killing", ns, i), "added") {
				return false
			}
		}
		return true
	})
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the start took %s for %d Events about gone Pods (a wait each: %d s)", took, n, n)
	}
	for _, e := range evs {
		if in := ownersOf(t, e).Involved; in == nil || in.Kind != "Pod" || in.Labels != nil || !in.OwnersIncomplete {
			t.Errorf("%s: involved %+v", e.Subject, in)
		}
	}
	_, text := get(t, b.adminURL()+"/metrics")
	if !strings.Contains(text, fmt.Sprintf(`kubebridge_owners_incomplete_total{rule="events"} %d`, n)) {
		t.Errorf("the incomplete Events are not counted:\n%s", grepLines(text, "owners"))
	}
}

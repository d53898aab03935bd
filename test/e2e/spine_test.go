package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

const spineConfig = `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: out
    file: {path: OUT}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [e2e-a]
    include: [object, oldObject, patch]
    sinks: [out]
  - name: deploys
    resource: apps/v1/deployments
    namespaces: [e2e-a]
    sinks: [out]
  - name: widgets
    resource: example.kubebridge.io/v1/widgets
    sinks: [out]
  - name: labelled
    resource: v1/configmaps
    namespaces: [e2e-b]
    labelSelector: tier=front
    sinks: [out]
  - name: fields
    resource: v1/configmaps
    namespaces: [e2e-b]
    fieldSelector: metadata.name=exact
    sinks: [out]
  - name: indexed
    resource: v1/configmaps
    namespaces: [e2e-b]
    index: {"label:team": [pay, ops]}
    sinks: [out]
  - name: where
    resource: v1/configmaps
    namespaces: [e2e-b]
    where: "object.?data.?size.orValue('') == 'big'"
    sinks: [out]
  - name: changed
    resource: v1/configmaps
    namespaces: [e2e-b]
    changed: [data.watch]
    sinks: [out]
  - name: deletes
    resource: v1/configmaps
    namespaces: [e2e-b]
    events: [deleted]
    sinks: [out]
  - name: nssel
    resource: v1/configmaps
    namespaceSelector: kb-e2e=on
    sinks: [out]
  - name: secrets
    resource: v1/secrets
    namespaces: [e2e-a]
    include: [object, patch]
    sinks: [out]
`

// TestSpine runs the bridge with a file sink over ConfigMaps, Deployments,
// a CRD and Secrets, and checks each filter kind, view transitions, the
// envelope, redaction and that managedFields never leave the cluster.
func TestSpine(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.InstallWidgetCRD(t, cp)
	for _, ns := range []string{"e2e-a", "e2e-b", "e2e-sel"} {
		testenv.EnsureNamespace(t, cp, ns)
	}
	out := filepath.Join(t.TempDir(), "events.jsonl")
	startBridge(t, cp, strings.Replace(spineConfig, "OUT", out, 1))

	cs := cp.Clientset(t)
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	ctx := context.Background()

	t.Run("configmap lifecycle and envelope", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps("e2e-a")
		created, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c1"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
		must(t, err)
		updated := created.DeepCopy()
		updated.Data["k"] = "v2"
		updated, err = cms.Update(ctx, updated, metav1.UpdateOptions{})
		must(t, err)
		must(t, cms.Delete(ctx, "c1", metav1.DeleteOptions{}))

		evs := waitEvents(t, out, "cms added/updated/deleted", func(evs []ce) bool { return len(of(evs, "cms", "e2e-a/c1")) == 3 })
		if got := of(evs, "cms", "e2e-a/c1"); strings.Join(got, ",") != "added,updated,deleted" {
			t.Fatalf("cms events = %v", got)
		}
		var add, upd, del ce
		for _, e := range evs {
			if e.Rule == "cms" && e.Subject == "e2e-a/c1" {
				switch e.change() {
				case "added":
					add = e
				case "updated":
					upd = e
				case "deleted":
					del = e
				}
			}
		}
		uid := string(created.UID)
		// <uid>.<tag>.<rv>.<type>: one tag for the rule and this incarnation.
		tag := strings.Split(add.ID, ".")[1]
		if add.ID != uid+"."+tag+"."+created.ResourceVersion+".added" || upd.ID != uid+"."+tag+"."+updated.ResourceVersion+".updated" || !strings.HasPrefix(del.ID, uid+"."+tag+".") || !strings.HasSuffix(del.ID, ".deleted") {
			t.Errorf("ids: %s %s %s", add.ID, upd.ID, del.ID)
		}
		if add.Type != "io.kubebridge.configmaps.core.added" || upd.Type != "io.kubebridge.configmaps.core.updated" || del.Type != "io.kubebridge.configmaps.core.deleted" {
			t.Errorf("types: %s %s %s", add.Type, upd.Type, del.Type)
		}
		if add.SpecVersion != "1.0" || add.Source != "kubebridge/e2e" || add.Cluster != "e2e" || add.Replay != "" || add.Time == "" {
			t.Errorf("envelope: %s", add.raw)
		}
		if v, _, _ := unstructured.NestedString(add.Data.Object, "data", "k"); v != "v1" {
			t.Errorf("added data.object.data.k = %q", v)
		}
		if v, _, _ := unstructured.NestedString(upd.Data.OldObject, "data", "k"); v != "v1" {
			t.Errorf("updated oldObject data.k = %q", v)
		}
		if len(upd.Data.Patch) != 2 || !hasOp(upd.Data.Patch, "replace", "/data/k", "v2") {
			t.Errorf("patch = %v, want the data/k replace and the resourceVersion replace", upd.Data.Patch)
		}
		for _, e := range []ce{add, upd, del} {
			if strings.Contains(string(e.raw), "managedFields") {
				t.Errorf("managedFields in %s", e.raw)
			}
		}
	})

	t.Run("deployment lifecycle", func(t *testing.T) {
		deps := cs.AppsV1().Deployments("e2e-a")
		replicas := int32(1)
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx"}}},
				},
			},
		}
		_, err := deps.Create(ctx, d, metav1.CreateOptions{})
		must(t, err)
		_, err = deps.Patch(ctx, "web", types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{})
		must(t, err)
		must(t, deps.Delete(ctx, "web", metav1.DeleteOptions{}))
		evs := waitEvents(t, out, "deployment events", func(evs []ce) bool { return has(evs, "deploys", "e2e-a/web", "added", "updated", "deleted") })
		for _, e := range evs {
			if e.Rule == "deploys" && e.Type != "io.kubebridge.deployments.apps."+e.change() {
				t.Errorf("type %s", e.Type)
			}
			if e.Rule == "deploys" && e.change() == "updated" {
				if r, _, _ := unstructured.NestedFieldNoCopy(e.Data.Object, "spec", "replicas"); r != 3.0 {
					t.Errorf("updated replicas = %v", r)
				}
			}
		}
	})

	t.Run("custom resource lifecycle", func(t *testing.T) {
		ws := dyn.Resource(testenv.WidgetGVR).Namespace("e2e-b")
		w := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "example.kubebridge.io/v1", "kind": "Widget",
			"metadata": map[string]any{"name": "w1"}, "spec": map[string]any{"size": int64(1)},
		}}
		_, err := ws.Create(ctx, w, metav1.CreateOptions{})
		must(t, err)
		_, err = ws.Patch(ctx, "w1", types.MergePatchType, []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{})
		must(t, err)
		must(t, ws.Delete(ctx, "w1", metav1.DeleteOptions{}))
		evs := waitEvents(t, out, "widget events", func(evs []ce) bool { return has(evs, "widgets", "e2e-b/w1", "added", "updated", "deleted") })
		for _, e := range evs {
			if e.Rule == "widgets" && (e.Type != "io.kubebridge.widgets.example.kubebridge.io."+e.change() || e.Data.Object["kind"] != "Widget") {
				t.Errorf("widget event %s", e.raw)
			}
		}
	})

	t.Run("filters include and exclude", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps("e2e-b")
		create := func(name string, labels, data map[string]string) {
			t.Helper()
			_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: data}, metav1.CreateOptions{})
			must(t, err)
		}
		patch := func(name, p string) {
			t.Helper()
			_, err := cms.Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{})
			must(t, err)
		}
		// labelSelector: enters on relabel, leaves on relabel.
		create("l1", map[string]string{"tier": "back"}, nil)
		patch("l1", `{"metadata":{"labels":{"tier":"front"}}}`)
		patch("l1", `{"metadata":{"labels":{"tier":"back"}}}`)
		// fieldSelector.
		create("exact", nil, nil)
		create("inexact", nil, nil)
		// index.
		create("p1", map[string]string{"team": "pay"}, nil)
		create("p2", map[string]string{"team": "search"}, nil)
		// where, and where as a view: leaving it is a deletion.
		create("w1", nil, map[string]string{"size": "big"})
		create("w2", nil, map[string]string{"size": "small"})
		patch("w1", `{"data":{"size":"small"}}`)
		// changed: only data.watch counts.
		create("ch1", nil, map[string]string{"watch": "1", "other": "1"})
		patch("ch1", `{"data":{"other":"2"}}`)
		patch("ch1", `{"data":{"watch":"2"}}`)
		// events: only deletions.
		create("e1", nil, nil)
		patch("e1", `{"data":{"a":"b"}}`)
		must(t, cms.Delete(ctx, "e1", metav1.DeleteOptions{}))
		// Barrier: one informer, one queue, so everything before it is in the file once it is.
		create("zz-barrier", map[string]string{"team": "ops"}, nil)

		evs := waitEvents(t, out, "the barrier", func(evs []ce) bool { return has(evs, "indexed", "e2e-b/zz-barrier", "added") })
		want := map[[2]string]string{
			{"labelled", "e2e-b/l1"}:        "added,deleted:unmatched",
			{"fields", "e2e-b/exact"}:       "added",
			{"fields", "e2e-b/inexact"}:     "",
			{"indexed", "e2e-b/p1"}:         "added",
			{"indexed", "e2e-b/p2"}:         "",
			{"where", "e2e-b/w1"}:           "added,deleted:unmatched",
			{"where", "e2e-b/w2"}:           "",
			{"changed", "e2e-b/ch1"}:        "added,updated",
			{"deletes", "e2e-b/e1"}:         "deleted",
			{"deletes", "e2e-b/l1"}:         "",
			{"nssel", "e2e-b/p1"}:           "",
			{"labelled", "e2e-b/exact"}:     "",
			{"indexed", "e2e-b/ch1"}:        "",
			{"changed", "e2e-b/w1"}:         "added", // its update did not touch data.watch
			{"deletes", "e2e-b/zz-barrier"}: "",
		}
		for k, w := range want {
			if got := strings.Join(of(evs, k[0], k[1]), ","); got != w {
				t.Errorf("rule %s, %s: got %q, want %q", k[0], k[1], got, w)
			}
		}
		for _, e := range evs {
			if e.Rule == "changed" && e.Subject == "e2e-b/ch1" && e.change() == "updated" {
				if v, _, _ := unstructured.NestedString(e.Data.Object, "data", "watch"); v != "2" {
					t.Errorf("changed: the delivered update is not the data.watch change: %s", e.raw)
				}
			}
		}
	})

	t.Run("namespace selector tracked live", func(t *testing.T) {
		_, err := cs.CoreV1().ConfigMaps("e2e-sel").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "s1"}}, metav1.CreateOptions{})
		must(t, err)
		_, err = cs.CoreV1().Namespaces().Patch(ctx, "e2e-sel", types.MergePatchType, []byte(`{"metadata":{"labels":{"kb-e2e":"on"}}}`), metav1.PatchOptions{})
		must(t, err)
		waitEvents(t, out, "s1 to enter with its namespace", func(evs []ce) bool { return has(evs, "nssel", "e2e-sel/s1", "added") })
		_, err = cs.CoreV1().ConfigMaps("e2e-sel").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "s2"}}, metav1.CreateOptions{})
		must(t, err)
		waitEvents(t, out, "s2 in a selected namespace", func(evs []ce) bool { return has(evs, "nssel", "e2e-sel/s2", "added") })
		_, err = cs.CoreV1().Namespaces().Patch(ctx, "e2e-sel", types.MergePatchType, []byte(`{"metadata":{"labels":{"kb-e2e":"off"}}}`), metav1.PatchOptions{})
		must(t, err)
		waitEvents(t, out, "s1 and s2 to leave with their namespace", func(evs []ce) bool {
			return has(evs, "nssel", "e2e-sel/s1", "added", "deleted:unmatched") && has(evs, "nssel", "e2e-sel/s2", "added", "deleted:unmatched")
		})
	})

	t.Run("secret data redacted", func(t *testing.T) {
		secrets := cs.CoreV1().Secrets("e2e-a")
		_, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"password": "hunter2-original"}}, metav1.CreateOptions{})
		must(t, err)
		_, err = secrets.Patch(ctx, "db", types.MergePatchType, []byte(`{"stringData":{"password":"hunter3-rotated"}}`), metav1.PatchOptions{})
		must(t, err)
		evs := waitEvents(t, out, "secret events", func(evs []ce) bool { return has(evs, "secrets", "e2e-a/db", "added", "updated") })
		for _, e := range evs {
			if e.Rule != "secrets" {
				continue
			}
			raw := string(e.raw)
			for _, secret := range []string{"hunter2-original", "hunter3-rotated", "aHVudGVy"} { // plain and base64 prefix
				if strings.Contains(raw, secret) {
					t.Errorf("secret value leaked: %s", raw)
				}
			}
			if v, _, _ := unstructured.NestedString(e.Data.Object, "data", "password"); v != "<redacted>" {
				t.Errorf("data.password = %q, want <redacted>", v)
			}
			if e.change() == "updated" && !hasOp(e.Data.Patch, "replace", "/data/password", "<redacted>") {
				t.Errorf("patch does not show the redacted change: %v", e.Data.Patch)
			}
		}
	})

	t.Run("events are valid CloudEvents 1.0", func(t *testing.T) {
		evs := readEvents(t, out)
		if len(evs) < 20 {
			t.Fatalf("only %d events", len(evs))
		}
		for _, e := range evs {
			var sdk cloudevents.Event
			if err := json.Unmarshal(e.raw, &sdk); err != nil {
				t.Fatalf("sdk-go cannot read %s: %v", e.raw, err)
			}
			if err := sdk.Validate(); err != nil {
				t.Errorf("sdk-go: invalid event %s: %v", e.raw, err)
			}
			if sdk.SpecVersion() != "1.0" || sdk.Extensions()["kbrule"] != e.Rule || sdk.DataContentType() != "application/json" {
				t.Errorf("sdk-go view: %v", sdk)
			}
		}
	})
}

// A deletion made while the bridge's watch is broken still arrives as deleted.
func TestDeleteWhileWatchBroken(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t)
	testenv.EnsureNamespace(t, cp, "gap")
	out := filepath.Join(t.TempDir(), "events.jsonl")
	startBridge(t, cp, fileConfig(out, rule("cms", "v1/configmaps", "gap")))
	cs := cp.Clientset(t)
	ctx := context.Background()
	for _, name := range []string{"doomed", "survivor"} {
		_, err := cs.CoreV1().ConfigMaps("gap").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(t, err)
	}
	waitEvents(t, out, "both added", func(evs []ce) bool {
		return has(evs, "cms", "gap/doomed", "added") && has(evs, "cms", "gap/survivor", "added")
	})

	cp.WhileAPIServerDown(t, func(alt *rest.Config) {
		altCS := kubernetes.NewForConfigOrDie(alt)
		must(t, altCS.CoreV1().ConfigMaps("gap").Delete(ctx, "doomed", metav1.DeleteOptions{}))
	})
	_, err := cs.CoreV1().ConfigMaps("gap").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
	must(t, err)
	evs := waitEvents(t, out, "the deletion made during the gap", func(evs []ce) bool {
		return has(evs, "cms", "gap/doomed", "added", "deleted") && has(evs, "cms", "gap/after", "added")
	})
	if got := of(evs, "cms", "gap/survivor"); len(got) != 1 {
		t.Errorf("survivor: %v, want only its addition", got)
	}
}

// A bad CEL expression or an unknown resource stops the bridge at start,
// with the rule's path and exit status 2, before any sink is opened.
func TestBadConfigFailsAtStart(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	dir := t.TempDir()
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	out := filepath.Join(dir, "events.jsonl")
	for _, tc := range []struct{ rule, want string }{
		{"    resource: v1/configmaps\n    where: \"objekt.data.x == 'y'\"\n", ":11: rules[0].where: undeclared reference to 'objekt' (column 1)"},
		// A built-in group has no CRDs: a resource missing there is a typo.
		// (One of a CRD's group waits instead: TestMissingResourceWaitsAndFollowsTheCRD.)
		{"    resource: v1/configmapz\n", `:10: rules[0].resource: the cluster has no resource "configmapz" in v1`},
		{"    resource: apps/v1/deploymentz\n", `:10: rules[0].resource: the cluster has no resource "deploymentz" in apps/v1`},
	} {
		cfg := filepath.Join(dir, "c.yaml")
		must(t, os.WriteFile(cfg, []byte("apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: e2e\nsinks:\n  - name: out\n    file: {path: "+out+"}\nrules:\n  - name: r\n    sinks: [out]\n"+tc.rule), 0o600))
		output, code := runBridgeCommand(t, "run", "--config", cfg, "--kubeconfig", kc, "--checkpoint-file", filepath.Join(dir, "state.db"), "--admin-addr", "127.0.0.1:0")
		if code != 2 {
			t.Errorf("exit status %d, want 2; output:\n%s", code, output)
		}
		if !strings.Contains(output, cfg+tc.want) {
			t.Errorf("output lacks %q:\n%s", cfg+tc.want, output)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("the file sink was opened (%v): the bridge half-started", err)
		}
	}
}

func hasOp(patch []map[string]any, op, path string, value any) bool {
	for _, p := range patch {
		if p["op"] == op && p["path"] == path && p["value"] == value {
			return true
		}
	}
	return false
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

var (
	gadgetGVR = schema.GroupVersionResource{Group: "missing.kubebridge.io", Version: "v1", Resource: "gadgets"}
	crdGVR    = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

const gadgetCRD = "gadgets.missing.kubebridge.io"

// installGadgets installs the gadgets CRD and waits until it is served.
func installGadgets(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	ctx := context.Background()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": gadgetCRD},
		"spec": map[string]any{
			"group": gadgetGVR.Group, "scope": "Namespaced",
			"names": map[string]any{"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	deadline := time.Now().Add(60 * time.Second) // for both waits
	testenv.Await(t, time.Until(deadline), 200*time.Millisecond, func() error {
		_, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("creating the CRD: %w", err) // a deleted CRD lingers until its objects are gone
	})
	testenv.Await(t, time.Until(deadline), 100*time.Millisecond, func() error {
		if _, err := dyn.Resource(gadgetGVR).Namespace("missing").List(ctx, metav1.ListOptions{}); err != nil {
			return fmt.Errorf("gadgets not served: %w", err)
		}
		return nil
	})
}

// deleteGadgets deletes the CRD and waits until it is gone.
func deleteGadgets(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	ctx := context.Background()
	if err := dyn.Resource(crdGVR).Delete(ctx, gadgetCRD, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	testenv.Await(t, 60*time.Second, 100*time.Millisecond, func() error {
		if _, err := dyn.Resource(crdGVR).Get(ctx, gadgetCRD, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the CRD was not deleted (get: %v)", err)
		}
		return nil
	})
}

func createGadget(t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	g := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "missing.kubebridge.io/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": name, "namespace": "missing"}, "spec": map[string]any{"n": 1}}}
	_, err := dyn.Resource(gadgetGVR).Namespace("missing").Create(context.Background(), g, metav1.CreateOptions{})
	must(t, err)
}

// heldBy applies the events of rule by subject, as a consumer does, and
// returns the subjects it holds.
func heldBy(evs []ce, rule string) []string {
	held := map[string]bool{}
	for _, e := range evs {
		if e.Rule == rule {
			held[e.Subject] = e.change() != "deleted"
		}
	}
	var out []string
	for s, ok := range held {
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// A rule whose resource the cluster does not serve waits; every other
// rule runs. When the CRD is installed the rule delivers its view; when it
// is deleted, its objects' deletions; when it comes back, the new objects;
// and a start while it is absent delivers the deletions of what the
// checkpoint held. The bridge never stops, /readyz stays ready and names
// the waiting rule, and kubebridge_rule_waiting follows it.
func TestMissingResourceWaitsAndFollowsTheCRD(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	ctx := context.Background()
	testenv.EnsureNamespace(t, cp, "missing")
	deleteGadgets(t, dyn) // absent at the start, whatever ran before
	out := filepath.Join(t.TempDir(), "events.jsonl")
	cfg := fileConfig(out, rule("cms", "v1/configmaps", "missing"), rule("gadgets", "missing.kubebridge.io/v1/gadgets", "missing"))
	b := startBridge(t, cp, cfg, withFlags("--resource-poll", "200ms"))
	if !strings.Contains(b.log(), "the cluster does not serve") {
		t.Errorf("no warning about the absent resource:\n%s", b.log())
	}
	admin := b.adminURL()
	code, body := get(t, admin+"/readyz?verbose")
	if code != 200 || !strings.Contains(body, "[!]rule gadgets degraded") || strings.Contains(body, "rule cms") || !strings.Contains(body, "[+]sink out ok") {
		t.Errorf("/readyz = %d:\n%s", code, body)
	}
	_, text := get(t, admin+"/metrics")
	if metric(t, text, `kubebridge_rule_waiting{rule="gadgets"}`) != 1 || metric(t, text, `kubebridge_rule_waiting{rule="cms"}`) != 0 {
		t.Errorf("kubebridge_rule_waiting: gadgets %v, cms %v; want 1, 0", metric(t, text, `kubebridge_rule_waiting{rule="gadgets"}`), metric(t, text, `kubebridge_rule_waiting{rule="cms"}`))
	}
	// The other rule runs meanwhile.
	_, err := cs.CoreV1().ConfigMaps("missing").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{})
	must(t, err)
	waitEvents(t, out, "the configmap", func(evs []ce) bool { return has(evs, "cms", "missing/one", "added") })

	// The CRD appears, with objects made right away: the rule starts and
	// delivers them.
	installGadgets(t, dyn)
	for i := range 3 {
		createGadget(t, dyn, fmt.Sprintf("g%d", i))
	}
	waitEvents(t, out, "the gadgets", func(evs []ce) bool { return len(heldBy(evs, "gadgets")) == 3 })
	testenv.Await(t, 10*time.Second, 100*time.Millisecond, func() error {
		if _, text = get(t, admin+"/metrics"); metric(t, text, `kubebridge_rule_waiting{rule="gadgets"}`) != 0 {
			return errors.New("kubebridge_rule_waiting{rule=gadgets} still 1 after its view was delivered")
		}
		return nil
	})

	// Deleted at runtime: its objects are gone, so are they from the view.
	deleteGadgets(t, dyn)
	waitEvents(t, out, "the gadgets' deletions", func(evs []ce) bool { return len(heldBy(evs, "gadgets")) == 0 })
	_, err = cs.CoreV1().ConfigMaps("missing").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "two"}}, metav1.CreateOptions{})
	must(t, err)
	waitEvents(t, out, "a configmap after the CRD went", func(evs []ce) bool { return has(evs, "cms", "missing/two", "added") })

	// Back again: the new object is delivered.
	installGadgets(t, dyn)
	createGadget(t, dyn, "back")
	waitEvents(t, out, "the re-created gadget", func(evs []ce) bool {
		h := heldBy(evs, "gadgets")
		return len(h) == 1 && h[0] == "missing/back"
	})
	for _, s := range []string{"missing/g0", "missing/g1", "missing/g2"} {
		if got := of(readEvents(t, out), "gadgets", s); strings.Join(got, " ") != "added deleted" {
			t.Errorf("%s: %v, want added deleted (once each)", s, got)
		}
	}

	// Stopped with the gadget in its checkpoint; the CRD goes while it is
	// away: the next start delivers the deletion and runs.
	b.stop()
	deleteGadgets(t, dyn)
	b.start() // on the same checkpoint
	evs := waitEvents(t, out, "the deletion found at the start", func(evs []ce) bool { return len(heldBy(evs, "gadgets")) == 0 })
	if got := of(evs, "gadgets", "missing/back"); strings.Join(got, " ") != "added deleted" {
		t.Errorf("missing/back: %v, want added deleted", got)
	}
	if h := heldBy(evs, "cms"); len(h) != 2 {
		t.Errorf("configmaps held: %v, want missing/one and missing/two", h)
	}
	b.stop()
}

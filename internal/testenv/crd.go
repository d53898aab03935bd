package testenv

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// WidgetGVR is the resource of the test CRD widgets.example.kubebridge.io.
var WidgetGVR = schema.GroupVersionResource{Group: "example.kubebridge.io", Version: "v1", Resource: "widgets"}

// InstallWidgetCRD installs a namespaced CRD (kind Widget, free-form spec)
// unless it is there, and waits until the apiserver serves it.
func InstallWidgetCRD(t testing.TB, cp *ControlPlane) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	ctx := context.Background()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "widgets.example.kubebridge.io"},
		"spec": map[string]any{
			"group": "example.kubebridge.io",
			"scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{"spec": map[string]any{
						"type": "object", "x-kubernetes-preserve-unknown-fields": true,
					}},
				}},
			}},
		},
	}}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating CRD: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := dyn.Resource(WidgetGVR).Namespace("default").List(ctx, metav1.ListOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD widgets not served after 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

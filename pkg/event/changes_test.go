package event

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/fieldpath"
)

func u(obj map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: obj} }

func deploy(image, env, rv string) *unstructured.Unstructured {
	return u(map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "web", "namespace": "a", "uid": "u1", "resourceVersion": rv, "generation": int64(2)},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"name": "app", "image": image, "env": []any{map[string]any{"name": "A", "value": env}}},
			map[string]any{"name": "proxy", "image": "envoy:1"},
		}}}}})
}

func TestChangesFollowTheRulesPaths(t *testing.T) {
	p, err := fieldpath.Parse("spec.template.spec.containers[*].image")
	if err != nil {
		t.Fatal(err)
	}
	images := &Rule{Name: "r", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, IncludeObject: true, Changed: []fieldpath.Path{p}}
	whole := &Rule{Name: "r", GVR: images.GVR, IncludeObject: true}
	now := time.Now()
	old, obj := deploy("web:1", "x", "1"), deploy("web:2", "y", "2")

	cs, more, known := Build(images, Transition{Change: Updated, Object: obj, Old: old, Time: now}).Changes()
	if !known || more != 0 || len(cs) != 1 || cs[0].Path != "spec.template.spec.containers[name=app].image" || cs[0].Old != "web:1" || cs[0].New != "web:2" {
		t.Fatalf("the rule's paths: %+v +%d known=%v", cs, more, known)
	}
	// Without changed paths: the whole object, its bookkeeping left out
	// (resourceVersion moved, generation did not matter).
	cs, _, _ = Build(whole, Transition{Change: Updated, Object: obj, Old: old, Time: now}).Changes()
	var paths []string
	for _, c := range cs {
		paths = append(paths, c.Path)
	}
	if len(paths) != 2 || paths[0] != "spec.template.spec.containers[name=app].env[name=A].value" || paths[1] != "spec.template.spec.containers[name=app].image" {
		t.Fatalf("whole object: %v", paths)
	}
	// An update found at a start has no previous state: not known, never guessed.
	if _, _, known := Build(images, Transition{Change: Updated, Object: obj, Time: now}).Changes(); known {
		t.Error("an update without its previous state reported changes")
	}
	if _, _, known := Build(images, Transition{Change: Added, Object: obj, Time: now}).Changes(); known {
		t.Error("an added reported changes")
	}
}

// A Secret's change names the key and shows no value, unless the rule
// and the operator allow its data.
func TestChangesOfASecretAreRedacted(t *testing.T) {
	secret := func(v string) *unstructured.Unstructured {
		return u(map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s", "namespace": "a"},
			"data": map[string]any{"password": v, "user": "YWRtaW4="}})
	}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	now := time.Now()
	cs, _, _ := Build(&Rule{Name: "r", GVR: gvr, IncludeObject: true}, Transition{Change: Updated, Object: secret("bmV3"), Old: secret("b2xk"), Time: now}).Changes()
	if len(cs) != 1 || cs[0].Path != "data.password" || cs[0].Old != Redacted || cs[0].New != Redacted {
		t.Fatalf("redacted: %+v", cs)
	}
	cs, _, _ = Build(&Rule{Name: "r", GVR: gvr, IncludeObject: true, AllowSecretData: true}, Transition{Change: Updated, Object: secret("bmV3"), Old: secret("b2xk"), Time: now}).Changes()
	if len(cs) != 1 || cs[0].Old != "b2xk" || cs[0].New != "bmV3" {
		t.Fatalf("allowed: %+v", cs)
	}
}

// Several changed paths: what each selects that changed, together; a rule
// whose events carry metadata only tells changes of its metadata only.
func TestChangesOfSeveralPathsAndOfMetadataOnly(t *testing.T) {
	images, _ := fieldpath.Parse("spec.template.spec.containers[*].image")
	labels, _ := fieldpath.Parse("metadata.labels")
	gvr := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	old, obj := deploy("web:1", "x", "1"), deploy("web:2", "y", "2")
	obj.SetLabels(map[string]string{"team": "a"})
	now := time.Now()
	cs, _, _ := Build(&Rule{Name: "r", GVR: gvr, IncludeObject: true, Changed: []fieldpath.Path{images, labels}},
		Transition{Change: Updated, Object: obj, Old: old, Time: now}).Changes()
	if len(cs) != 2 || cs[0].Path != "spec.template.spec.containers[name=app].image" || cs[1].Path != "metadata.labels.team" {
		t.Fatalf("two paths: %+v", cs)
	}
	cs, _, known := Build(&Rule{Name: "r", GVR: gvr, IncludeMeta: true},
		Transition{Change: Updated, Object: obj, Old: old, Time: now}).Changes()
	if !known || len(cs) != 1 || cs[0].Path != "metadata.labels.team" {
		t.Fatalf("metadata only: %+v", cs)
	}
	if _, _, known := Build(&Rule{Name: "r", GVR: gvr}, Transition{Change: Updated, Object: obj, Old: old, Time: now}).Changes(); known {
		t.Error("a rule whose events carry no object told changes")
	}
}

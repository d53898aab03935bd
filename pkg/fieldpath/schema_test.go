package fieldpath

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/spec3"
)

// doc is shaped as the apiserver serves /openapi/v3/apis/apps/v1: fields
// with a default or description wrap their $ref in an allOf of one.
const doc = `{"openapi":"3.0.0","info":{"title":"t","version":"v"},"paths":{},"components":{"schemas":{
"io.k8s.api.apps.v1.Deployment":{"type":"object","x-kubernetes-group-version-kind":[{"group":"apps","version":"v1","kind":"Deployment"}],
  "properties":{"metadata":{"allOf":[{"$ref":"#/components/schemas/meta"}]},"spec":{"allOf":[{"$ref":"#/components/schemas/spec"}],"default":{}}}},
"meta":{"type":"object","properties":{"name":{"type":"string"},"labels":{"type":"object","additionalProperties":{"type":"string","default":""}}}},
"spec":{"type":"object","properties":{"replicas":{"type":"integer"},"template":{"allOf":[{"$ref":"#/components/schemas/template"}]},"strategy":{"x-kubernetes-preserve-unknown-fields":true}}},
"template":{"type":"object","properties":{"spec":{"$ref":"#/components/schemas/podspec"}}},
"podspec":{"type":"object","properties":{"containers":{"type":"array","items":{"allOf":[{"$ref":"#/components/schemas/container"}]}}}},
"container":{"type":"object","properties":{"name":{"type":"string"},"image":{"type":"string"},"ports":{"type":"array","items":{"$ref":"#/components/schemas/port"}}}},
"port":{"type":"object","properties":{"containerPort":{"type":"integer"},"port":{"x-kubernetes-int-or-string":true}}},
"loop":{"$ref":"#/components/schemas/loop"}
}}}`

func deployment(t *testing.T) Schema {
	t.Helper()
	var d spec3.OpenAPI
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatal(err)
	}
	s, ok := SchemaFor(&d, schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"})
	if !ok {
		t.Fatal("Deployment not found")
	}
	if _, ok := SchemaFor(&d, schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}); ok {
		t.Fatal("StatefulSet found in a document without it")
	}
	return s
}

func TestCheck(t *testing.T) {
	s := deployment(t)
	for _, p := range []string{
		"spec.replicas",
		"spec.template",
		"spec.template.spec.containers[*].image",
		"spec.template.spec.containers[name=web].image",
		"spec.template.spec.containers[0].ports[*].containerPort",
		`metadata.labels["app.kubernetes.io/name"]`,
		"metadata.labels[*]",
		"spec.strategy.anything.at.all",
		"spec.template.spec.containers[*].ports[*].port",
	} {
		if err := s.Check(must(t, p)); err != nil {
			t.Errorf("Check(%s): %v", p, err)
		}
	}
	bad := map[string]string{
		"spec.template.spec.containers.image":   "spec.template.spec.containers is a list; write spec.template.spec.containers[*].image (every element) or spec.template.spec.containers[name=<name>].image",
		"spec.template.spec.containers[*].imag": `spec.template.spec.containers[*] has no field "imag"`,
		"spec.replicas[*]":                      "spec.replicas is an integer, not a list or a map",
		"spec.replicas.x":                       `spec.replicas is an integer, it has no field "x"`,
		"metadata.name[name=x]":                 "metadata.name is a string, not a list: [name=x] selects nothing",
		"status.replicas":                       `the object has no field "status"`,
	}
	for p, want := range bad {
		err := s.Check(must(t, p))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%s) = %v, want %q", p, err, want)
		}
	}
}

// A schema that refers to itself ends the check (it passes), never loops.
func TestCheckRecursiveSchemaEnds(t *testing.T) {
	var d spec3.OpenAPI
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatal(err)
	}
	s := Schema{root: d.Components.Schemas["loop"], doc: &d}
	if err := s.Check(must(t, "a.b")); err != nil {
		t.Fatal(err)
	}
}

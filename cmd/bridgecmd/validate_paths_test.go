package bridgecmd

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/discovery"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A changed path that can never select anything lets no update through,
// silently: validate checks each against the kind's schema as the cluster
// serves it, and names the key and what to write instead.
func TestValidateRefusesChangedPathsThatNeverMatch(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	testenv.InstallWidgetCRD(t, cp)
	// The apiserver publishes a new CRD's schema a moment after the CRD
	// is established; until then validate can only warn.
	dc := discovery.NewDiscoveryClientForConfigOrDie(cp.RESTConfig())
	deadline := time.Now().Add(30 * time.Second)
	for {
		paths, err := dc.OpenAPIV3().Paths()
		if _, ok := paths["apis/example.kubebridge.io/v1"]; ok && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Widget CRD's OpenAPI was not published: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	admin, err := cp.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "paths.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: test
sinks:
  - name: archive
    file: {path: "-"}
rules:
  - name: images
    resource: apps/v1/deployments
    events: [updated]
    changed:
      - spec.template.spec.containers[*].image
      - spec.template.spec.containers[name=web].image
      - spec.template.spec.containers.image
      - spec.replicaz
      - metadata.labels["team"]
    sinks: [archive]
  - name: widgets
    resource: example.kubebridge.io/v1/widgets
    events: [updated]
    changed: [spec.anything.goes, status.size]
    sinks: [archive]
`)
	r := runBridge(t, "validate", "--config", cfg, "--kubeconfig", admin)
	if r.code == 0 {
		t.Fatalf("validate passed paths that never match: %+v", r)
	}
	for _, want := range []string{
		cfg + `:14: rules[0].changed[2]: "spec.template.spec.containers.image" selects nothing: spec.template.spec.containers is a list; write spec.template.spec.containers[*].image (every element) or spec.template.spec.containers[name=<name>].image (one, by its merge key)`,
		cfg + `:15: rules[0].changed[3]: "spec.replicaz": spec has no field "replicaz"`,
		// The CRD's spec keeps unknown fields: anything under it may be
		// set; status is not in its schema.
		cfg + `:21: rules[1].changed[1]: "status.size": the object has no field "status"`,
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks\n%s\ngot:\n%s", want, r.stderr)
		}
	}
	if n := strings.Count(r.stderr, ": rules["); n != 3 || !strings.Contains(r.stderr, "(3 errors)") {
		t.Errorf("%d errors, want 3 (the other paths can match):\n%s", n, r.stderr)
	}
}

package testenv

import (
	"slices"
	"strings"
	"testing"
)

// Feature gates reach the apiserver's command line as one comma-joined flag,
// and the plain control plane passes none (the apiserver's defaults).
func TestAPIServerArgsFeatureGates(t *testing.T) {
	gates := []string{"CBORServingAndStorage=true", "Other=false"}
	cp := &ControlPlane{Dir: t.TempDir(), opts: ControlPlaneOptions{FeatureGates: gates}}
	args := cp.apiServerArgs(6443)
	if !slices.Contains(args, "--feature-gates=CBORServingAndStorage=true,Other=false") {
		t.Errorf("args lack the joined feature gates: %v", args)
	}
	plain := (&ControlPlane{Dir: t.TempDir()}).apiServerArgs(6443)
	for _, a := range plain {
		if strings.HasPrefix(a, "--feature-gates") {
			t.Errorf("zero options pass %q", a)
		}
	}
}

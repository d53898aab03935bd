package docscheck

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kubebridge/kubebridge"

// pkg/ is what outsiders import (README.md's layout): a package there
// builds on nothing in internal/, whose types it could not show them and
// whose changes would break them unannounced. What pkg/ needs privately
// lives in pkg/internal/; the runtime is reached through cmd/bridgecmd.
func TestPkgImportsNothingInternal(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"/pkg/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list found %d packages under pkg/; want the whole tree", len(lines))
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/internal/") {
				t.Errorf("%s imports %s: pkg/ builds on nothing in internal/ (move what it needs under pkg/internal/)", fields[0], imp)
			}
		}
	}
}

// A Go exec plugin is built on pkg/plugin alone: its dependencies stay the
// standard library's (and pkg/sinks/outcome's), so a plugin binary stays a
// few MB rather than carrying client-go.
func TestPluginPackageNeedsOnlyTheStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+"/pkg/plugin").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep != module+"/pkg/plugin" && dep != module+"/pkg/sinks/outcome" {
			t.Errorf("pkg/plugin depends on %s", dep)
		}
	}
}

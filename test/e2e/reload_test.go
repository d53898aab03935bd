package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The config file changes under load: the unchanged sink loses nothing,
// the new rule and sink deliver, the removed ones stop; a broken config is
// refused and the running one stays.
func TestHotReloadUnderLoad(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"reload"}
	testenv.EnsureNamespace(t, cp, "reload")
	dir := t.TempDir()
	keep, gone, fresh := filepath.Join(dir, "keep.jsonl"), filepath.Join(dir, "gone.jsonl"), filepath.Join(dir, "new.jsonl")
	v1 := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: keep
    file: {path: ` + keep + `}
  - name: gone
    file: {path: ` + gone + `}
rules:
  - name: r-keep
    resource: v1/configmaps
    namespaces: [reload]
    sinks: [keep]
  - name: r-gone
    resource: v1/configmaps
    namespaces: [reload]
    sinks: [gone]
`
	v2 := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: keep
    file: {path: ` + keep + `}
  - name: new
    file: {path: ` + fresh + `}
rules:
  - name: r-keep
    resource: v1/configmaps
    namespaces: [reload]
    sinks: [keep]
  - name: r-new
    resource: v1/configmaps
    namespaces: [reload]
    labelSelector: "!never"
    sinks: [new]
`
	b := startBridge(t, cp, v1)
	cfgPath := b.configPath
	l := startLoad(t, cp, namespaces, false)

	time.Sleep(time.Second)
	must(t, os.WriteFile(cfgPath, []byte(v2), 0o600))
	testenv.Eventually(t, 30*time.Second, "the reload", func() bool { return strings.Contains(b.log(), "config reloaded") })
	time.Sleep(2 * time.Second) // the removed sink has drained
	goneCount := len(readEvents(t, gone))

	time.Sleep(500 * time.Millisecond)
	must(t, os.WriteFile(cfgPath, []byte(strings.Replace(v2, `labelSelector: "!never"`, `where: "objekt.x == 1"`, 1)), 0o600))
	testenv.Eventually(t, 30*time.Second, "the broken config to be refused", func() bool { return strings.Contains(b.log(), "config change refused") })
	time.Sleep(time.Second) // the running config keeps delivering
	l.stop()

	if !strings.Contains(b.log(), "undeclared reference to 'objekt'") {
		t.Errorf("the refusal does not say why:\n%s", b.log())
	}
	only := func(path, rule string) func() []ce {
		return func() []ce {
			var out []ce
			for _, e := range readEvents(t, path) {
				if e.Rule == rule {
					out = append(out, e)
				}
			}
			return out
		}
	}
	verifyAgainstTruth(t, cp, namespaces, l, "reload (unchanged sink)", only(keep, "r-keep"))
	verifyAgainstTruth(t, cp, namespaces, l, "reload (new sink and rule)", only(fresh, "r-new"))
	if n := len(readEvents(t, gone)); n != goneCount || goneCount == 0 {
		t.Errorf("the removed sink got %d events before the reload and %d after", goneCount, n)
	}
}

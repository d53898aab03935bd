package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A dead-letter file pointed at the checkpoint used to replace it. Now
// `bridge validate` and `bridge run` refuse it (exit 2, the key named),
// and so does run when the path checked offline became a link to the
// checkpoint afterwards; the checkpoint file is never touched.
func TestOutputFilesNeverReplaceTheCheckpoint(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	dir := t.TempDir()
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	state := filepath.Join(dir, "state.db")
	must(t, os.WriteFile(state, []byte("precious"), 0o600))
	config := func(deadLetter string) string {
		path := filepath.Join(dir, "c.yaml")
		must(t, os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {file: %s}
sinks:
  - name: hook
    webhook: {url: "http://127.0.0.1:9/"}
    deadLetter: {file: %s, maxBackups: 1}
rules:
  - {name: cms, resource: v1/configmaps, namespaces: [default], sinks: [hook]}
`, state, deadLetter)), 0o600))
		return path
	}
	run := func(cfg string) (string, int) {
		return runBridgeCommand(t, "run", "--config", cfg, "--kubeconfig", kc, "--admin-addr", "", "--credential-dirs", dir+"/secrets")
	}

	cfg := config(state)
	want := "c.yaml:8: sinks[0].deadLetter.file: " + state + " is the checkpoint file"
	if out, code := runBridgeCommand(t, "validate", "--config", cfg, "--credential-dirs", dir+"/secrets"); code != 2 || !strings.Contains(out, want) {
		t.Errorf("validate: exit %d\n%s\nwant exit 2 and %q", code, out, want)
	}
	if out, code := run(cfg); code != 2 || !strings.Contains(out, want) {
		t.Errorf("run: exit %d\n%s\nwant exit 2 and %q", code, out, want)
	}

	// Valid offline; a link to the checkpoint appears before run.
	dead := filepath.Join(dir, "dead.jsonl")
	cfg = config(dead)
	if out, code := runBridgeCommand(t, "validate", "--config", cfg, "--credential-dirs", dir+"/secrets"); code != 0 {
		t.Fatalf("validate: exit %d\n%s", code, out)
	}
	must(t, os.Symlink(state, dead))
	want = "c.yaml:8: sinks[0].deadLetter.file: " + dead + " is a symbolic link"
	if out, code := run(cfg); code != 2 || !strings.Contains(out, want) {
		t.Errorf("run with a link planted after validate: exit %d\n%s\nwant exit 2 and %q", code, out, want)
	}
	if b, _ := os.ReadFile(state); string(b) != "precious" {
		t.Errorf("the checkpoint file now holds %q", b)
	}
}

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// TestCustomBridge builds examples/custom-bridge, a bridge binary of its
// own module with a sink type written there (tsv), and runs it against the
// apiserver: the ConfigMaps of a namespace reach the tsv file as added,
// updated and deleted lines, in order per object. kubebridge's own binary
// does not know the type.
func TestCustomBridge(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	root, err := testenv.RepoRoot()
	must(t, err)
	bin := filepath.Join(t.TempDir(), "custom-bridge")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(root, "examples/custom-bridge")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building examples/custom-bridge: %v\n%s", err, out)
	}

	const ns = "custom-bridge"
	testenv.EnsureNamespace(t, cp, ns)
	dir := t.TempDir()
	ledger := filepath.Join(dir, "events.tsv")
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: ledger
    tsv: {path: ` + ledger + `}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + ns + `]
    sinks: [ledger]
`
	cfgFile := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(cfgFile, []byte(cfg), 0o600))
	if out, code := runBridgeCommand(t, "validate", "--config", cfgFile); code != 2 || !strings.Contains(out, "sinks[0].tsv: unknown field or sink type") {
		t.Errorf("kubebridge's own bridge on a tsv sink: exit %d\n%s", code, out)
	}

	startBridge(t, cp, "", withBinary(bin), withConfigFile(cfgFile))
	cs := cp.Clientset(t).CoreV1().ConfigMaps(ns)
	ctx := context.Background()
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36) // the shared control plane may hold an earlier run's
	kept, gone := "kept-"+suffix, "gone-"+suffix
	for _, name := range []string{kept, gone} {
		_, err := cs.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
		must(t, err)
	}
	_, err = cs.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kept}, Data: map[string]string{"v": "2"}}, metav1.UpdateOptions{})
	must(t, err)
	must(t, cs.Delete(ctx, gone, metav1.DeleteOptions{}))

	want := map[string][]string{ns + "/" + kept: {"added", "updated"}, ns + "/" + gone: {"added", "deleted"}}
	var got map[string][]string
	if !testenv.Poll(30*time.Second, 50*time.Millisecond, func() bool {
		got = changes(t, ledger)
		for subject, w := range want {
			if strings.Join(got[subject], " ") != strings.Join(w, " ") {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the tsv file holds %v, want %v:\n%s", got, want, mustRead(t, ledger))
	}
}

// changes reads a tsv sink's file: each object's changes, in order.
func changes(t *testing.T, path string) map[string][]string {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for line := range strings.Lines(string(data)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) != 5 || f[2] != "cms" {
			t.Fatalf("line %q: want time, change, rule cms, subject, id", line)
		}
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out[f[3]] = append(out[f[3]], f[1])
	}
	return out
}

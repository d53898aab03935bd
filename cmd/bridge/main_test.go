package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// bridgeBin is the bridge binary built once for this package's tests, which
// run it as a user would: a subprocess with flags, output and exit status.
var bridgeBin string

func TestMain(m *testing.M) { testenv.MainWithBridge(m, false, &bridgeBin) }

type result struct {
	code           int
	stdout, stderr string
}

func runBridge(t *testing.T, args ...string) result {
	t.Helper()
	return runBridgeEnv(t, nil, args...)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVersion(t *testing.T) {
	r := runBridge(t, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "bridge dev (commit ") {
		t.Errorf("version: %+v", r)
	}
}

func TestValidateOffline(t *testing.T) {
	examples, _ := filepath.Glob("../../config/*.yaml")
	for _, f := range examples {
		r := runBridge(t, "validate", "--config", f)
		if r.code != 0 || !strings.HasPrefix(r.stdout, f+" is valid offline: cluster ") || r.stderr != "" {
			t.Errorf("validate %s: %+v", f, r)
		}
	}

	bad := writeFile(t, "bad.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: bus
    nats: {url: "nats://127.0.0.1:4222"}
  - name: archive
    file: {path: "-"}
rules:
  - name: a
    resource: v1/configmaps
    where: "objekt.metadata.name == 'x'"
    sinks: [bus]
  - name: b
    resource: v1/configmaps
    sinks: [bsu]
`)
	r := runBridge(t, "validate", "--config", bad)
	want := bad + ":7: warning: sinks[1]: sink \"archive\" is not used by any rule\n" +
		bad + ":12: rules[0].where: undeclared reference to 'objekt' (column 1)\n" +
		bad + ":16: rules[1].sinks[0]: unknown sink \"bsu\" (have: bus, archive)\n" +
		"bridge: " + bad + " is invalid (2 errors)\n"
	if r.code != 2 || r.stdout != "" || r.stderr != want {
		t.Errorf("got exit %d\nstdout %q\nstderr:\n%s\nwant stderr:\n%s", r.code, r.stdout, r.stderr, want)
	}

	if r := runBridge(t, "validate"); r.code != 2 || !strings.Contains(r.stderr, "--config is required") {
		t.Errorf("no --config: %+v", r)
	}
	if r := runBridge(t, "validate", "--config", "/nonexistent.yaml"); r.code != 2 || !strings.Contains(r.stderr, "/nonexistent.yaml: cannot read config: no such file or directory") {
		t.Errorf("missing file: %+v", r)
	}
	if r := runBridge(t, "validate", "--bogus"); r.code != 2 || !strings.Contains(r.stderr, "unknown flag: --bogus") {
		t.Errorf("unknown flag: %+v", r)
	}
}

func TestValidateClusterUnreachable(t *testing.T) {
	kc := writeFile(t, "kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
	r := runBridge(t, "validate", "--config", "../../config/namespace-to-file.yaml", "--kubeconfig", kc, "--timeout", "5s")
	if r.code != 1 || !strings.Contains(r.stderr, "cannot check against the cluster") {
		t.Errorf("unreachable cluster: %+v", r)
	}
}

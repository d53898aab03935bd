package bridgecmd

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

// A config may not name the pod's service-account token (or any file
// outside --credential-dirs) as a credential: validate and run refuse it
// with the path, exit 2, before anything starts.
func TestCredentialFilesOutsideAllowedDirsAreRefused(t *testing.T) {
	cfg := func(token string) string {
		return writeFile(t, "c.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: hook
    webhook:
      url: https://collector.example.com/
      bearerTokenFile: `+token+`
rules:
  - {name: r, resource: v1/configmaps, sinks: [hook]}
`)
	}
	sa := cfg("/var/run/secrets/kubernetes.io/serviceaccount/token")
	r := runBridge(t, "validate", "--config", sa, "--credential-dirs", "/")
	if r.code != 2 || !strings.Contains(r.stderr, sa+":8: sinks[0].webhook.bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token is in the pod's service-account directory") {
		t.Errorf("validate: %+v", r)
	}
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("t0ken"), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := cfg(token)
	r = runBridge(t, "validate", "--config", outside)
	if r.code != 2 || !strings.Contains(r.stderr, "bearerTokenFile: "+token+" is not inside an allowed credential directory (--credential-dirs: /etc/kubebridge)") {
		t.Errorf("validate, default dirs: %+v", r)
	}
	if r := runBridge(t, "validate", "--config", outside, "--credential-dirs", dir); r.code != 0 {
		t.Errorf("validate, allowed: %+v", r)
	}
	if r := runBridge(t, "validate", "--config", outside, "--credential-dirs", "relative"); r.code != 2 || !strings.Contains(r.stderr, `--credential-dirs: "relative" is not an absolute directory`) {
		t.Errorf("validate, bad flag: %+v", r)
	}
	// run: a link in the allowed directory to a file elsewhere is refused
	// before the cluster is asked anything.
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/etc/hostname", link); err != nil {
		t.Fatal(err)
	}
	kc := writeFile(t, "kubeconfig", "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: x}}]\n")
	r = runBridge(t, "run", "--config", cfg(link), "--kubeconfig", kc, "--credential-dirs", dir, "--admin-addr", "127.0.0.1:0")
	if r.code != 2 || !strings.Contains(r.stderr+r.stdout, link+" (a link to /etc/hostname) is not inside an allowed credential directory") {
		t.Errorf("run: %+v", r)
	}
}

// Package testenv starts the real components kubebridge is tested against,
// on loopback only: etcd and kube-apiserver (built from Go modules by
// hack/tools/build.sh) and an embedded nats-server with JetStream.
//
// When the tools are missing, tests skip with a message saying how to build
// them, except under CI=true, where a missing tool fails the test: CI must
// never pass by skipping the integration tests.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// Binaries the control plane needs, looked up in ToolsDir.
var toolNames = []string{"etcd", "kube-apiserver", "kubectl", "helm"}

// ToolsDir finds the folder holding the built tools: $KUBEBRIDGE_TOOLS_DIR,
// else $KUBEBUILDER_ASSETS (the envtest convention), else <repo>/.tools.
func ToolsDir() (string, error) {
	for _, env := range []string{"KUBEBRIDGE_TOOLS_DIR", "KUBEBUILDER_ASSETS"} {
		if d := os.Getenv(env); d != "" {
			return d, checkTools(d)
		}
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	d := filepath.Join(root, ".tools")
	return d, checkTools(d)
}

func checkTools(dir string) error {
	for _, name := range toolNames {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("test tool %s not found in %s: run `make tools` (builds etcd, kube-apiserver, kubectl and helm from Go modules)", name, dir)
		}
	}
	return nil
}

// Tool returns the path of a built tool, or ends the test: skipped when the
// tools are not built, failed when they are missing under CI=true.
func Tool(t testing.TB, name string) string {
	t.Helper()
	dir, err := ToolsDir()
	if err != nil {
		SkipOrFail(t, err)
	}
	return filepath.Join(dir, name)
}

// SkipOrFail skips t because of err, unless CI=true, where it fails.
func SkipOrFail(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("integration test cannot run under CI=true: %v", err)
	}
	t.Skipf("skipping integration test: %v", err)
}

// RepoRoot finds the kubebridge module root by walking up from the working
// directory (go test runs in the package folder).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && isProductModule(data) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kubebridge repository root not found above the working directory")
		}
		dir = parent
	}
}

func isProductModule(gomod []byte) bool {
	const want = "module github.com/kubebridge/kubebridge\n"
	return len(gomod) >= len(want) && string(gomod[:len(want)]) == want
}

// BuildBridge builds the bridge binary into dir, with the race detector when
// race is set, so that tests run it as a user would: a subprocess.
func BuildBridge(dir string, race bool) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "bridge")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/bridge")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building bridge: %v\n%s", err, out)
	}
	return bin, nil
}

// MainWithProgram builds the Go program pkg (as go build names it, from
// the test's package directory) once, sets *bin to it, and runs the tests
// with goleak's check; the binary is removed at the end. For tests that run
// a plugin or another helper as a real process.
func MainWithProgram(m *testing.M, pkg string, bin *string) {
	dir, err := os.MkdirTemp("", "kubebridge-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = filepath.Join(dir, filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", *bin, pkg)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building %s: %v\n", pkg, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

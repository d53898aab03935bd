package testenv

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// One control plane per test binary, started by the first test that asks and
// stopped by Main: starting one takes seconds, so a package's tests share it
// and keep out of each other's way with their own namespaces and names.
var shared struct {
	once sync.Once
	cp   *ControlPlane
	dir  string
	err  error
}

// SharedControlPlane returns the package's control plane, starting it on
// first use. Tests that restart or stop the apiserver use StartControlPlane.
// The package's TestMain must call Main so that it is stopped.
func SharedControlPlane(t testing.TB) *ControlPlane {
	t.Helper()
	toolsDir, err := ToolsDir()
	if err != nil {
		SkipOrFail(t, err)
	}
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "kubebridge-testenv-")
		if shared.err == nil {
			shared.cp, shared.err = NewControlPlane(toolsDir, shared.dir)
		}
	})
	if shared.err != nil {
		t.Fatalf("starting shared control plane: %v", shared.err)
	}
	return shared.cp
}

// Main runs the tests and then stops the shared control plane, if any.
// Use it as TestMain: func TestMain(m *testing.M) { testenv.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if shared.cp != nil {
		if err := shared.cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

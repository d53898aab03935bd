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
func Main(m *testing.M) { os.Exit(run(m)) }

// MainWithBridge builds the bridge binary once (with the race detector when
// race is set) into *bin, runs the tests as Main does, and removes the
// binary. For packages whose tests run the bridge as a user would: a
// subprocess with flags, output and exit status.
func MainWithBridge(m *testing.M, race bool, bin *string) {
	dir, err := os.MkdirTemp("", "bridge-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	if *bin, err = BuildBridge(dir, race); err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	code := run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func run(m *testing.M) int {
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
	return code
}

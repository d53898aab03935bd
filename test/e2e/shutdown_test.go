package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A sink that cannot take events (a full disk: /dev/full) keeps them
// queued. On SIGTERM the bridge drains for --drain-timeout and then exits 1
// saying how many were left; a second signal ends it at once.
func TestShutdownDrainDeadlineAndSecondSignal(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "stuck")
	dir := t.TempDir()
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	cfg := filepath.Join(dir, "c.yaml")
	must(t, os.WriteFile(cfg, []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: full
    file: {path: /dev/full}
    retry: {initialInterval: 10ms, maxInterval: 50ms}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [stuck]
    sinks: [full]
`), 0o600))
	_, err = cp.Clientset(t).CoreV1().ConfigMaps("stuck").Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	must(t, err)

	start := func(drain string) (*exec.Cmd, *syncWriter, chan error) {
		out := &syncWriter{}
		cmd := exec.Command(bridgeBin, "run", "--config", cfg, "--kubeconfig", kc, "--log-format", "text", "--drain-timeout", drain,
			"--checkpoint-file", filepath.Join(t.TempDir(), "state.db"), "--admin-addr", "127.0.0.1:0")
		cmd.Stdout, cmd.Stderr = out, out
		must(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		deadline := time.Now().Add(60 * time.Second)
		for !strings.Contains(out.String(), "bridge started") || !strings.Contains(out.String(), "disk full") { // running, the event queued and failing
			if time.Now().After(deadline) {
				t.Fatalf("no delivery failure logged:\n%s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return cmd, out, done
	}

	t.Run("drain deadline", func(t *testing.T) {
		cmd, out, done := start("1s")
		must(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("exit = %v, want status 1", err)
			}
			if !strings.Contains(out.String(), "shutdown deadline reached with 1 events undelivered") {
				t.Errorf("log lacks the undelivered count:\n%s", out.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("bridge did not exit after its drain deadline")
		}
	})

	t.Run("second signal", func(t *testing.T) {
		cmd, out, done := start("1h")
		must(t, cmd.Process.Signal(syscall.SIGTERM))
		time.Sleep(500 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("exited on the first signal with a 1h drain deadline: %v\n%s", err, out.String())
		default:
		}
		must(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-done:
			if err == nil {
				t.Error("exit status 0 after being interrupted")
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("bridge ignored the second signal")
		}
	})
}

// syncWriter collects a process's output while the test reads it.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

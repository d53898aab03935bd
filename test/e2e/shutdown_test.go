package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A sink that cannot take events (a receiver answering 503) keeps them
// queued. On SIGTERM the bridge drains for --drain-timeout and then exits 1
// saying how many were left; a second signal ends it at once.
func TestShutdownDrainDeadlineAndSecondSignal(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "stuck")
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: full
    webhook: {url: "` + down.URL + `"}
    retry: {initialInterval: 10ms, maxInterval: 50ms}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [stuck]
    sinks: [full]
`
	_, err := cp.Clientset(t).CoreV1().ConfigMaps("stuck").Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	must(t, err)

	// Running, the event queued and failing.
	start := func(t *testing.T, drain string) *bridgeProc {
		return startBridge(t, cp, cfg, withLogLevel("info"), withFlags("--drain-timeout", drain), withReadyLog("bridge started", "delivery failed"))
	}

	t.Run("drain deadline", func(t *testing.T) {
		b := start(t, "1s")
		b.signal(syscall.SIGTERM)
		exited, err := b.wait(20 * time.Second)
		if !exited {
			b.kill()
			t.Fatal("bridge did not exit after its drain deadline")
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit = %v, want status 1", err)
		}
		if !strings.Contains(b.log(), "shutdown deadline reached with 1 events undelivered") {
			t.Errorf("log lacks the undelivered count:\n%s", b.log())
		}
	})

	t.Run("second signal", func(t *testing.T) {
		b := start(t, "1h")
		b.signal(syscall.SIGTERM)
		time.Sleep(500 * time.Millisecond)
		if b.exited() {
			t.Fatalf("exited on the first signal with a 1h drain deadline: %v\n%s", b.err, b.log())
		}
		b.signal(syscall.SIGTERM)
		exited, err := b.wait(10 * time.Second)
		if !exited {
			b.kill()
			t.Fatal("bridge ignored the second signal")
		}
		if err == nil {
			t.Error("exit status 0 after being interrupted")
		}
	})
}

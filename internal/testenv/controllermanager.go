package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kcmReadyTimeout bounds the wait for the controllers' first visible work.
const kcmReadyTimeout = 60 * time.Second

// StartControllerManager runs a real kube-controller-manager (built by
// hack/tools/build.sh) against cp with every controller, as the admin, on
// no port (--secure-port=0), until t ends. From then on the cluster behaves
// like a real one without nodes: Deployments get ReplicaSets and Pods (which
// stay Pending), garbage collection cascades, deleted namespaces go away,
// and the controllers write real Events (ScalingReplicaSet, SuccessfulCreate,
// SuccessfulDelete). It also publishes a ConfigMap kube-root-ca.crt into
// every namespace: count it or filter it.
//
// It changes every namespace, so it refuses the shared control plane: start
// one of the test's own (StartControlPlane). When t has failed, the log is
// kept (its path and last lines are logged).
func (cp *ControlPlane) StartControllerManager(t testing.TB) {
	t.Helper()
	if cp == shared.cp {
		t.Fatal("StartControllerManager on the shared control plane would change every other test's namespaces: use StartControlPlane")
	}
	bin := filepath.Join(cp.toolsDir, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		SkipOrFail(t, fmt.Errorf("kube-controller-manager not built: run `make tools`: %w", err))
	}
	kubeconfig, err := cp.writeKubeconfig(filepath.Join(cp.Dir, "kube-controller-manager.kubeconfig"), "kubebridge-admin", cp.Token)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(cp.Dir, "kube-controller-manager.log")
	p, err := startProcess("kube-controller-manager", bin, []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file=" + filepath.Join(cp.Dir, "sa.key"),
		"--use-service-account-credentials=false",
		"--controllers=*",
		"--v=1",
	}, logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.stop(stopTimeout); err != nil {
			t.Errorf("stopping kube-controller-manager: %v", err)
		}
		if t.Failed() {
			keepLog(t, p)
		}
	})
	// Serving nothing, it is ready when its work shows: the root CA
	// published into a namespace that exists from the start.
	cs := cp.Clientset(t)
	if err := waitReady(p, kcmReadyTimeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
}

// keepLog copies a process's log out of the test's temporary folder (which
// is removed when the test ends) and logs where it is and how it ends.
func keepLog(t testing.TB, p *process) {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Logf("%s log: %v", p.name, err)
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	f, err := os.CreateTemp("", "kubebridge-"+p.name+"-"+name+"-*.log")
	if err == nil {
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Logf("%s log not kept: %v; the end:\n%s", p.name, err, p.logTail())
		return
	}
	t.Logf("%s log kept in %s; the end:\n%s", p.name, f.Name(), p.logTail())
}

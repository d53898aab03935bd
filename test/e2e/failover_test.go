package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Two bridges share a Lease and a NATS KV checkpoint. The leader is frozen
// (SIGSTOP) under load; the follower takes over and reconciles; the old
// leader, thawed, finds its lease gone and exits without delivering again.
// Afterwards the stream holds every object's final state: nothing lost.
func TestLeaderFailover(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"fo-a", "fo-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	srv := testenv.StartNATS(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(cfgPath, []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: kb-failover}}
sinks:
  - name: bus
    nats: {url: "`+srv.ClientURL()+`", jetstream: true, stream: {name: K8S, duplicateWindow: 10m}}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [`+strings.Join(namespaces, ", ")+`]
    sinks: [bus]
`), 0o600))
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	start := func(name string) (*exec.Cmd, *syncWriter) {
		out := &syncWriter{}
		cmd := exec.Command(bridgeBin, "run", "--config", cfgPath, "--kubeconfig", kc, "--log-format", "text", "--admin-addr", "127.0.0.1:0",
			"--leader-elect", "--leader-elect-namespace", "default", "--leader-elect-name", "kb-failover",
			"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms")
		cmd.Env = append(os.Environ(), "HOSTNAME="+name)
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		must(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
		})
		return cmd, out
	}
	waitLog := func(out *syncWriter, want string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q within %s:\n%s", want, timeout, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	a, aOut := start("replica-a")
	waitLog(aOut, "became the leader", 60*time.Second)
	_, bOut := start("replica-b")
	waitLog(bOut, "following", 60*time.Second)

	l := &load{created: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go l.run(t, cp, namespaces, stop, &wg)
	time.Sleep(1500 * time.Millisecond)

	must(t, a.Process.Signal(syscall.SIGSTOP)) // frozen: cannot renew
	waitLog(bOut, "became the leader", 30*time.Second)
	time.Sleep(1 * time.Second)
	must(t, a.Process.Signal(syscall.SIGCONT))
	exited := make(chan error, 1)
	go func() { exited <- a.Wait() }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("the old leader kept running after losing its lease:\n%s", aOut.String())
	}
	if !strings.Contains(aOut.String(), "lost the leader lease") {
		t.Errorf("the old leader did not say it lost the lease:\n%s", aOut.String())
	}
	time.Sleep(1 * time.Second)
	close(stop)
	wg.Wait()

	// Truth from the apiserver; what consumers have from the stream.
	current := map[string]string{}
	for _, ns := range namespaces {
		list, err := cp.Clientset(t).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			if strings.HasPrefix(cm.Name, "obj-") {
				current[ns+"/"+cm.Name] = cm.ResourceVersion
			}
		}
	}
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var lost []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		last := map[string]string{} // subject -> last id
		st, err := js.Stream(context.Background(), "K8S")
		must(t, err)
		info, err := st.Info(context.Background())
		must(t, err)
		for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(context.Background(), seq)
			if err == nil {
				last[m.Header.Get("ce-subject")] = m.Header.Get("ce-id")
			}
		}
		lost = lost[:0]
		l.mu.Lock()
		for key := range l.created {
			id, seen := last[key]
			rv, exists := current[key]
			switch {
			case exists && (!seen || !strings.HasSuffix(id, "."+rv+".added") && !strings.HasSuffix(id, "."+rv+".updated")):
				lost = append(lost, fmt.Sprintf("%s: rv %s, last %q", key, rv, id))
			case !exists && seen && !strings.HasSuffix(id, ".deleted"):
				lost = append(lost, fmt.Sprintf("%s: deleted, last %q", key, id))
			}
		}
		l.mu.Unlock()
		if len(lost) == 0 || time.Now().After(deadline) {
			t.Logf("failover under %d changes: stream holds %d messages, lost %d", l.ops, info.State.Msgs, len(lost))
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(lost) > 0 {
		t.Errorf("lost after failover:\n  %s", strings.Join(lost[:min(len(lost), 20)], "\n  "))
	}
}

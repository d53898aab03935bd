package e2e

import (
	"context"
	"fmt"
	"strings"
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
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"fo-a", "fo-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	srv := testenv.StartNATS(t)
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: kb-failover}}
sinks:
  - name: bus
    nats: {url: "` + srv.ClientURL() + `", jetstream: true, stream: {name: K8S, duplicateWindow: 10m}}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + strings.Join(namespaces, ", ") + `]
    sinks: [bus]
`
	// Replicas on one Lease and the config's checkpoint; the test's end
	// kills them (the old leader exits by itself, with the lease lost).
	replica := func(name, ready string) *bridgeProc {
		return startBridge(t, cp, cfg, withConfigCheckpoint(), withLogLevel("info"), withLeaderElection("default", "kb-failover"), withShortLease(),
			withReplicaName(name), withReadyLog(ready), withKillAtEnd())
	}
	a := replica("replica-a", "became the leader")
	b := replica("replica-b", "following")

	l := startLoad(t, cp, namespaces, false)
	time.Sleep(1500 * time.Millisecond)

	a.signal(syscall.SIGSTOP) // frozen: cannot renew
	b.waitLog("became the leader", 30*time.Second)
	time.Sleep(1 * time.Second)
	a.signal(syscall.SIGCONT)
	if exited, _ := a.wait(20 * time.Second); !exited {
		t.Fatalf("the old leader kept running after losing its lease:\n%s", a.log())
	}
	if !strings.Contains(a.log(), "lost the leader lease") {
		t.Errorf("the old leader did not say it lost the lease:\n%s", a.log())
	}
	time.Sleep(1 * time.Second)
	l.stop()

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
	var msgs uint64
	testenv.Poll(60*time.Second, 500*time.Millisecond, func() bool {
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
		msgs = info.State.Msgs
		return len(lost) == 0
	})
	t.Logf("failover under %d changes: stream holds %d messages, lost %d", l.ops, msgs, len(lost))
	if len(lost) > 0 {
		t.Errorf("lost after failover:\n  %s", strings.Join(lost[:min(len(lost), 20)], "\n  "))
	}
}

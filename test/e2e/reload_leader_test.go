package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Under leader election a config change applies in place on every
// replica: the leader swaps its sinks and rules, the replica waiting for
// the Lease its rules; when the leader dies, the other leads on the new
// config. Nothing is lost on the sink kept, and the new rule's sink holds
// its view across the handover.
func TestHotReloadUnderLeaderElection(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	const ns = "reload-leader"
	testenv.EnsureNamespace(t, cp, ns)
	nats := testenv.StartNATS(t)
	dir := t.TempDir()
	keep, fresh := filepath.Join(dir, "keep.jsonl"), filepath.Join(dir, "new.jsonl")
	v1 := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: kb-reload-leader}}
sinks:
  - name: bus
    nats: {url: "` + nats.ClientURL() + `", jetstream: true, stream: {name: RELOADLEADER}}
  - name: keep
    file: {path: ` + keep + `}
rules:
  - name: r-keep
    resource: v1/configmaps
    namespaces: [` + ns + `]
    sinks: [keep, bus]
`
	v2 := strings.Replace(v1, `rules:`, `  - name: new
    file: {path: `+fresh+`}
rules:
  - name: r-new
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [new]`, 1)
	replica := func(name, ready string) *bridgeProc {
		return startBridge(t, cp, v1, withConfigCheckpoint(), withLogLevel("info"), withLeaderElection("default", "kb-reload-leader"), withShortLease(),
			withReplicaName(name), withReadyLog(ready), withKillAtEnd())
	}
	a := replica("replica-a", "became the leader")
	b := replica("replica-b", "following")
	l := startLoad(t, cp, []string{ns}, false)
	time.Sleep(time.Second)

	for _, r := range []*bridgeProc{a, b} {
		must(t, os.WriteFile(r.configPath, []byte(v2), 0o600))
	}
	testenv.Eventually(t, 30*time.Second, "the leader's reload", func() bool { return strings.Contains(a.log(), "config reloaded") })
	testenv.Eventually(t, 30*time.Second, "the waiting replica's reload", func() bool { return strings.Contains(b.log(), "config reloaded") })
	if strings.Contains(a.log(), "not supported") || strings.Contains(b.log(), "not supported") {
		t.Fatalf("a replica refused the reload:\n%s\n%s", a.runLogTail(), b.runLogTail())
	}
	if !strings.Contains(b.log(), "standby=true") {
		t.Errorf("the waiting replica's reload does not say it waits:\n%s", b.runLogTail())
	}
	testenv.Eventually(t, 30*time.Second, "the new sink's first events", func() bool { return len(readEvents(t, fresh)) > 0 })

	time.Sleep(time.Second)
	a.kill() // the leader dies: b leads, on the new config
	b.waitLog("became the leader", 30*time.Second)
	time.Sleep(2 * time.Second)
	l.stop()

	only := func(path, rule string) func() []ce {
		return func() []ce {
			var out []ce
			for _, e := range readEvents(t, path) {
				if e.Rule == rule {
					out = append(out, e)
				}
			}
			return out
		}
	}
	verifyAgainstTruth(t, cp, []string{ns}, l, "a reload under leader election, then a failover (kept sink)", only(keep, "r-keep"))
	verifyAgainstTruth(t, cp, []string{ns}, l, "a reload under leader election, then a failover (new rule)", only(fresh, "r-new"))
}

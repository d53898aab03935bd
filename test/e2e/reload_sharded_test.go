package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Sharded replicas apply a config change in place, each for the shards it
// holds, while the objects churn and the shards move: a third replica
// joins as the others reload (shards are given back while a reload
// applies), and one of the reloaded replicas is SIGKILLed afterwards (its
// shards are taken on the new config). The change narrows a rule (one
// namespace of two), changes the settings of its sink (drained, restarted
// from each shard's checkpoint) and adds a sink with a rule of its own.
// In the end each stream, read by uid, holds exactly its rule's view:
// nothing the narrowed rule excludes stays, nothing is lost.
func TestHotReloadSharded(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	nsA, nsB := "reload-shard-a", "reload-shard-b"
	testenv.EnsureNamespace(t, cp, nsA)
	testenv.EnsureNamespace(t, cp, nsB)
	srv := testenv.StartNATS(t)
	v1 := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: kb-reload-sharded}}
sharding: {shards: ` + strconv.Itoa(testShards) + `}
sinks:
  - name: bus
    nats: {url: "` + srv.ClientURL() + `", jetstream: true, stream: {name: RELOADSHARDED}}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + nsA + `, ` + nsB + `]
    sinks: [bus]
`
	v2 := strings.NewReplacer(
		`stream: {name: RELOADSHARDED}}`, `stream: {name: RELOADSHARDED}}
    workers: 2
  - name: side
    nats: {url: "`+srv.ClientURL()+`", jetstream: true, subject: "side.{namespace}.{name}.{type}", stream: {name: RELOADSIDE}}`,
		`namespaces: [`+nsA+`, `+nsB+`]
    sinks: [bus]`, `namespaces: [`+nsA+`]
    sinks: [bus]
  - name: side
    resource: v1/configmaps
    namespaces: [`+nsB+`]
    sinks: [side]`).Replace(v1)
	if v2 == v1 || !strings.Contains(v2, "workers: 2") || !strings.Contains(v2, "sinks: [side]") {
		t.Fatalf("the second config is not the change meant:\n%s", v2)
	}
	replica := func(name, config string) *bridgeProc {
		return startBridge(t, cp, config, withConfigCheckpoint(), withLogLevel("info"), withShortLease(),
			withFlags("--leader-elect-namespace", "default", "--leader-elect-name", "kb-reload-sharded", "--identity", name),
			withReadyLog("bridge started; sharing the shards"), withKillAtEnd())
	}
	a, b := replica("replica-a", v1), replica("replica-b", v1)
	l := startLoad(t, cp, []string{nsA, nsB}, false)
	stopRecreate := recreateLoop(t, cp, nsA, l)
	waitShardsBalanced(t, "two replicas", a, b)
	time.Sleep(time.Second)

	reloads := map[*bridgeProc]int{}
	for _, r := range []*bridgeProc{a, b} {
		reloads[r] = strings.Count(r.log(), "config reloaded")
		must(t, os.WriteFile(r.configPath, []byte(v2), 0o600))
	}
	c := replica("replica-c", v2) // joins as they reload: shards move meanwhile
	for _, r := range []*bridgeProc{a, b} {
		testenv.Eventually(t, 60*time.Second, "a replica's reload", func() bool { return strings.Count(r.log(), "config reloaded") > reloads[r] })
		for _, bad := range []string{"not supported", "config change refused", "msg=stopping"} {
			if strings.Contains(r.log(), bad) {
				t.Fatalf("a replica logged %q:\n%s", bad, r.runLogTail())
			}
		}
	}
	waitShardsBalanced(t, "three replicas on the new config", a, b, c)
	time.Sleep(time.Second)
	a.kill() // its shards are taken over on the new config
	waitShardsBalanced(t, "after a SIGKILL", b, c)
	time.Sleep(time.Second)
	stopRecreate()
	l.stop()

	js := viewJetStream(t, srv)
	verifyByUID(t, cp, []string{nsA}, "the narrowed rule's changed sink", func() []ce { return viewStreamEvents(viewStream(t, js, "RELOADSHARDED")) })
	verifyByUID(t, cp, []string{nsB}, "the new rule's new sink", func() []ce { return viewStreamEvents(viewStream(t, js, "RELOADSIDE")) })
}

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// Sharding needs a checkpoint every replica reads: the chart refuses the
// file checkpoint and an embedded nats-server's KV, naming what to set.
func TestChartShardingRefusesWhatCannotShare(t *testing.T) {
	t.Parallel()
	embedded := strings.Replace(chartNATSConfig, `{url: "nats://nats.nats.svc:4222", jetstream: true}`, "{embedded: true, jetstream: true}", 1)
	cases := []struct{ name, values, want string }{
		{"file checkpoint", "replicas: 2\nsharding: {shards: 4}\n" + chartNATSConfig,
			"sharding (4 shards) needs config.checkpoint.natsKV on a NATS server every replica reaches (a nats sink with a url, not embedded)"},
		{"embedded nats-server", "sharding: {shards: 4}\nleaderElection: {enabled: false}\n" + embedded + "  checkpoint: {natsKV: {sink: bus}}\n",
			"the checkpoint is natsKV-embedded"},
		{"sharding set twice", "sharding: {shards: 4}\n" + chartNATSConfig + "  checkpoint: {natsKV: {sink: bus}}\n  sharding: {shards: 2}\n",
			"sharding is set twice"},
		{"config.sharding with the file checkpoint", "leaderElection: {enabled: false}\n" + chartNATSConfig + "  sharding: {shards: 2}\n",
			"sharding (2 shards) needs config.checkpoint.natsKV"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", chartValues(t, c.values))
			if err == nil || !strings.Contains(out, c.want) {
				t.Errorf("want a failure naming %q; got %v:\n%s", c.want, err, out)
			}
		})
	}
}

// Sharded replicas apply a config change in place (hotReload): the chart
// passes --reload=true and leaves out the checksum that would roll the
// pods.
func TestChartShardingWithHotReload(t *testing.T) {
	t.Parallel()
	values := "replicas: 2\nsharding: {shards: 4}\nhotReload: true\n" + chartNATSConfig + "  checkpoint: {natsKV: {sink: bus}}\n"
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", chartValues(t, values))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	if !strings.Contains(out, "--reload=true") || strings.Contains(out, "checksum/config") {
		t.Errorf("want --reload=true and no checksum/config annotation:\n%s", out)
	}
}

// Installed with replicas 3 and 8 shards, the chart renders the config's
// sharding, a PodDisruptionBudget and the shard Leases' Role; replicas
// running as its ServiceAccount, each with its pod name as identity, share
// the shards through those Leases.
func TestChartShardingInstallsAndItsReplicasShare(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	const ns = "kb-shards"
	testenv.EnsureNamespace(t, cp, "chart-shards")
	srv := testenv.StartNATS(t)
	values := "replicas: 3\nsharding: {shards: 8}\n" + strings.NewReplacer(`nats://nats.nats.svc:4222`, srv.ClientURL(), "namespaces: [default]", "namespaces: [chart-shards]").Replace(chartNATSConfig) +
		"  checkpoint: {natsKV: {sink: bus, bucket: kb-chart-shards}}\n"
	dir := t.TempDir()
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	path := chartValues(t, values)
	manifests, err := helm(t, "template", "kb", chartDir, "--namespace", ns, "-f", path)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, manifests)
	}
	if out, err := helm(t, "install", "kb", chartDir, "--namespace", ns, "--create-namespace", "-f", path, "--kubeconfig", kc); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	cs := cp.Clientset(t)
	pdb, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(context.Background(), "kb", metav1.GetOptions{})
	must(t, err)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", pdb.Spec.MaxUnavailable)
	}
	dep := renderedDoc(t, manifests, "Deployment")
	if s := strings.Join(containerEnvNames(dep), ","); !strings.Contains(s, "POD_NAME") {
		t.Errorf("the Deployment does not pass the pod's name (env %s)", s)
	}
	cfg := renderedConfig(t, manifests)
	if !strings.Contains(cfg, "sharding:") || !strings.Contains(cfg, "shards: 8") {
		t.Fatalf("the rendered config has no sharding:\n%s", cfg)
	}

	// Three replicas as the chart's ServiceAccount (RBAC takes a moment).
	sa := cp.ServiceAccountKubeconfig(t, ns, "kb")
	var replicas []*bridgeProc
	for _, name := range []string{"kb-7d9f-a", "kb-7d9f-b", "kb-7d9f-c"} {
		testenv.Await(t, 30*time.Second, time.Second, func() error {
			b, err := tryStartBridge(t, cp, cfg, withKubeconfig(sa), withConfigCheckpoint(), withLogLevel("info"), withShortLease(),
				withFlags("--leader-elect-namespace", ns, "--leader-elect-name", "kb"), withEnv("POD_NAME="+name),
				withReadyLog("bridge started; sharing the shards"), withStartTimeout(20*time.Second))
			if err == nil {
				replicas = append(replicas, b)
			}
			return err
		})
	}
	waitShardsBalanced(t, "as the chart's ServiceAccount", replicas...)
	leases, err := cs.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "kubebridge.io/shards=kb"})
	must(t, err)
	holders := map[string]int{}
	for _, l := range leases.Items {
		if l.Spec.HolderIdentity != nil && strings.HasPrefix(l.Name, "kb-shard-") {
			holders[*l.Spec.HolderIdentity]++
		}
	}
	if len(holders) != 3 || holders["kb-7d9f-a"] == 0 {
		t.Errorf("shard Leases held by %v; want the three pod names", holders)
	}
}

// containerEnvNames lists the env names of a rendered Deployment's first container.
func containerEnvNames(dep map[string]any) []string {
	spec, _ := dep["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	containers, _ := pod["containers"].([]any)
	if len(containers) == 0 {
		return nil
	}
	c, _ := containers[0].(map[string]any)
	env, _ := c["env"].([]any)
	var out []string
	for _, e := range env {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m["name"].(string))
		}
	}
	return out
}

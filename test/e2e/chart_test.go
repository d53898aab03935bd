package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

const chartDir = "../../charts/kubebridge"

// valuesFor turns a config file into chart values (config without apiVersion/kind).
func valuesFor(t *testing.T, configYAML []byte, dir string) string {
	t.Helper()
	var cfg map[string]any
	must(t, yaml.Unmarshal(configYAML, &cfg))
	delete(cfg, "apiVersion")
	delete(cfg, "kind")
	out, err := yaml.Marshal(map[string]any{"config": cfg})
	must(t, err)
	path := filepath.Join(dir, "values.yaml")
	must(t, os.WriteFile(path, out, 0o600))
	return path
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(testenv.Tool(t, "helm"), args...).CombinedOutput()
	return string(out), err
}

// The chart lints and renders for its defaults and for every example
// config, and the config it renders is one the bridge accepts.
func TestChartRendersEveryExample(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", chartDir); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	cases := map[string]string{"defaults": ""}
	clusterWideSecrets := map[string]bool{}
	examples, _ := filepath.Glob("../../config/*.yaml")
	for _, f := range examples {
		data, err := os.ReadFile(f)
		must(t, err)
		cases[filepath.Base(f)] = valuesFor(t, data, t.TempDir())
		clusterWideSecrets[filepath.Base(f)] = watchesSecretsClusterWide(t, data)
	}
	for name, values := range cases {
		args := []string{"template", "kb", chartDir, "--namespace", "kb-system"}
		if values != "" {
			args = append(args, "-f", values)
		}
		if clusterWideSecrets[name] {
			// Secrets in every namespace render only on request (chart_rbac_test.go).
			args = append(args, "--set", "rbac.allowClusterWideSecrets=true")
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Errorf("%s: helm template: %v\n%s", name, err, out)
			continue
		}
		rendered := renderedConfig(t, out)
		if _, _, err := config.Parse(name, []byte(rendered), components.SinkRegistry()); err != nil {
			t.Errorf("%s: the rendered config is invalid: %v\n%s", name, err, rendered)
		}
		if !strings.Contains(out, "readOnlyRootFilesystem: true") || !strings.Contains(out, "drop: [ALL]") || !strings.Contains(out, "runAsNonRoot: true") {
			t.Errorf("%s: the Deployment is not locked down", name)
		}
	}
}

// renderedConfig extracts config.yaml from the rendered ConfigMap.
func renderedConfig(t *testing.T, manifests string) string {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(manifests))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc["kind"] == "ConfigMap" {
			if data, ok := doc["data"].(map[string]any); ok && data["config.yaml"] != nil {
				return data["config.yaml"].(string)
			}
		}
	}
	t.Fatal("no ConfigMap with config.yaml rendered")
	return ""
}

// helm install into the real apiserver (every manifest validated by it);
// then the bridge runs as the chart's ServiceAccount: it may watch what its
// rules need, and is refused a resource outside them.
func TestChartInstallAndIdentity(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "chart-apps")
	dir := t.TempDir()
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	out := filepath.Join(dir, "events.jsonl")
	cfg := fileConfig(out, rule("cms", "v1/configmaps", "chart-apps"), rule("deploys", "apps/v1/deployments", "chart-apps"))
	values := valuesFor(t, []byte(cfg), dir)
	if res, err := helm(t, "install", "kb", chartDir, "--namespace", "kb-system", "--create-namespace", "-f", values, "--kubeconfig", kc); err != nil {
		t.Fatalf("helm install: %v\n%s", err, res)
	}
	role, err := cp.Clientset(t).RbacV1().Roles("chart-apps").Get(context.Background(), "kb", metav1.GetOptions{})
	must(t, err)
	if got := strings.TrimSpace(ruleString(role.Rules)); got != `"": configmaps [list watch]; "apps": deployments [list watch]` {
		t.Errorf("generated Role rules: %s", got)
	}

	sa := cp.ServiceAccountKubeconfig(t, "kb-system", "kb")
	cfgPath := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))
	run := func(cfgPath string) *exec.Cmd {
		return exec.Command(bridgeBin, "run", "--config", cfgPath, "--kubeconfig", sa, "--admin-addr", "127.0.0.1:0",
			"--log-format", "text", "--checkpoint-file", filepath.Join(t.TempDir(), "state.db"))
	}
	// As the chart's identity, the bridge starts (RBAC takes a moment to reach the authorizer).
	var log syncWriter
	deadline := time.Now().Add(30 * time.Second)
	for {
		log = syncWriter{}
		cmd := run(cfgPath)
		cmd.Stdout, cmd.Stderr = &log, &log
		must(t, cmd.Start())
		started := false
		for wait := time.Now().Add(15 * time.Second); time.Now().Before(wait); time.Sleep(50 * time.Millisecond) {
			if strings.Contains(log.String(), "bridge started") {
				started = true
				break
			}
			if cmd.ProcessState != nil {
				break
			}
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridge did not start as the chart's ServiceAccount:\n%s", log.String())
		}
		time.Sleep(time.Second)
	}

	// A rule outside the chart's RBAC is refused at start, naming what is missing.
	extra := filepath.Join(dir, "extra.yaml")
	must(t, os.WriteFile(extra, []byte(cfg+rule("secrets", "v1/secrets", "chart-apps")), 0o600))
	res, err := run(extra).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("exit = %v, want 2\n%s", err, res)
	}
	want := `rules[2]: "system:serviceaccount:kb-system:kb" may not list or watch secrets in namespace "chart-apps"`
	if !bytes.Contains(res, []byte(want)) {
		t.Errorf("output lacks %q:\n%s", want, res)
	}
}

func ruleString(rules []rbacv1.PolicyRule) string {
	var parts []string
	for _, r := range rules {
		parts = append(parts, fmt.Sprintf("%q: %s %v", strings.Join(r.APIGroups, ","), strings.Join(r.Resources, ","), r.Verbs))
	}
	return strings.Join(parts, "; ")
}

// chartValues writes a values file and returns its path (helm splits -f at
// commas, which subtest names put into t.TempDir()).
func chartValues(t *testing.T, values string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if strings.Contains(path, ",") {
		t.Fatalf("helm would split the values path %q at its comma", path)
	}
	must(t, os.WriteFile(path, []byte(values), 0o600))
	return path
}

// renderedDoc returns the first rendered manifest of kind, or nil.
func renderedDoc(t *testing.T, manifests, kind string) map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(manifests))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			return nil
		}
		if doc["kind"] == kind {
			return doc
		}
	}
}

// A config with a (non-embedded) NATS sink, in chart values.
const chartNATSConfig = `
config:
  cluster: e2e
  sinks:
    - name: bus
      nats: {url: "nats://nats.nats.svc:4222", jetstream: true}
  rules:
    - {name: cms, resource: v1/configmaps, namespaces: [default], sinks: [bus]}
`

// Leader election with several replicas needs a checkpoint every replica
// reads: the chart refuses the file checkpoint on an emptyDir or a
// ReadWriteOnce PVC (a new leader would start from an empty checkpoint and
// never deliver what was deleted during the handover), and the KV of an
// embedded nats-server (one per pod), naming the values to set.
func TestChartLeaderElectionRefusesAPerPodCheckpoint(t *testing.T) {
	const advice = "Set config.checkpoint.natsKV (sink: <a nats sink>, bucket: kubebridge), or persistence.enabled=true with persistence.accessMode=ReadWriteMany (a volume every node mounts), or replicas=1"
	cases := []struct {
		name, values string
		want         []string
	}{
		{"file on an emptyDir", "replicas: 2\n" + chartNATSConfig,
			[]string{"leaderElection.enabled=true with replicas=2 needs a checkpoint every replica reads: with the file checkpoint on an emptyDir, a new leader starts from an empty checkpoint and never delivers the objects deleted during the handover as deleted.", advice}},
		{"file written out with three replicas", "replicas: 3\n" + chartNATSConfig + "  checkpoint: {file: /var/lib/kubebridge/state.db}\n",
			[]string{"leaderElection.enabled=true with replicas=3 needs a checkpoint every replica reads: with the file checkpoint on an emptyDir", advice}},
		{"file on a ReadWriteOnce PVC", "replicas: 2\npersistence: {enabled: true}\n" + chartNATSConfig,
			[]string{"with the file checkpoint on a ReadWriteOnce PVC, a new leader", advice}},
		{"ReadWriteMany without persistence", "replicas: 2\npersistence: {accessMode: ReadWriteMany}\n" + chartNATSConfig,
			[]string{"with the file checkpoint on an emptyDir", advice}},
		{"natsKV on an embedded nats-server", "replicas: 2\n" + strings.Replace(chartNATSConfig, `{url: "nats://nats.nats.svc:4222", jetstream: true}`, "{embedded: true, jetstream: true}", 1) +
			"  checkpoint: {natsKV: {sink: bus}}\n",
			[]string{`config.checkpoint.natsKV.sink "bus" runs an embedded nats-server, whose KV bucket lives inside each pod. Point that sink at a NATS server all replicas reach (nats.url, embedded: false), or set replicas=1`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", chartValues(t, c.values))
			if err == nil {
				t.Fatalf("helm template rendered; want a failure\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("helm output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "kind: Deployment") {
				t.Errorf("manifests printed despite the failure:\n%s", out)
			}
		})
	}
}

// A shared checkpoint lets several replicas render: natsKV on a NATS server
// every replica reaches, or the file on a ReadWriteMany PVC. Without several
// replicas (or without leader election) the file checkpoint renders as before.
func TestChartLeaderElectionWithASharedCheckpointRenders(t *testing.T) {
	cases := []struct {
		name, values string
		replicas     float64
		leaderElect  bool
		accessMode   string // of the PVC; "" = no PVC
	}{
		{"natsKV", "replicas: 2\n" + chartNATSConfig + "  checkpoint: {natsKV: {sink: bus, bucket: kubebridge}}\n", 2, true, ""},
		{"natsKV with persistence", "replicas: 3\npersistence: {enabled: true}\n" + chartNATSConfig + "  checkpoint: {natsKV: {sink: bus}}\n", 3, true, "ReadWriteOnce"},
		{"file on a ReadWriteMany PVC", "replicas: 2\npersistence: {enabled: true, accessMode: ReadWriteMany}\n" + chartNATSConfig, 2, true, "ReadWriteMany"},
		{"one replica with the file on an emptyDir", "replicas: 1\n" + chartNATSConfig, 1, true, ""},
		{"one replica with the file on a ReadWriteOnce PVC", "persistence: {enabled: true}\n" + chartNATSConfig, 1, true, "ReadWriteOnce"},
		{"leader election off", "leaderElection: {enabled: false}\n" + chartNATSConfig, 1, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", chartValues(t, c.values))
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			if _, _, err := config.Parse(c.name, []byte(renderedConfig(t, out)), components.SinkRegistry()); err != nil {
				t.Errorf("the rendered config is invalid: %v", err)
			}
			dep := renderedDoc(t, out, "Deployment")
			if dep == nil {
				t.Fatalf("no Deployment rendered:\n%s", out)
			}
			if got := dep["spec"].(map[string]any)["replicas"]; got != int(c.replicas) && got != c.replicas {
				t.Errorf("Deployment replicas = %v, want %v", got, c.replicas)
			}
			if got := strings.Contains(out, "- --leader-elect\n"); got != c.leaderElect {
				t.Errorf("--leader-elect rendered = %v, want %v", got, c.leaderElect)
			}
			pvc := renderedDoc(t, out, "PersistentVolumeClaim")
			switch {
			case c.accessMode == "" && pvc != nil:
				t.Errorf("a PVC rendered: %v", pvc)
			case c.accessMode != "" && pvc == nil:
				t.Errorf("no PVC rendered")
			case c.accessMode != "":
				modes := pvc["spec"].(map[string]any)["accessModes"]
				if fmt.Sprint(modes) != "["+c.accessMode+"]" {
					t.Errorf("PVC accessModes = %v, want [%s]", modes, c.accessMode)
				}
			}
		})
	}
	// The schema knows the access modes the chart supports.
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "persistence.enabled=true", "--set", "persistence.accessMode=ReadWriteOncePod")
	if err == nil || !strings.Contains(out, "accessMode") {
		t.Errorf("persistence.accessMode=ReadWriteOncePod: err = %v, want a schema error naming it\n%s", err, out)
	}
}

// The default values render, safely: one replica with leader election and the
// file checkpoint (on an emptyDir). The install notes warn that this gives no
// failover; a shared checkpoint, or no leader election, silences the warning.
func TestChartDefaultValuesRender(t *testing.T) {
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system")
	if err != nil {
		t.Fatalf("helm template with the default values: %v\n%s", err, out)
	}
	dep := renderedDoc(t, out, "Deployment")
	if dep == nil {
		t.Fatalf("no Deployment rendered:\n%s", out)
	}
	if got := fmt.Sprint(dep["spec"].(map[string]any)["replicas"]); got != "1" {
		t.Errorf("default replicas = %s, want 1", got)
	}
	if renderedDoc(t, out, "PersistentVolumeClaim") != nil {
		t.Errorf("a PVC rendered by default")
	}
	if _, _, err := config.Parse("defaults", []byte(renderedConfig(t, out)), components.SinkRegistry()); err != nil {
		t.Errorf("the default config is invalid: %v", err)
	}

	notes := func(args ...string) string {
		t.Helper()
		args = append([]string{"install", "kb", chartDir, "--namespace", "kb-system", "--dry-run=client"}, args...)
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
		i := strings.Index(out, "NOTES:")
		if i < 0 {
			t.Fatalf("helm %v printed no NOTES:\n%s", args, out)
		}
		return out[i:]
	}
	const warning = "WARNING: leader election with one replica and the file checkpoint gives no failover"
	if got := notes(); !strings.Contains(got, warning) || !strings.Contains(got, "The checkpoint is on an emptyDir") {
		t.Errorf("default install notes lack the warning:\n%s", got)
	}
	if got := notes("--set", "persistence.enabled=true"); !strings.Contains(got, warning) || strings.Contains(got, "emptyDir") {
		t.Errorf("notes with persistence: want the warning without the emptyDir part:\n%s", got)
	}
	if got := notes("-f", chartValues(t, chartNATSConfig+"  checkpoint: {natsKV: {sink: bus}}\n")); strings.Contains(got, "WARNING") {
		t.Errorf("notes with natsKV warn:\n%s", got)
	}
	if got := notes("--set", "leaderElection.enabled=false"); strings.Contains(got, "WARNING") {
		t.Errorf("notes without leader election warn:\n%s", got)
	}
}

// With a memory limit, the chart hands it to the bridge through the downward
// API (KUBEBRIDGE_MEMORY_LIMIT, in bytes) with --memory-limit-ratio, so the
// GC's soft limit follows the container's; without one it sets neither (the
// downward API would report the node's allocatable memory). Installed into
// the apiserver, which validates the resourceFieldRef; no kubelet runs the
// pods, so the Deployment is what is checked.
func TestChartMemoryLimitFromContainer(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	kc, err := cp.Kubeconfig(t.TempDir())
	must(t, err)
	const ns = "kb-memlimit"
	cases := []struct {
		release, values string
		wantRatio       string // "": neither the flag nor the variable
	}{
		{"kbmem", "", "0.9"}, // the default values: a 512Mi limit
		{"kbmem-ratio", "memoryLimitRatio: 0.75\nresources: {limits: {memory: 1Gi}}\n", "0.75"},
		{"kbmem-none", "resources: {limits: null}\n", ""},
		{"kbmem-off", "memoryLimitRatio: null\n", ""},
	}
	for _, c := range cases {
		t.Run(c.release, func(t *testing.T) {
			args := []string{"install", c.release, chartDir, "--namespace", ns, "--create-namespace", "--kubeconfig", kc}
			if c.values != "" {
				args = append(args, "-f", chartValues(t, c.values))
			}
			if out, err := helm(t, args...); err != nil {
				t.Fatalf("helm install: %v\n%s", err, out)
			}
			t.Cleanup(func() {
				if out, err := helm(t, "uninstall", c.release, "--namespace", ns, "--kubeconfig", kc); err != nil {
					t.Errorf("helm uninstall: %v\n%s", err, out)
				}
			})
			dep, err := cp.Clientset(t).AppsV1().Deployments(ns).Get(context.Background(), c.release, metav1.GetOptions{})
			must(t, err)
			ctr := dep.Spec.Template.Spec.Containers[0]
			var env *corev1.EnvVar
			for i := range ctr.Env {
				if ctr.Env[i].Name == "KUBEBRIDGE_MEMORY_LIMIT" {
					env = &ctr.Env[i]
				}
			}
			var ratioArgs []string
			for _, a := range ctr.Args {
				if strings.HasPrefix(a, "--memory-limit-ratio") {
					ratioArgs = append(ratioArgs, a)
				}
			}
			if c.wantRatio == "" {
				if env != nil || ratioArgs != nil {
					t.Errorf("without a memory limit: env %v, args %v; want neither", env, ratioArgs)
				}
				return
			}
			if env == nil {
				t.Fatalf("no KUBEBRIDGE_MEMORY_LIMIT in the container's env: %v", ctr.Env)
			}
			ref := env.ValueFrom.ResourceFieldRef
			if env.Value != "" || ref == nil || ref.ContainerName != ctr.Name || ref.Resource != "limits.memory" || ref.Divisor.Cmp(resource.MustParse("1")) != 0 {
				t.Errorf("KUBEBRIDGE_MEMORY_LIMIT = %+v; want the container's limits.memory in bytes (divisor 1)", env)
			}
			if want := []string{"--memory-limit-ratio=" + c.wantRatio}; !slices.Equal(ratioArgs, want) {
				t.Errorf("args %v, want %v", ratioArgs, want)
			}
		})
	}
	// --set passes decimals as strings: still a valid ratio, and out of
	// range refused by the schema, naming the value.
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "memoryLimitRatio=0.5")
	if err != nil || !strings.Contains(out, "- --memory-limit-ratio=0.5\n") {
		t.Errorf("--set memoryLimitRatio=0.5: err %v, want the flag rendered\n%s", err, out)
	}
	for _, bad := range []string{"memoryLimitRatio=1.5", "memoryLimitRatio=0", "memoryLimitRatio=lots"} {
		if out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", bad); err == nil || !strings.Contains(out, "memoryLimitRatio") {
			t.Errorf("--set %s: err = %v, want a schema error naming it\n%s", bad, err, out)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	t.Parallel()
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
	// As the chart's identity, the bridge starts (RBAC takes a moment to reach the authorizer).
	testenv.Await(t, 30*time.Second, time.Second, func() error {
		b, err := tryStartBridge(t, cp, cfg, withKubeconfig(sa), withLogLevel("info"), withStartTimeout(15*time.Second))
		if err != nil {
			return fmt.Errorf("the bridge did not start as the chart's ServiceAccount: %w", err)
		}
		b.stop()
		return nil
	})

	// A rule outside the chart's RBAC is refused at start, naming what is missing.
	extra := filepath.Join(dir, "extra.yaml")
	must(t, os.WriteFile(extra, []byte(cfg+rule("secrets", "v1/secrets", "chart-apps")), 0o600))
	res, code := runBridgeCommand(t, "run", "--config", extra, "--kubeconfig", sa, "--admin-addr", "127.0.0.1:0",
		"--log-format", "text", "--checkpoint-file", filepath.Join(t.TempDir(), "state.db"))
	if code != 2 {
		t.Errorf("exit status %d, want 2\n%s", code, res)
	}
	want := `rules[2]: "system:serviceaccount:kb-system:kb" may not list or watch secrets in namespace "chart-apps"`
	if !strings.Contains(res, want) {
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
	t.Parallel()
	const advice = "Set config.checkpoint.natsKV (sink: <a nats sink>, bucket: kubebridge), or persistence.enabled=true with persistence.accessMode=ReadWriteMany (a volume every node mounts), or replicas=1"
	cases := []struct {
		name, values string
		want         []string
	}{
		{"file on the default ReadWriteOnce PVC", "replicas: 2\n" + chartNATSConfig,
			[]string{"leaderElection.enabled=true with replicas=2 needs a checkpoint every replica reads: with the file checkpoint on a ReadWriteOnce PVC, a new leader starts from an empty checkpoint and never delivers the objects deleted during the handover as deleted.", advice}},
		{"file written out with three replicas", "replicas: 3\n" + chartNATSConfig + "  checkpoint: {file: /var/lib/kubebridge/state.db}\n",
			[]string{"leaderElection.enabled=true with replicas=3 needs a checkpoint every replica reads: with the file checkpoint on a ReadWriteOnce PVC", advice}},
		{"file on an emptyDir", "replicas: 2\npersistence: {enabled: false}\n" + chartNATSConfig,
			[]string{"with the file checkpoint on an emptyDir, a new leader", advice}},
		{"ReadWriteMany without persistence", "replicas: 2\npersistence: {enabled: false, accessMode: ReadWriteMany}\n" + chartNATSConfig,
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

// storage says how a rendered Deployment keeps its data directory: its
// update strategy, and the data volume as "pvc:<claim>" or
// "emptyDir:<sizeLimit>".
func storage(t *testing.T, dep map[string]any) (strategy, data string) {
	t.Helper()
	spec := dep["spec"].(map[string]any)
	st, _ := spec["strategy"].(map[string]any)
	strategy = fmt.Sprint(st["type"])
	for _, v := range spec["template"].(map[string]any)["spec"].(map[string]any)["volumes"].([]any) {
		v := v.(map[string]any)
		if v["name"] != "data" {
			continue
		}
		if pvc, ok := v["persistentVolumeClaim"].(map[string]any); ok {
			return strategy, fmt.Sprint("pvc:", pvc["claimName"])
		}
		if ed, ok := v["emptyDir"].(map[string]any); ok {
			return strategy, fmt.Sprint("emptyDir:", ed["sizeLimit"])
		}
		t.Fatalf("data volume of an unexpected kind: %v", v)
	}
	t.Fatalf("no data volume in %v", spec)
	return "", ""
}

// A shared checkpoint lets several replicas render: natsKV on a NATS server
// every replica reaches, or the file on a ReadWriteMany PVC. Without several
// replicas (or without leader election) the file checkpoint renders on a
// PVC, which one pod at a time mounts (strategy Recreate), or on an emptyDir
// when asked. The natsKV checkpoint (on a NATS server outside the pod) needs
// no claim; that of an embedded nats-server lives in the data directory.
func TestChartLeaderElectionWithASharedCheckpointRenders(t *testing.T) {
	t.Parallel()
	embedded := strings.Replace(chartNATSConfig, `{url: "nats://nats.nats.svc:4222", jetstream: true}`, "{embedded: true, jetstream: true}", 1)
	cases := []struct {
		name, values string
		replicas     float64
		leaderElect  bool
		accessMode   string // of the PVC; "" = no PVC
		strategy     string
		data         string
	}{
		{"natsKV", "replicas: 2\n" + chartNATSConfig + "  checkpoint: {natsKV: {sink: bus, bucket: kubebridge}}\n", 2, true, "", "RollingUpdate", "emptyDir:1Gi"},
		{"natsKV with persistence", "replicas: 3\npersistence: {enabled: true}\n" + chartNATSConfig + "  checkpoint: {natsKV: {sink: bus}}\n", 3, true, "", "RollingUpdate", "emptyDir:1Gi"},
		{"natsKV on an embedded nats-server", embedded + "  checkpoint: {natsKV: {sink: bus}}\n", 1, true, "ReadWriteOnce", "Recreate", "pvc:kb-data"},
		{"file on a ReadWriteMany PVC", "replicas: 2\npersistence: {accessMode: ReadWriteMany}\n" + chartNATSConfig, 2, true, "ReadWriteMany", "RollingUpdate", "pvc:kb-data"},
		{"one replica with the file on an emptyDir", "replicas: 1\npersistence: {enabled: false, emptyDirSizeLimit: 300Mi}\n" + chartNATSConfig, 1, true, "", "RollingUpdate", "emptyDir:300Mi"},
		{"one replica with the file on a ReadWriteOnce PVC", "persistence: {enabled: true}\n" + chartNATSConfig, 1, true, "ReadWriteOnce", "Recreate", "pvc:kb-data"},
		{"one replica with the file on a ReadWriteMany PVC", "persistence: {accessMode: ReadWriteMany}\n" + chartNATSConfig, 1, true, "ReadWriteMany", "RollingUpdate", "pvc:kb-data"},
		{"leader election off", "leaderElection: {enabled: false}\n" + chartNATSConfig, 1, false, "ReadWriteOnce", "Recreate", "pvc:kb-data"},
		{"leader election off on a ReadWriteMany PVC", "leaderElection: {enabled: false}\npersistence: {accessMode: ReadWriteMany}\n" + chartNATSConfig, 1, false, "ReadWriteMany", "Recreate", "pvc:kb-data"},
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
			if strategy, data := storage(t, dep); strategy != c.strategy || data != c.data {
				t.Errorf("strategy %s, data volume %s; want %s, %s", strategy, data, c.strategy, c.data)
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
	// A checkpoint file off the data volume would not survive the pod (or
	// not be writable at all: the root filesystem is read-only).
	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "config.checkpoint.file=/tmp/state.db")
	if want := `config.checkpoint.file "/tmp/state.db" is not on the data volume: put it under /var/lib/kubebridge/`; err == nil || !strings.Contains(out, want) {
		t.Errorf("checkpoint file in /tmp: err = %v, want %q\n%s", err, want, out)
	}
	if out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "config.checkpoint.file=/var/lib/kubebridge/kb/state.db"); err != nil {
		t.Errorf("checkpoint file on the data volume: %v\n%s", err, out)
	}
}

// installNotes returns the NOTES part of helm's output.
func installNotes(t *testing.T, out string) string {
	t.Helper()
	i := strings.Index(out, "NOTES:")
	if i < 0 {
		t.Fatalf("helm printed no NOTES:\n%s", out)
	}
	return out[i:]
}

const emptyDirWarning = `WARNING: persistence.enabled=false: the file checkpoint is on an emptyDir, which a pod
does not hand to its replacement. Every restart on a new pod (helm upgrade, config change,
node drain, eviction) starts from an empty checkpoint: it re-sends the whole view as added, under
new ids, and the objects deleted while the pod was replaced are never delivered as deleted.`

// The default values render, safely: one replica with leader election and
// the file checkpoint on a ReadWriteOnce PVC, replaced with strategy
// Recreate. The notes say there is no failover and warn only when the
// checkpoint is on an emptyDir (persistence.enabled=false).
func TestChartDefaultValuesRender(t *testing.T) {
	t.Parallel()
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
	if strategy, data := storage(t, dep); strategy != "Recreate" || data != "pvc:kb-data" {
		t.Errorf("default strategy %s, data volume %s; want Recreate on the PVC kb-data", strategy, data)
	}
	if pvc := renderedDoc(t, out, "PersistentVolumeClaim"); pvc == nil || fmt.Sprint(pvc["spec"]) != "map[accessModes:[ReadWriteOnce] resources:map[requests:map[storage:1Gi]]]" {
		t.Errorf("default PVC: %v", pvc)
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
		return installNotes(t, out)
	}
	const noFailover = "NOTE: one replica: no failover."
	if got := notes(); !strings.Contains(got, noFailover) || !strings.Contains(got, "the replacement resumes from the checkpoint on the PVC") || strings.Contains(got, "WARNING") {
		t.Errorf("default install notes: want the no-failover note and no warning:\n%s", got)
	}
	if got := notes("--set", "persistence.enabled=false"); !strings.Contains(got, emptyDirWarning) || !strings.Contains(got, noFailover) {
		t.Errorf("notes without persistence lack the emptyDir warning:\n%s", got)
	}
	if got := notes("--set", "persistence.enabled=false", "-f", chartValues(t, strings.Replace(chartNATSConfig, `{url: "nats://nats.nats.svc:4222", jetstream: true}`, "{embedded: true, jetstream: true}", 1)+"  checkpoint: {natsKV: {sink: bus}}\n")); !strings.Contains(got, "WARNING: persistence.enabled=false: the embedded nats-server's KV checkpoint is on an emptyDir") {
		t.Errorf("notes for an embedded KV on an emptyDir lack the warning:\n%s", got)
	}
	if got := notes("-f", chartValues(t, chartNATSConfig+"  checkpoint: {natsKV: {sink: bus}}\n")); strings.Contains(got, "WARNING") || strings.Contains(got, noFailover) {
		t.Errorf("notes with natsKV warn:\n%s", got)
	}
	if got := notes("--set", "persistence.enabled=false", "-f", chartValues(t, chartNATSConfig+"  checkpoint: {natsKV: {sink: bus}}\n")); strings.Contains(got, "WARNING") {
		t.Errorf("notes with natsKV and no persistence warn:\n%s", got)
	}
	if got := notes("--set", "leaderElection.enabled=false"); strings.Contains(got, "WARNING") || strings.Contains(got, noFailover) {
		t.Errorf("notes without leader election warn:\n%s", got)
	}
}

// Installed into the real apiserver (which validates every object), the
// default values keep the checkpoint across pod replacement: a PVC mounted
// at the data directory, the Deployment replaced with strategy Recreate, a
// NetworkPolicy, every emptyDir with a sizeLimit. An upgrade from a release
// on an emptyDir (which rolled) to the defaults is accepted (the rolling
// parameters are dropped, with server-side and client-side apply), and back. The natsKV
// checkpoint installs without a claim; persistence.enabled=false installs an
// emptyDir with its sizeLimit, and the install notes warn. Every variant
// passes kubectl apply --dry-run=server --validate=strict.
func TestChartDefaultInstallKeepsItsCheckpoint(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	kc, err := cp.Kubeconfig(t.TempDir())
	must(t, err)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "kb-storage"
	install := func(verb, release string, values ...string) string {
		t.Helper()
		args := []string{verb, release, chartDir, "--namespace", ns, "--create-namespace", "--kubeconfig", kc}
		if verb == "upgrade" {
			args = append(args, "--reset-values") // (without values, helm would keep the last ones)
		}
		for _, v := range values {
			if strings.HasPrefix(v, "--") {
				args = append(args, v)
				continue
			}
			args = append(args, "-f", chartValues(t, v))
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm %s %s: %v\n%s", verb, release, err, out)
		}
		return out
	}
	deployed := func(release string) (strategy, data, tmp string, pvcs []string) {
		t.Helper()
		dep, err := cs.AppsV1().Deployments(ns).Get(ctx, release, metav1.GetOptions{})
		must(t, err)
		strategy = string(dep.Spec.Strategy.Type)
		if dep.Spec.Strategy.RollingUpdate != nil {
			strategy += fmt.Sprintf("(maxSurge %v, maxUnavailable %v)", dep.Spec.Strategy.RollingUpdate.MaxSurge, dep.Spec.Strategy.RollingUpdate.MaxUnavailable)
		}
		for _, v := range dep.Spec.Template.Spec.Volumes {
			desc := "?"
			switch {
			case v.PersistentVolumeClaim != nil:
				desc = "pvc:" + v.PersistentVolumeClaim.ClaimName
			case v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil:
				desc = "emptyDir:" + v.EmptyDir.SizeLimit.String()
			case v.EmptyDir != nil:
				desc = "emptyDir without sizeLimit"
			}
			switch v.Name {
			case "data":
				data = desc
			case "tmp":
				tmp = desc
			}
		}
		for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
			if m.Name == "data" && m.MountPath != "/var/lib/kubebridge" {
				t.Errorf("data volume mounted at %s", m.MountPath)
			}
		}
		list, err := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		must(t, err)
		for _, p := range list.Items {
			pvcs = append(pvcs, fmt.Sprintf("%s %v %s", p.Name, p.Spec.AccessModes, p.Spec.Resources.Requests.Storage()))
		}
		return strategy, data, tmp, pvcs
	}

	// A release as the chart made it before: the checkpoint on an emptyDir,
	// a rolling update (with the apiserver's defaults).
	out := install("install", "kbkeep", "persistence: {enabled: false}\n")
	if got := installNotes(t, out); !strings.Contains(got, emptyDirWarning) {
		t.Errorf("install notes with persistence.enabled=false lack the warning:\n%s", got)
	}
	if strategy, data, tmp, pvcs := deployed("kbkeep"); strategy != "RollingUpdate(maxSurge 25%, maxUnavailable 25%)" || data != "emptyDir:1Gi" || tmp != "emptyDir:256Mi" || pvcs != nil {
		t.Errorf("persistence.enabled=false: strategy %s, data %s, tmp %s, claims %v", strategy, data, tmp, pvcs)
	}
	// Upgraded to the defaults: the claim, strategy Recreate.
	out = install("upgrade", "kbkeep")
	if got := installNotes(t, out); strings.Contains(got, "WARNING") {
		t.Errorf("default notes warn:\n%s", got)
	}
	if strategy, data, tmp, pvcs := deployed("kbkeep"); strategy != "Recreate" || data != "pvc:kbkeep-data" || tmp != "emptyDir:256Mi" || fmt.Sprint(pvcs) != "[kbkeep-data [ReadWriteOnce] 1Gi]" {
		t.Errorf("defaults: strategy %s, data %s, tmp %s, claims %v; want Recreate on the claim kbkeep-data", strategy, data, tmp, pvcs)
	}
	np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, "kbkeep", metav1.GetOptions{})
	must(t, err)
	if got := fmt.Sprintf("%v ingress %d rule(s), ports %v from %v, egress %v", np.Spec.PolicyTypes, len(np.Spec.Ingress), np.Spec.Ingress[0].Ports[0].Port, np.Spec.Ingress[0].From, np.Spec.Egress); got != "[Ingress] ingress 1 rule(s), ports 8080 from [], egress []" {
		t.Errorf("default NetworkPolicy: %s", got)
	}
	// And back (a rolling update again, with a new emptyDir).
	install("upgrade", "kbkeep", "persistence: {enabled: false, emptyDirSizeLimit: 300Mi}\ntmpSizeLimit: 64Mi\n")
	if strategy, data, tmp, _ := deployed("kbkeep"); strategy != "RollingUpdate(maxSurge 25%, maxUnavailable 25%)" || data != "emptyDir:300Mi" || tmp != "emptyDir:64Mi" {
		t.Errorf("back to an emptyDir: strategy %s, data %s, tmp %s", strategy, data, tmp)
	}

	// The same with client-side apply (helm 3, or --server-side=false): the
	// rolling parameters are dropped too.
	install("install", "kbcsa", "persistence: {enabled: false}\n", "--server-side=false")
	install("upgrade", "kbcsa")
	if strategy, data, _, _ := deployed("kbcsa"); strategy != "Recreate" || data != "pvc:kbcsa-data" {
		t.Errorf("client-side upgrade to the defaults: strategy %s, data %s; want Recreate on the claim kbcsa-data", strategy, data)
	}

	// The natsKV checkpoint on a NATS server outside the pod: no claim.
	// Its credentials come from a Secret, whose directory is the one allowed.
	install("install", "kbkv", chartNATSConfig+"  checkpoint: {natsKV: {sink: bus, bucket: kubebridge}}\n"+
		"secretMounts: [{secretName: nats-creds, mountPath: /etc/kubebridge/nats}]\n")
	if strategy, data, tmp, pvcs := deployed("kbkv"); !strings.HasPrefix(strategy, "RollingUpdate") || data != "emptyDir:1Gi" || tmp != "emptyDir:256Mi" || pvcs != nil {
		t.Errorf("natsKV: strategy %s, data %s, tmp %s, claims %v; want no claim", strategy, data, tmp, pvcs)
	}
	dep, err := cs.AppsV1().Deployments(ns).Get(ctx, "kbkv", metav1.GetOptions{})
	must(t, err)
	if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--credential-dirs=/etc/kubebridge/nats") {
		t.Errorf("args %v lack --credential-dirs=/etc/kubebridge/nats", args)
	}
	// Every variant's objects pass the apiserver's strict validation
	// (unknown or misspelt fields refused), as kubectl would apply them.
	for name, values := range map[string]string{
		"defaults":       "",
		"emptyDir":       "persistence: {enabled: false}\n",
		"natsKV":         chartNATSConfig + "  checkpoint: {natsKV: {sink: bus}}\nsecretMounts: [{secretName: nats-creds, mountPath: /etc/kubebridge/nats}]\ncredentialDirs: [/etc/tls]\n",
		"ReadWriteMany":  "replicas: 2\npersistence: {accessMode: ReadWriteMany}\n",
		"network policy": "networkPolicy:\n  metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]\n  egress: [{ports: [{protocol: UDP, port: 53}]}]\n",
	} {
		args := []string{"template", "kbdry", chartDir, "--namespace", ns}
		if values != "" {
			args = append(args, "-f", chartValues(t, values))
		}
		manifests, err := helm(t, args...)
		if err != nil {
			t.Fatalf("%s: helm template: %v\n%s", name, err, manifests)
		}
		apply := exec.Command(testenv.Tool(t, "kubectl"), "apply", "--dry-run=server", "--validate=strict", "--kubeconfig", kc, "-f", "-")
		apply.Stdin = strings.NewReader(manifests)
		if out, err := apply.CombinedOutput(); err != nil {
			t.Errorf("%s: kubectl apply --dry-run=server --validate=strict: %v\n%s", name, err, out)
		}
	}

	for _, r := range []string{"kbkeep", "kbcsa", "kbkv"} {
		if out, err := helm(t, "uninstall", r, "--namespace", ns, "--kubeconfig", kc); err != nil {
			t.Errorf("helm uninstall %s: %v\n%s", r, err, out)
		}
	}
}

// The chart allows credential files in the directories it mounts Secrets
// at, and in credentialDirs (--credential-dirs, each once); with none it
// passes nothing, so the bridge's default applies. The service-account
// directory is refused, as the bridge would; so are relative paths and
// commas, which the flag cannot carry.
func TestChartCredentialDirs(t *testing.T) {
	t.Parallel()
	args := func(t *testing.T, values string) ([]string, string, error) {
		t.Helper()
		out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", chartValues(t, values))
		if err != nil {
			return nil, out, err
		}
		dep := renderedDoc(t, out, "Deployment")
		var got []string
		for _, a := range dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["args"].([]any) {
			if strings.HasPrefix(fmt.Sprint(a), "--credential-dirs") {
				got = append(got, fmt.Sprint(a))
			}
		}
		return got, out, nil
	}
	for _, c := range []struct{ name, values, want string }{
		{"none", "", "[]"},
		{"secret mounts", "secretMounts:\n  - {secretName: nats-creds, mountPath: /etc/kubebridge/nats}\n  - {secretName: hook-token, mountPath: /etc/kubebridge/hook/}\n",
			"[--credential-dirs=/etc/kubebridge/nats,/etc/kubebridge/hook]"},
		{"secret mounts and credentialDirs", "secretMounts:\n  - {secretName: nats-creds, mountPath: /etc/kubebridge/nats}\ncredentialDirs: [/etc/tls, /etc/kubebridge/nats]\n",
			"[--credential-dirs=/etc/kubebridge/nats,/etc/tls]"},
		{"credentialDirs only", "credentialDirs: [/etc/kb creds]\n", "[--credential-dirs=/etc/kb creds]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, out, err := args(t, c.values)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			if fmt.Sprint(got) != c.want {
				t.Errorf("args %v, want %s", got, c.want)
			}
		})
	}
	for _, c := range []struct{ name, values, want string }{
		{"the service-account directory", "credentialDirs: [/var/run/secrets/kubernetes.io/serviceaccount]\n",
			`credential directory "/var/run/secrets/kubernetes.io/serviceaccount" is in the service-account directory /var/run/secrets/kubernetes.io/serviceaccount, whose token would let whoever edits the config read what the bridge may read`},
		{"inside the service-account directory", "secretMounts:\n  - {secretName: x, mountPath: /run/secrets/kubernetes.io/serviceaccount/x}\n",
			`credential directory "/run/secrets/kubernetes.io/serviceaccount/x" is in the service-account directory /run/secrets/kubernetes.io/serviceaccount`},
		{"a relative directory", "credentialDirs: [etc/creds]\n", "credentialDirs"},
		{"a comma", "secretMounts:\n  - {secretName: x, mountPath: \"/etc/a,b\"}\n", "mountPath"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, out, err := args(t, c.values)
			if err == nil || !strings.Contains(out, c.want) {
				t.Errorf("err = %v, want a failure with %q\n%s", err, c.want, out)
			}
		})
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

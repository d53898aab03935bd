package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
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
	examples, _ := filepath.Glob("../../config/*.yaml")
	for _, f := range examples {
		data, err := os.ReadFile(f)
		must(t, err)
		cases[filepath.Base(f)] = valuesFor(t, data, t.TempDir())
	}
	for name, values := range cases {
		args := []string{"template", "kb", chartDir, "--namespace", "kb-system"}
		if values != "" {
			args = append(args, "-f", values)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Errorf("%s: helm template: %v\n%s", name, err, out)
			continue
		}
		rendered := renderedConfig(t, out)
		if _, _, err := config.Parse(name, []byte(rendered)); err != nil {
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

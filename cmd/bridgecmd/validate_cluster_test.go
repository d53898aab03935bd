package bridgecmd

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

const clusterConfig = `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: test
sinks:
  - name: archive
    file: {path: "-"}
rules:
  - name: widgets
    resource: example.kubebridge.io/v1/widgets
    namespaces: [validate-prod]
    sinks: [archive]
  - name: configmaps
    resource: v1/configmaps
    sinks: [archive]
  - name: labelled
    resource: v1/configmaps
    namespaceSelector: env=prod
    sinks: [archive]
`

// bridge validate --kubeconfig against the real apiserver: a config that
// watches a CRD's resources and ConfigMaps passes as admin, and fails as a
// ServiceAccount lacking watch, naming the RBAC rule that would grant it;
// granting exactly that makes it pass.
func TestValidateAgainstCluster(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	ctx := context.Background()
	testenv.InstallWidgetCRD(t, cp)
	testenv.EnsureNamespace(t, cp, "validate-prod")
	widget := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.kubebridge.io/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1", "namespace": "validate-prod"},
		"spec":     map[string]any{"size": 3},
	}}
	if _, err := dyn.Resource(testenv.WidgetGVR).Namespace("validate-prod").Create(ctx, widget, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "c1", "namespace": "validate-prod"},
		"data":     map[string]any{"k": "v"},
	}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("validate-prod").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	admin, err := cp.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "cluster.yaml", clusterConfig)

	t.Run("admin passes", func(t *testing.T) {
		r := runBridge(t, "validate", "--config", cfg, "--kubeconfig", admin)
		want := cfg + " is valid and checked against " + cp.Host + ": cluster test, 1 sink (archive), 3 rules (widgets, configmaps, labelled)\n"
		if r.code != 0 || r.stdout != want || r.stderr != "" {
			t.Errorf("got %+v\nwant stdout %q", r, want)
		}
	})

	t.Run("resources the cluster does not serve", func(t *testing.T) {
		bad := writeFile(t, "bad.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: test
sinks:
  - name: archive
    file: {path: "-"}
rules:
  - name: gadgets
    resource: example.kubebridge.io/v1/gadgets
    sinks: [archive]
  - name: widgets-v2
    resource: example.kubebridge.io/v2/widgets
    sinks: [archive]
  - name: namespaces
    resource: v1/namespaces
    namespaces: [default]
    sinks: [archive]
`)
		r := runBridge(t, "validate", "--config", bad, "--kubeconfig", admin)
		want := []string{
			// A CRD's resource not served is the cluster's state: the rule
			// waits for it (a warning); a misplaced setting is a mistake.
			bad + `:9: warning: rules[0].resource: the cluster has no resource "gadgets" in example.kubebridge.io/v1 (have: widgets); the rule waits for it (the other rules run)`,
			bad + `:12: warning: rules[1].resource: the cluster does not serve example.kubebridge.io/v2 (is the CRD installed?); the rule waits for it (the other rules run)`,
			bad + `:16: rules[2].namespaces: v1/namespaces is cluster-scoped; namespaces do not apply`,
			"bridge: " + bad + " does not fit the cluster at " + cp.Host + " (1 error)",
		}
		if r.code != 2 || r.stderr != strings.Join(want, "\n")+"\n" {
			t.Errorf("exit %d, stderr:\n%s\nwant:\n%s", r.code, r.stderr, strings.Join(want, "\n"))
		}
		// Warnings alone: valid.
		waits := writeFile(t, "waits.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: test
sinks:
  - name: archive
    file: {path: "-"}
rules:
  - name: gadgets
    resource: example.kubebridge.io/v1/gadgets
    sinks: [archive]
`)
		r = runBridge(t, "validate", "--config", waits, "--kubeconfig", admin)
		if r.code != 0 || !strings.Contains(r.stderr, "warning: rules[0].resource") {
			t.Errorf("only a waiting rule: exit %d, stderr %q; want 0 with the warning", r.code, r.stderr)
		}
	})

	t.Run("service account without watch", func(t *testing.T) {
		sa := cp.ServiceAccountKubeconfig(t, "validate-prod", "limited")
		// list but not watch on widgets, in the rule's namespace only.
		cp.Grant(t, "validate-prod", "limited", "validate-widgets-list", "validate-prod",
			rbacv1.PolicyRule{APIGroups: []string{"example.kubebridge.io"}, Resources: []string{"widgets"}, Verbs: []string{"get", "list"}})
		const id = `"system:serviceaccount:validate-prod:limited"`
		want := []string{
			cfg + `:8: rules[0]: ` + id + ` may not watch widgets.example.kubebridge.io in namespace "validate-prod"; grant it with a Role rule {apiGroups: ["example.kubebridge.io"], resources: ["widgets"], verbs: ["watch"]} and a RoleBinding in "validate-prod"`,
			cfg + `:12: rules[1]: ` + id + ` may not list or watch configmaps in all namespaces; grant it with a ClusterRole rule {apiGroups: [""], resources: ["configmaps"], verbs: ["list", "watch"]} and a ClusterRoleBinding`,
			cfg + `:15: rules[2]: ` + id + ` may not list or watch configmaps in all namespaces; grant it with a ClusterRole rule {apiGroups: [""], resources: ["configmaps"], verbs: ["list", "watch"]} and a ClusterRoleBinding`,
			cfg + `:17: rules[2].namespaceSelector: ` + id + ` may not list or watch namespaces in all namespaces; grant it with a ClusterRole rule {apiGroups: [""], resources: ["namespaces"], verbs: ["list", "watch"]} and a ClusterRoleBinding`,
			"bridge: " + cfg + " does not fit the cluster at " + cp.Host + " (4 errors)",
		}
		var r result
		// RBAC reaches the authorizer through an informer: allow it a moment.
		testenv.Eventually(t, 15*time.Second, "the widgets list grant to take effect", func() bool {
			r = runBridge(t, "validate", "--config", cfg, "--kubeconfig", sa)
			return r.stderr == strings.Join(want, "\n")+"\n"
		})
		if r.code != 2 {
			t.Errorf("exit %d, want 2", r.code)
		}

		// Grant exactly what the messages asked for; then it passes.
		cp.Grant(t, "validate-prod", "limited", "validate-widgets-watch", "validate-prod",
			rbacv1.PolicyRule{APIGroups: []string{"example.kubebridge.io"}, Resources: []string{"widgets"}, Verbs: []string{"watch"}})
		cp.Grant(t, "validate-prod", "limited", "validate-cluster-watch", "",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}})
		testenv.Eventually(t, 15*time.Second, "validate to pass after the grants", func() bool {
			r = runBridge(t, "validate", "--config", cfg, "--kubeconfig", sa)
			return r.code == 0
		})
		if r.stderr != "" || !strings.Contains(r.stdout, " is valid and checked against ") {
			t.Errorf("after grants: %+v", r)
		}
	})

	t.Run("owners need list and watch on their resources", func(t *testing.T) {
		owners := writeFile(t, "owners.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: test
sinks:
  - name: archive
    file: {path: "-"}
rules:
  - name: jobs
    resource: batch/v1/jobs
    namespaces: [validate-prod]
    include: [owners]
    sinks: [archive]
`)
		sa := cp.ServiceAccountKubeconfig(t, "validate-prod", "jobs-only")
		cp.Grant(t, "validate-prod", "jobs-only", "validate-jobs", "validate-prod",
			rbacv1.PolicyRule{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"list", "watch"}})
		const id = `"system:serviceaccount:validate-prod:jobs-only"`
		want := owners + `:11: rules[0].include: rule jobs includes owners, which reads CronJob objects: ` + id + ` may not list or watch cronjobs.batch in namespace "validate-prod"; grant it with a Role rule {apiGroups: ["batch"], resources: ["cronjobs"], verbs: ["list", "watch"]} and a RoleBinding in "validate-prod"` + "\n" +
			"bridge: " + owners + " does not fit the cluster at " + cp.Host + " (1 error)\n"
		var r result
		testenv.Eventually(t, 15*time.Second, "the jobs grant to take effect", func() bool {
			r = runBridge(t, "validate", "--config", owners, "--kubeconfig", sa)
			return r.stderr == want
		})
		if r.code != 2 {
			t.Errorf("exit %d, stderr %s", r.code, r.stderr)
		}
	})
}

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/owners"
	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// The chart's RBAC is least privilege, per resource and scope: this is the
// mix of rules that used to put everything into one ClusterRole (a Secrets
// rule limited to one namespace next to a cluster-wide rule).
const rbacNS = "kbr-system" // the release's namespace; the release is "kbr"

var (
	nsA, nsB, nsC = "kbr-a", "kbr-b", "kbr-c"
	mixedRules    = fmt.Sprintf(`
config:
  cluster: e2e
  sinks:
    - name: out
      file: {path: "-"}
  rules:
    - {name: secrets-a, resource: v1/secrets, namespaces: [%[1]s], sinks: [out]}
    - {name: deploys, resource: apps/v1/deployments, sinks: [out]}
    - {name: cms, resource: v1/configmaps, namespaces: [%[1]s, %[2]s], sinks: [out]}
    - {name: prod-services, resource: v1/services, namespaceSelector: "env=prod", sinks: [out]}
    - {name: jobs-c, resource: batch/v1/jobs, namespaces: [%[3]s], include: [metadata, owners], sinks: [out]}
`, nsA, nsB, nsC)
)

// access is one SubjectAccessReview question.
type access struct {
	verb, group, resource, namespace, name string
}

func (a access) String() string {
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	what := a.resource
	if a.group != "" {
		what += "." + a.group
	}
	if a.name != "" {
		what += "/" + a.name
	}
	return fmt.Sprintf("%s %s %s", a.verb, what, where)
}

// allowed asks the apiserver, as the admin, whether the ServiceAccount
// namespace/name (with the groups the apiserver gives a ServiceAccount token)
// may do a.
func allowed(t *testing.T, cp *testenv.ControlPlane, saNamespace, saName string, a access) bool {
	t.Helper()
	review := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + saNamespace + ":" + saName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.namespace, Name: a.name,
		},
	}}
	res, err := cp.Clientset(t).AuthorizationV1().SubjectAccessReviews().Create(context.Background(), review, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", a, err)
	}
	return res.Status.Allowed
}

// helm install into the real apiserver with mixed rules, then ask the
// apiserver (SubjectAccessReview) what the chart's ServiceAccount may do:
// each rule's resource in exactly its rule's scope, the Lease by its name,
// the reviews the admin API needs, and nothing else. Then the bridge runs
// with that identity, as the leader.
func TestChartRBACLeastPrivilege(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	for _, ns := range []string{nsA, nsB, nsC} {
		testenv.EnsureNamespace(t, cp, ns)
	}
	dir := t.TempDir()
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	values := chartValues(t, mixedRules+`
networkPolicy:
  enabled: true
  metricsFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
      podSelector: {matchLabels: {app.kubernetes.io/name: prometheus}}
`)
	if out, err := helm(t, "install", "kbr", chartDir, "--namespace", rbacNS, "--create-namespace", "-f", values, "--kubeconfig", kc); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := helm(t, "uninstall", "kbr", "--namespace", rbacNS, "--kubeconfig", kc); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
	})

	var want, deny []access
	for _, verb := range []string{"list", "watch"} {
		want = append(want,
			access{verb, "", "secrets", nsA, ""},
			access{verb, "apps", "deployments", "", ""},
			access{verb, "apps", "deployments", nsC, ""},
			access{verb, "", "configmaps", nsA, ""},
			access{verb, "", "configmaps", nsB, ""},
			access{verb, "", "services", "", ""}, // namespaceSelector: all namespaces
			access{verb, "", "namespaces", "", ""},
			access{verb, "batch", "jobs", nsC, ""},
			access{verb, "batch", "cronjobs", nsC, ""}, // jobs-c's owners
		)
		deny = append(deny,
			access{verb, "", "secrets", nsB, ""},
			access{verb, "", "secrets", nsC, ""},
			access{verb, "", "secrets", rbacNS, ""},
			access{verb, "", "secrets", "", ""},
			access{verb, "", "configmaps", nsC, ""},
			access{verb, "", "configmaps", "", ""},
			access{verb, "", "pods", nsA, ""},
			access{verb, "", "pods", "", ""},
			access{verb, "batch", "cronjobs", nsA, ""},
			access{verb, "batch", "cronjobs", "", ""},
		)
	}
	want = append(want,
		access{"get", "coordination.k8s.io", "leases", rbacNS, "kbr"},
		access{"update", "coordination.k8s.io", "leases", rbacNS, "kbr"},
		access{"create", "coordination.k8s.io", "leases", rbacNS, ""},
		access{"create", "authentication.k8s.io", "tokenreviews", "", ""},
		access{"create", "authorization.k8s.io", "subjectaccessreviews", "", ""},
	)
	deny = append(deny,
		access{"get", "coordination.k8s.io", "leases", rbacNS, "another-lease"},
		access{"update", "coordination.k8s.io", "leases", rbacNS, "another-lease"},
		access{"list", "coordination.k8s.io", "leases", rbacNS, ""},
		access{"delete", "coordination.k8s.io", "leases", rbacNS, "kbr"},
		access{"get", "coordination.k8s.io", "leases", nsA, "kbr"},
		access{"create", "coordination.k8s.io", "leases", nsA, ""},
		access{"update", "apps", "deployments", nsA, ""},
	)

	// RBAC reaches the authorizer through its informers: wait until every
	// grant is visible, then the refusals mean something.
	testenv.Await(t, 30*time.Second, 200*time.Millisecond, func() error {
		var missing []string
		for _, a := range want {
			if !allowed(t, cp, rbacNS, "kbr", a) {
				missing = append(missing, a.String())
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("the chart's ServiceAccount may not:\n  %s", strings.Join(missing, "\n  "))
		}
		return nil
	})
	for _, a := range deny {
		if allowed(t, cp, rbacNS, "kbr", a) {
			t.Errorf("the chart's ServiceAccount may %s", a)
		}
	}

	// The NetworkPolicy the apiserver accepted admits the scraper to the admin port only.
	np, err := cp.Clientset(t).NetworkingV1().NetworkPolicies(rbacNS).Get(context.Background(), "kbr", metav1.GetOptions{})
	must(t, err)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[0].Ports) != 1 ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != 8080 || np.Spec.Ingress[0].From[0].NamespaceSelector == nil ||
		np.Spec.Ingress[0].From[0].PodSelector == nil || fmt.Sprint(np.Spec.PolicyTypes) != "[Ingress]" {
		t.Errorf("NetworkPolicy spec = %+v", np.Spec)
	}

	// As that identity the bridge starts with these rules and leads on the
	// chart's Lease (get, create, update by name are all it needs).
	var doc struct {
		Config map[string]any `yaml:"config"`
	}
	must(t, yaml.Unmarshal([]byte(mixedRules), &doc))
	doc.Config["apiVersion"], doc.Config["kind"] = "kubebridge.io/v1alpha1", "BridgeConfig"
	doc.Config["sinks"] = []any{map[string]any{"name": "out", "file": map[string]any{"path": filepath.Join(dir, "events.jsonl")}}}
	cfg, err := yaml.Marshal(doc.Config)
	must(t, err)
	sa := cp.ServiceAccountKubeconfig(t, rbacNS, "kbr")
	b, err := tryStartBridge(t, cp, string(cfg), withKubeconfig(sa), withLogLevel("info"), withFlags("--reload=false"),
		withLeaderElection(rbacNS, "kbr"), withReadyLog("became the leader"))
	if err != nil {
		t.Fatalf("the bridge did not lead as the chart's ServiceAccount: %v", err)
	}
	b.halt() // a clean exit, then:
	if strings.Contains(b.log(), "forbidden") {
		t.Errorf("the bridge was refused something:\n%s", b.log())
	}
}

// policyRules is a rendered Role's or ClusterRole's rules as
// "<group>: <resources> [<verbs>]" (with "/<names>" when restricted).
func policyRules(doc map[string]any) []string {
	var out []string
	rules, _ := doc["rules"].([]any)
	for _, r := range rules {
		m := r.(map[string]any)
		s := fmt.Sprintf("%q: %s %v", join(m["apiGroups"]), join(m["resources"]), m["verbs"])
		if names := join(m["resourceNames"]); names != "" {
			s += " /" + names
		}
		out = append(out, s)
	}
	return out
}

func join(v any) string {
	items, _ := v.([]any)
	var s []string
	for _, i := range items {
		s = append(s, fmt.Sprint(i))
	}
	return strings.Join(s, ",")
}

// renderedDocs returns every rendered manifest of kind, by namespace/name.
func renderedDocs(t *testing.T, manifests, kind string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	dec := yaml.NewDecoder(strings.NewReader(manifests))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			return out
		}
		if doc["kind"] == kind {
			meta := doc["metadata"].(map[string]any)
			ns, _ := meta["namespace"].(string)
			out[ns+"/"+fmt.Sprint(meta["name"])] = doc
		}
	}
}

// The rendered RBAC lists each resource in exactly its rules' scope: a Role
// per named namespace with what the rules need there, the ClusterRole with
// the cluster-wide rules' resources, namespaces (namespaceSelector) and the
// reviews of the admin API; the Lease Role names the Lease.
func TestChartRBACRenderedScopes(t *testing.T) {
	t.Parallel()
	out, err := helm(t, "template", "kbr", chartDir, "--namespace", rbacNS, "-f", chartValues(t, mixedRules+"leaderElection: {leaseName: kbr-leader}\n"))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	wantRoles := map[string][]string{
		nsA + "/kbr": {`"": configmaps,secrets [list watch]`},
		nsB + "/kbr": {`"": configmaps [list watch]`},
		nsC + "/kbr": {`"batch": cronjobs,jobs [list watch]`},
		rbacNS + "/kbr-leader-election": {
			`"coordination.k8s.io": leases [create]`,
			`"coordination.k8s.io": leases [get update] /kbr-leader`,
		},
	}
	roles := renderedDocs(t, out, "Role")
	if len(roles) != len(wantRoles) {
		t.Errorf("rendered Roles %v, want %d", slices.Sorted(maps.Keys(roles)), len(wantRoles))
	}
	for key, want := range wantRoles {
		if got := policyRules(roles[key]); !slices.Equal(got, want) {
			t.Errorf("Role %s rules:\n  %s\nwant:\n  %s", key, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	cr := renderedDocs(t, out, "ClusterRole")
	wantCR := []string{
		`"": services [list watch]`,
		`"apps": deployments [list watch]`,
		`"": namespaces [list watch]`,
		`"authentication.k8s.io": tokenreviews [create]`,
		`"authorization.k8s.io": subjectaccessreviews [create]`,
	}
	if got := policyRules(cr["/kbr-"+rbacNS]); !slices.Equal(got, wantCR) {
		t.Errorf("ClusterRole rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(wantCR, "\n  "))
	}
	if !strings.Contains(out, "- --leader-elect-name=kbr-leader\n") {
		t.Errorf("the Deployment does not name the Lease kbr-leader:\n%s", out)
	}

	// Only namespaced rules: the ClusterRole holds the reviews alone.
	out, err = helm(t, "template", "kbr", chartDir, "--namespace", rbacNS)
	if err != nil {
		t.Fatalf("helm template with the defaults: %v\n%s", err, out)
	}
	wantCR = []string{`"authentication.k8s.io": tokenreviews [create]`, `"authorization.k8s.io": subjectaccessreviews [create]`}
	if got := policyRules(renderedDocs(t, out, "ClusterRole")["/kbr-"+rbacNS]); !slices.Equal(got, wantCR) {
		t.Errorf("default ClusterRole rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(wantCR, "\n  "))
	}

	// A route that reads namespaces' labels: namespaces cluster-wide, the
	// rule's resource in its namespace only.
	out, err = helm(t, "template", "kbr", chartDir, "--namespace", rbacNS, "-f", chartValues(t, fmt.Sprintf(`
config:
  cluster: e2e
  sinks: [{name: a, file: {path: "-"}}, {name: b, file: {path: "-"}}]
  rules:
    - {name: routed, resource: v1/configmaps, namespaces: [%s], sinks: [a, b], route: {sink: "namespaceLabels.team", default: a}}
`, nsA)))
	if err != nil {
		t.Fatalf("helm template with a route: %v\n%s", err, out)
	}
	wantCR = append([]string{`"": namespaces [list watch]`}, wantCR...)
	if got := policyRules(renderedDocs(t, out, "ClusterRole")["/kbr-"+rbacNS]); !slices.Equal(got, wantCR) {
		t.Errorf("ClusterRole rules with a route reading namespaceLabels:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(wantCR, "\n  "))
	}
}

// Secrets in every namespace are every Secret of the cluster: the chart
// refuses to render a Secrets rule without namespaces, or with a
// namespaceSelector (which RBAC cannot narrow), saying why and how to opt
// in; rbac.allowClusterWideSecrets=true is that opt-in.
func TestChartRBACRefusesClusterWideSecrets(t *testing.T) {
	t.Parallel()
	const base = `
config:
  cluster: e2e
  sinks: [{name: out, file: {path: "-"}}]
  rules:
    - {name: deploys, resource: apps/v1/deployments, sinks: [out]}
    - {name: cms, resource: v1/configmaps, namespaces: [a, b], sinks: [out]}
`
	const consequence = ": that lets kubebridge read every Secret of the cluster"
	const advice = "Name the namespaces, or set rbac.allowClusterWideSecrets=true"
	cases := []struct {
		name, rule string
		want       []string
		wantCR     []string // ClusterRole rules with the opt-in (before the reviews)
	}{
		{"no namespaces", `    - {name: all-secrets, resource: v1/secrets, sinks: [out]}`,
			[]string{"rules[2] (all-secrets) watches Secrets in every namespace: that lets kubebridge read every Secret of the cluster. " + advice},
			[]string{`"": secrets [list watch]`, `"apps": deployments [list watch]`}},
		{"empty namespaces", `    - {name: all-secrets, resource: v1/secrets, namespaces: [], sinks: [out]}`,
			[]string{"rules[2] (all-secrets) watches Secrets in every namespace" + consequence, advice},
			[]string{`"": secrets [list watch]`, `"apps": deployments [list watch]`}},
		{"namespaceSelector", `    - {name: prod-secrets, resource: v1/secrets, namespaceSelector: "env=prod", sinks: [out]}`,
			[]string{"rules[2] (prod-secrets) watches Secrets in every namespace" + consequence,
				`rules[2] (prod-secrets) has namespaceSelector "env=prod": a namespaceSelector does not narrow RBAC`, advice},
			[]string{`"": secrets [list watch]`, `"apps": deployments [list watch]`, `"": namespaces [list watch]`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			values := chartValues(t, base+c.rule+"\n")
			out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", values)
			if err == nil {
				t.Fatalf("helm template rendered; want a refusal\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("helm output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "kind: ") {
				t.Errorf("manifests printed despite the refusal:\n%s", out)
			}

			out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", values, "--set", "rbac.allowClusterWideSecrets=true")
			if err != nil {
				t.Fatalf("helm template with rbac.allowClusterWideSecrets=true: %v\n%s", err, out)
			}
			want := append(c.wantCR, `"authentication.k8s.io": tokenreviews [create]`, `"authorization.k8s.io": subjectaccessreviews [create]`)
			if got := policyRules(renderedDocs(t, out, "ClusterRole")["/kb-kb-system"]); !slices.Equal(got, want) {
				t.Errorf("ClusterRole rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
			if roles := renderedDocs(t, out, "Role"); strings.Contains(fmt.Sprint(policyRules(roles["a/kb"]), policyRules(roles["b/kb"])), "secrets") {
				t.Errorf("Secrets leaked into a namespace Role: %v", roles)
			}
		})
	}

	// Secrets in named namespaces need no opt-in, and stay there.
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f",
		chartValues(t, base+"    - {name: secrets-a, resource: v1/secrets, namespaces: [a], sinks: [out]}\n"))
	if err != nil {
		t.Fatalf("helm template with Secrets in namespace a: %v\n%s", err, out)
	}
	if got := policyRules(renderedDocs(t, out, "ClusterRole")["/kb-kb-system"]); strings.Contains(strings.Join(got, ";"), "secrets") {
		t.Errorf("Secrets in the ClusterRole: %v", got)
	}
	if got := policyRules(renderedDocs(t, out, "Role")["a/kb"]); !slices.Equal(got, []string{`"": configmaps,secrets [list watch]`}) {
		t.Errorf("Role in a: %v", got)
	}

	// The schema wants a boolean.
	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "rbac.allowClusterWideSecrets=yes-please")
	if err == nil || !strings.Contains(out, "allowClusterWideSecrets") {
		t.Errorf("rbac.allowClusterWideSecrets=yes-please: err = %v, want a schema error naming it\n%s", err, out)
	}
	// A built-in cluster-scoped resource cannot be granted in a namespace.
	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f",
		chartValues(t, base+"    - {name: nodes, resource: v1/nodes, namespaces: [a], sinks: [out]}\n"))
	if err == nil || !strings.Contains(out, "rules[2] (nodes): v1/nodes is cluster-scoped; a rule on it cannot name namespaces") {
		t.Errorf("v1/nodes with namespaces: err = %v, want a refusal\n%s", err, out)
	}
}

// watchesSecretsClusterWide reports whether a BridgeConfig has a v1/secrets
// rule without namespaces or with a namespaceSelector: the chart renders it
// only with rbac.allowClusterWideSecrets=true.
func watchesSecretsClusterWide(t *testing.T, configYAML []byte) bool {
	t.Helper()
	var cfg struct {
		Rules []struct {
			Resource          string   `yaml:"resource"`
			Namespaces        []string `yaml:"namespaces"`
			NamespaceSelector string   `yaml:"namespaceSelector"`
		} `yaml:"rules"`
	}
	must(t, yaml.Unmarshal(configYAML, &cfg))
	for _, r := range cfg.Rules {
		if r.Resource == "v1/secrets" && (len(r.Namespaces) == 0 || r.NamespaceSelector != "") {
			return true
		}
	}
	return false
}

// The example that watches Secrets by namespaceSelector is refused without
// the opt-in (TestChartRendersEveryExample renders it with it).
func TestChartRBACExampleSecretsNeedTheOptIn(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../config/secrets-redacted.yaml")
	must(t, err)
	if !watchesSecretsClusterWide(t, data) {
		t.Skip("config/secrets-redacted.yaml no longer watches Secrets cluster-wide")
	}
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", valuesFor(t, data, t.TempDir()))
	if err == nil || !strings.Contains(out, "rbac.allowClusterWideSecrets=true") {
		t.Errorf("secrets-redacted.yaml rendered without rbac.allowClusterWideSecrets: err = %v\n%s", err, out)
	}
}

// The container is locked down at its own level (whatever the pod's
// securityContext says), with a writable /tmp beside the read-only root;
// allowSecretData adds --allow-secret-data; the NetworkPolicy is on by
// default: ingress only to the admin port (from anywhere, so that
// Prometheus and probes reach it; from metricsFrom when set), egress open (the
// apiserver, DNS and sinks stay reachable) unless egress lists rules.
func TestChartSecurityContextAndNetworkPolicy(t *testing.T) {
	t.Parallel()
	out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "podSecurityContext=null")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	dep := renderedDoc(t, out, "Deployment")
	pod := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	ctr := pod["containers"].([]any)[0].(map[string]any)
	sc, _ := ctr["securityContext"].(map[string]any)
	for key, want := range map[string]string{
		"runAsNonRoot":             "true",
		"allowPrivilegeEscalation": "false",
		"readOnlyRootFilesystem":   "true",
		"capabilities":             "map[drop:[ALL]]",
		"seccompProfile":           "map[type:RuntimeDefault]",
	} {
		if got := fmt.Sprint(sc[key]); got != want {
			t.Errorf("container securityContext.%s = %s, want %s", key, got, want)
		}
	}
	if !strings.Contains(fmt.Sprint(ctr["volumeMounts"]), "mountPath:/tmp") || !strings.Contains(fmt.Sprint(pod["volumes"]), "emptyDir:map[sizeLimit:256Mi] name:tmp") {
		t.Errorf("no emptyDir at /tmp: mounts %v, volumes %v", ctr["volumeMounts"], pod["volumes"])
	}
	args := fmt.Sprint(ctr["args"])
	if strings.Contains(args, "--allow-secret-data") {
		t.Errorf("--allow-secret-data by default: %s", args)
	}
	np := renderedDoc(t, out, "NetworkPolicy")
	if np == nil {
		t.Fatalf("no NetworkPolicy rendered by default:\n%s", out)
	}
	spec := np["spec"].(map[string]any)
	if got := fmt.Sprint(spec["policyTypes"], spec["ingress"], spec["egress"]); got != "[Ingress] [map[ports:[map[port:8080 protocol:TCP]]]] <nil>" {
		t.Errorf("default NetworkPolicy spec: %s; want ingress to the admin port from anywhere, egress not restricted", got)
	}
	if out, err := helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "networkPolicy.enabled=false"); err != nil || renderedDoc(t, out, "NetworkPolicy") != nil {
		t.Errorf("networkPolicy.enabled=false: err %v, a NetworkPolicy rendered: %v", err, renderedDoc(t, out, "NetworkPolicy") != nil)
	}

	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "allowSecretData=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	if !strings.Contains(out, "            - --allow-secret-data\n") {
		t.Errorf("allowSecretData=true: no --allow-secret-data in the args:\n%s", out)
	}

	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "-f", chartValues(t, `
networkPolicy:
  metricsFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
`))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	np = renderedDoc(t, out, "NetworkPolicy")
	if np == nil {
		t.Fatalf("no NetworkPolicy rendered:\n%s", out)
	}
	spec = np["spec"].(map[string]any)
	if got := fmt.Sprint(spec["policyTypes"], spec["ingress"], spec["egress"]); got !=
		"[Ingress] [map[from:[map[namespaceSelector:map[matchLabels:map[kubernetes.io/metadata.name:monitoring]]]] ports:[map[port:8080 protocol:TCP]]]] <nil>" {
		t.Errorf("NetworkPolicy spec: %s", got)
	}
	if got := fmt.Sprint(spec["podSelector"]); got != "map[matchLabels:map[app.kubernetes.io/instance:kb app.kubernetes.io/name:kubebridge]]" {
		t.Errorf("NetworkPolicy podSelector: %s", got)
	}
	// Egress rules, when given, restrict egress.
	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system",
		"--set", "networkPolicy.egress[0].to[0].ipBlock.cidr=10.0.0.0/8")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	spec = renderedDoc(t, out, "NetworkPolicy")["spec"].(map[string]any)
	if got := fmt.Sprint(spec["policyTypes"], spec["ingress"], spec["egress"]); got != "[Ingress Egress] [map[ports:[map[port:8080 protocol:TCP]]]] [map[to:[map[ipBlock:map[cidr:10.0.0.0/8]]]]]" {
		t.Errorf("NetworkPolicy spec with egress: %s", got)
	}
	// The schema knows the peers' shape.
	out, err = helm(t, "template", "kb", chartDir, "--namespace", "kb-system", "--set", "networkPolicy.metricsFrom[0].podSelectr.app=x")
	if err == nil || !strings.Contains(out, "podSelectr") {
		t.Errorf("a misspelt peer: err = %v, want a schema error naming it\n%s", err, out)
	}
}

// With sharding the chart's Lease Role reads only the shard Leases by name
// (RBAC cannot name the rest: a create's name is in its body, the Leases are
// listed by label, member Leases are named after pods) and lists the pods a
// member must be. A replica as that ServiceAccount, in its running pod, with
// the flags the chart passes, counts no member Lease that names no pod of
// the release: it delivers every shard beside a fake member.
func TestChartShardRoleNamesShardLeasesAndVerifiesMembers(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	const ns = "kbr-shards"
	testenv.EnsureNamespace(t, cp, "chart-members")
	srv := testenv.StartNATS(t)
	values := fmt.Sprintf("replicas: 2\nhotReload: false\nsharding: {shards: %d}\n", testShards) +
		strings.NewReplacer(`nats://nats.nats.svc:4222`, srv.ClientURL(), "namespaces: [default]", "namespaces: [chart-members]").Replace(chartNATSConfig) +
		"  checkpoint: {natsKV: {sink: bus, bucket: kbr-members}}\n"
	kc, err := cp.Kubeconfig(t.TempDir())
	must(t, err)
	path := chartValues(t, values)
	manifests, err := helm(t, "template", "kb", chartDir, "--namespace", ns, "-f", path)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, manifests)
	}
	if out, err := helm(t, "install", "kb", chartDir, "--namespace", ns, "--create-namespace", "-f", path, "--kubeconfig", kc); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = helm(t, "uninstall", "kb", "--namespace", ns, "--kubeconfig", kc) })

	want := []access{
		{"create", "coordination.k8s.io", "leases", ns, ""},
		{"list", "coordination.k8s.io", "leases", ns, ""},
		{"get", "coordination.k8s.io", "leases", ns, "kb-shard-0"},
		{"get", "coordination.k8s.io", "leases", ns, fmt.Sprintf("kb-shard-%d", testShards-1)},
		{"update", "coordination.k8s.io", "leases", ns, "kb-member-0123456789abcdef"}, // named after a pod: not nameable
		{"list", "", "pods", ns, ""},
	}
	deny := []access{
		{"get", "coordination.k8s.io", "leases", ns, fmt.Sprintf("kb-shard-%d", testShards)},
		{"get", "coordination.k8s.io", "leases", ns, "another-lease"},
		{"watch", "coordination.k8s.io", "leases", ns, ""},
		{"update", "coordination.k8s.io", "leases", "chart-members", "kb-shard-0"},
		{"get", "", "pods", ns, "kb-a"},
		{"update", "", "pods", ns, "kb-a"},
		{"list", "", "pods", "chart-members", ""},
	}
	testenv.Await(t, 30*time.Second, 200*time.Millisecond, func() error { // RBAC takes a moment
		for _, a := range want {
			if !allowed(t, cp, ns, "kb", a) {
				return fmt.Errorf("the chart's ServiceAccount may not %s", a)
			}
		}
		return nil
	})
	for _, a := range deny {
		if allowed(t, cp, ns, "kb", a) {
			t.Errorf("the chart's ServiceAccount may %s", a)
		}
	}

	// The replica's pod, running with the Deployment's labels, and a fake
	// member Lease a Lease writer renews.
	dep := renderedDoc(t, manifests, "Deployment")
	tmpl := dep["spec"].(map[string]any)["template"].(map[string]any)
	podLabels := map[string]string{}
	for k, v := range tmpl["metadata"].(map[string]any)["labels"].(map[string]any) {
		podLabels[k] = fmt.Sprint(v)
	}
	args := fmt.Sprint(tmpl["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["args"])
	selector := regexp.MustCompile(`--shard-member-selector=(\S+)`).FindStringSubmatch(args)
	if selector == nil {
		t.Fatalf("the Deployment passes no --shard-member-selector: %s", args)
	}
	if s := strings.Join(containerEnvNames(dep), ","); !strings.Contains(s, "POD_UID") {
		t.Errorf("the Deployment does not pass the pod's uid (env %s)", s)
	}
	cs := cp.Clientset(t)
	ctx := context.Background()
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kb-a", Labels: podLabels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "bridge", Image: "kubebridge"}}}}, metav1.CreateOptions{})
	must(t, err)
	pod.Status.Phase = corev1.PodRunning
	_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	must(t, err)
	fakeCtx, stopFake := context.WithCancel(ctx)
	defer stopFake()
	go func() {
		holder := "kb-fake"
		for fakeCtx.Err() == nil {
			name := fmt.Sprintf("kb-member-%016x", shards.Hash(holder))
			now := metav1.NewMicroTime(time.Now())
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels: map[string]string{shards.LabelGroup: "kb", "kubebridge.io/role": "member"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now}}
			if cur, err := cs.CoordinationV1().Leases(ns).Get(fakeCtx, name, metav1.GetOptions{}); err == nil {
				l.ResourceVersion = cur.ResourceVersion
				_, _ = cs.CoordinationV1().Leases(ns).Update(fakeCtx, l, metav1.UpdateOptions{})
			} else {
				_, _ = cs.CoordinationV1().Leases(ns).Create(fakeCtx, l, metav1.CreateOptions{})
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()

	b, err := tryStartBridge(t, cp, renderedConfig(t, manifests), withKubeconfig(cp.ServiceAccountKubeconfig(t, ns, "kb")), withConfigCheckpoint(),
		withLogLevel("info"), withShortLease(), withFlags("--leader-elect-namespace", ns, "--leader-elect-name", "kb", "--shard-member-selector", selector[1]),
		withEnv("POD_NAME=kb-a", "POD_UID="+string(pod.UID)), withReadyLog("bridge started; sharing the shards"), withStartTimeout(20*time.Second))
	if err != nil {
		t.Fatalf("the replica did not start as the chart's ServiceAccount: %v", err)
	}
	waitShardsBalanced(t, "beside a fake member", b) // all of them
	time.Sleep(3 * time.Second)                      // several rounds with the fake renewed
	if n, _ := scrapeMetric(b, "kubebridge_shards_owned"); int(n) != testShards {
		t.Errorf("the replica holds %v shards beside a fake member; want all %d", n, testShards)
	}
	if n, _ := scrapeMetric(b, "kubebridge_shard_members"); n != 1 {
		t.Errorf("kubebridge_shard_members = %v; want 1 (the fake not counted)", n)
	}
	b.halt()
	if strings.Contains(b.log(), "forbidden") {
		t.Errorf("the replica was refused something:\n%s", b.log())
	}
}

// The chart grants what include: [owners] reads, as the bridge's own table
// (owners.Needs) says, plus a rule's ownerResources, in the rule's scope:
// cluster-wide for a rule that names no namespaces.
func TestChartOwnerRBAC(t *testing.T) {
	t.Parallel()
	for _, res := range []string{"v1/pods", "apps/v1/replicasets", "apps/v1/controllerrevisions", "batch/v1/jobs", "v1/events", "events.k8s.io/v1/events", "v1/configmaps"} {
		gvr, err := config.ParseResource(res)
		must(t, err)
		want := map[string][]string{gvr.Group: {gvr.Resource}}
		for _, o := range owners.Needs(gvr) {
			want[o.GVR.Group] = append(want[o.GVR.Group], o.GVR.Resource)
		}
		want["example.kubebridge.io"] = []string{"widgets"}
		var wantRules []string
		for _, g := range slices.Sorted(maps.Keys(want)) {
			rs := slices.Compact(slices.Sorted(slices.Values(want[g])))
			wantRules = append(wantRules, fmt.Sprintf("%q: %s [list watch]", g, strings.Join(rs, ",")))
		}
		wantRules = append(wantRules, `"authentication.k8s.io": tokenreviews [create]`, `"authorization.k8s.io": subjectaccessreviews [create]`)
		out, err := helm(t, "template", "kbr", chartDir, "--namespace", rbacNS, "-f", chartValues(t, fmt.Sprintf(`
config:
  cluster: e2e
  sinks: [{name: out, file: {path: "-"}}]
  rules:
    - {name: r, resource: %s, include: [owners], ownerResources: [example.kubebridge.io/v1/widgets], sinks: [out]}
`, res)))
		if err != nil {
			t.Fatalf("%s: helm template: %v\n%s", res, err, out)
		}
		if got := policyRules(renderedDocs(t, out, "ClusterRole")["/kbr-"+rbacNS]); !slices.Equal(got, wantRules) {
			t.Errorf("%s: ClusterRole rules:\n  %s\nwant:\n  %s", res, strings.Join(got, "\n  "), strings.Join(wantRules, "\n  "))
		}
	}

	// A rule that names its namespaces: its owners there (a Role), but a
	// cluster-scoped owner (Nodes own mirror Pods) cluster-wide.
	out, err := helm(t, "template", "kbr", chartDir, "--namespace", rbacNS, "-f", chartValues(t, fmt.Sprintf(`
config:
  cluster: e2e
  sinks: [{name: out, file: {path: "-"}}]
  rules:
    - {name: r, resource: batch/v1/jobs, namespaces: [%s], include: [owners], ownerResources: [v1/nodes], sinks: [out]}
`, nsA)))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	if got, want := policyRules(renderedDocs(t, out, "Role")[nsA+"/kbr"]), []string{`"batch": cronjobs,jobs [list watch]`}; !slices.Equal(got, want) {
		t.Errorf("Role rules %v, want %v", got, want)
	}
	if got := policyRules(renderedDocs(t, out, "ClusterRole")["/kbr-"+rbacNS]); len(got) == 0 || got[0] != `"": nodes [list watch]` {
		t.Errorf("ClusterRole rules %v, want nodes first", got)
	}
}

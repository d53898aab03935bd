package celsandbox

import (
	"reflect"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// Objects as a where expression gets them: unstructured, decoded from JSON
// the way client-go does (integers are int64).
const (
	deploymentJSON = `{"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": {"name": "web", "namespace": "prod", "uid": "u1", "resourceVersion": "7", "generation": 3,
			"creationTimestamp": "2024-05-01T10:00:00Z", "labels": {"app": "web"}, "annotations": {"example.com/team": "pay"},
			"finalizers": ["example.com/keep"],
			"ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Site", "name": "s", "uid": "u0", "controller": true, "blockOwnerDeletion": true}],
			"managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "apps/v1"}]},
		"spec": {"replicas": 3}, "status": {"readyReplicas": 1}}`
	configMapJSON   = `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "prod"}, "data": {"x": "1"}}`
	deletingJSON    = `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old", "deletionTimestamp": "2024-05-02T10:00:00Z", "deletionGracePeriodSeconds": 30}}`
	clusterRoleJSON = `{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "admin"},
		"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]}`
)

func decodeObject(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := utiljson.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// evalWhere compiles expr as a rule's where and evaluates it as the filter
// stage does: object and oldObject are unstructured maps, oldObject nil
// when there is no previous state.
func evalWhere(t *testing.T, expr string, obj, old map[string]any, typ string) (bool, error) {
	t.Helper()
	ast, errs := CompileWhere(expr)
	if len(errs) > 0 {
		t.Fatalf("%s: %v", expr, errs)
	}
	env, err := CELEnv()
	if err != nil {
		t.Fatal(err)
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	vars := map[string]any{CELObject: obj, CELOldObject: nil, CELType: typ}
	if old != nil {
		vars[CELOldObject] = old
	}
	out, _, err := prg.Eval(vars)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		t.Fatalf("%s: evaluated to %v (%s), not a bool", expr, out, out.Type())
	}
	return b, nil
}

// Expressions that are meaningful with object as dyn stay valid, and
// evaluate against unstructured objects as before: a field absent from the
// JSON is not set (has() is false) and reading it is an evaluation error.
func TestWhereEvaluates(t *testing.T) {
	deploy := decodeObject(t, deploymentJSON)
	cm := decodeObject(t, configMapJSON)
	deleting := decodeObject(t, deletingJSON)
	role := decodeObject(t, clusterRoleJSON)
	for _, tc := range []struct {
		expr     string
		obj, old map[string]any
		typ      string
		want     bool
		wantErr  string // an evaluation error containing this
	}{
		{expr: "object.spec.replicas > 2", obj: deploy, want: true},
		{expr: "object.spec.replicas > 2.5", obj: deploy, want: true},
		{expr: "has(object.data.x)", obj: cm, want: true},
		{expr: "has(object.data.y)", obj: cm, want: false},
		{expr: "has(object.data)", obj: deploy, want: false},
		{expr: "object.metadata.labels['app'] == 'web'", obj: deploy, want: true},
		{expr: "object.metadata.labels.app == 'web'", obj: deploy, want: true},
		{expr: "object.metadata.labels['app'] == 'web'", obj: cm, wantErr: "no such key: labels"},
		{expr: "'app' in object.metadata.labels", obj: deploy, want: true},
		{expr: "has(object.metadata.labels)", obj: cm, want: false},
		{expr: "object.metadata.?labels.?app.orValue('') == 'x'", obj: deploy, want: false},
		{expr: "object.metadata.?labels.?app.orValue('') == 'web'", obj: deploy, want: true},
		{expr: "object.metadata.?labels.?app.orValue('') == ''", obj: cm, want: true},
		{expr: "object.metadata.annotations['example.com/team'] == 'pay'", obj: deploy, want: true},
		{expr: "has(object.metadata.deletionTimestamp)", obj: deploy, want: false},
		{expr: "has(object.metadata.deletionTimestamp)", obj: deleting, want: true},
		{expr: "object.metadata.deletionTimestamp > '2024-05-01'", obj: deleting, want: true},
		{expr: "object.metadata.deletionGracePeriodSeconds == 30", obj: deleting, want: true},
		{expr: "timestamp(object.metadata.creationTimestamp) < timestamp('2025-01-01T00:00:00Z')", obj: deploy, want: true},
		{expr: "oldObject == null || oldObject.metadata.generation != object.metadata.generation", obj: deploy, want: true},
		{expr: "oldObject == null || oldObject.metadata.generation != object.metadata.generation", obj: deploy, old: deploy, want: false},
		{expr: "oldObject.metadata.name == 'web'", obj: deploy, wantErr: "no such key"},
		{expr: "object.metadata == oldObject.metadata", obj: deploy, old: deploy, want: true},
		{expr: "type == 'deleted'", obj: cm, typ: "deleted", want: true},
		{expr: "type == 'deleted'", obj: cm, typ: "added", want: false},
		{expr: "object.kind == 'Deployment' && object.apiVersion.startsWith('apps/')", obj: deploy, want: true},
		{expr: "object.rules.exists(r, r.verbs.exists(v, v == '*') && 'secrets' in r.resources)", obj: role, want: true},
		{expr: "object.metadata.name.startsWith('w')", obj: deploy, want: true},
		{expr: "object.metadata.generation >= 3 && object.metadata.uid == 'u1' && object.metadata.resourceVersion == '7'", obj: deploy, want: true},
		{expr: "object.metadata.namespace == 'prod' && !has(object.metadata.generateName) && !has(object.metadata.selfLink)", obj: deploy, want: true},
		{expr: "object.metadata.ownerReferences.exists(o, o.controller && o.blockOwnerDeletion && o.kind == 'Site' && o.apiVersion == 'example.com/v1' && o.name == 's' && o.uid == 'u0')", obj: deploy, want: true},
		{expr: "object.metadata.finalizers.exists(f, f == 'example.com/keep')", obj: deploy, want: true},
		{expr: "object.metadata.managedFields.exists(m, m.manager == 'kubectl')", obj: deploy, want: true},
		{expr: "object.?status.?readyReplicas.orValue(0) < object.spec.replicas", obj: deploy, want: true},
		// object is a struct, not a map; dyn() makes it one.
		{expr: "size(dyn(object)) == 5 && dyn(object)['spec'].replicas == 3", obj: deploy, want: true},
	} {
		typ := tc.typ
		if typ == "" {
			typ = "added"
		}
		got, err := evalWhere(t, tc.expr, tc.obj, tc.old, typ)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: got %v, %v; want an error with %q", tc.expr, got, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.expr, err)
		case got != tc.want:
			t.Errorf("%s = %v, want %v", tc.expr, got, tc.want)
		}
	}
}

// What the checker can tell is wrong is an error at load; dyn results and
// fields outside metadata are left to evaluation.
func TestWhereErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"object.metadata.name", "must be a boolean expression, got string"},
		{"object.metadata", "must be a boolean expression, got kubebridge.ObjectMeta"},
		{"object.metadata.labels", "must be a boolean expression, got map(string, string)"},
		{"object", "must be a boolean expression, got kubebridge.Object"},
		{"'a' + 'b'", "must be a boolean expression, got string"},
		{"null", "must be a boolean expression, got null_type"},
		{"object.metadata.generation == 'x'", "found no matching overload for '_==_' applied to '(int, string)' (column 28)"},
		{"object.metadata.labels['app'] == 1", "found no matching overload for '_==_' applied to '(string, int)' (column 31)"},
		{"object.kind == 1", "found no matching overload for '_==_' applied to '(string, int)' (column 13)"},
		{"object.metadata.name.startsWith(1)", "found no matching overload for 'startsWith' applied to 'string.(int)' (column 32)"},
		{"object.metadata.nmae == 'x'", "undefined field 'nmae' (column 16)"},
		{"object.metadata.ownerReferences.exists(o, o.controler)", "undefined field 'controler' (column 44)"},
		{"object.metadata.ownerReferences.exists(o, o.controller)\n  && oldObject.metadata.lables.app == 'x'", "undefined field 'lables' (line 2, column 24)"},
		{"objekt.metadata.name != 'x'", "undeclared reference to 'objekt' (column 1)"},
	} {
		_, errs := CompileWhere(tc.expr)
		if len(errs) != 1 || errs[0].Error() != tc.want {
			t.Errorf("%q: got %v, want [%s]", tc.expr, errs, tc.want)
		}
	}
	for _, expr := range []string{"object.spec.paused", "object.?spec.replicas.orValue(0) > 1", "dyn(object.metadata.name)"} {
		if _, errs := CompileWhere(expr); len(errs) > 0 {
			t.Errorf("%q: %v, want accepted (dyn, known when evaluated)", expr, errs)
		}
	}
}

// The declared metadata is Kubernetes' ObjectMeta as JSON: every field of
// metav1.ObjectMeta and metav1.OwnerReference, and nothing else, with the
// type its JSON value has.
func TestMetadataTypes(t *testing.T) {
	check := func(typeName string, goType reflect.Type) {
		declared := celStructs[typeName].fields
		seen := map[string]bool{}
		for i := range goType.NumField() {
			f := goType.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			seen[name] = true
			want := jsonCELType(t, f.Type)
			if got, ok := declared[name]; !ok {
				t.Errorf("%s.%s is not declared", typeName, name)
			} else if !got.IsExactType(want) {
				t.Errorf("%s.%s: declared %s, want %s", typeName, name, got, want)
			}
		}
		for name := range declared {
			if !seen[name] {
				t.Errorf("%s.%s is declared but not in %s", typeName, name, goType)
			}
		}
	}
	check(objectMetaTypeName, reflect.TypeFor[metav1.ObjectMeta]())
	check(ownerReferenceTypeName, reflect.TypeFor[metav1.OwnerReference]())

	names, ok := objectTypes{}.FindStructFieldNames(ownerReferenceTypeName)
	if want := "apiVersion blockOwnerDeletion controller kind name uid"; !ok || strings.Join(names, " ") != want {
		t.Errorf("FindStructFieldNames(OwnerReference) = %v, %v; want %s", names, ok, want)
	}
}

// jsonCELType is the CEL type of a metav1 field's JSON value.
func jsonCELType(t *testing.T, rt reflect.Type) *types.Type {
	if rt.Kind() == reflect.Pointer {
		rt = rt.Elem()
	}
	switch rt {
	case reflect.TypeFor[metav1.Time]():
		return types.StringType // RFC 3339
	case reflect.TypeFor[metav1.OwnerReference]():
		return types.NewObjectType(ownerReferenceTypeName)
	case reflect.TypeFor[[]metav1.ManagedFieldsEntry]():
		return types.DynType // left untyped: only the API server's bookkeeping
	}
	switch rt.Kind() {
	case reflect.String:
		return types.StringType
	case reflect.Int64, reflect.Int32:
		return types.IntType
	case reflect.Bool:
		return types.BoolType
	case reflect.Map:
		return types.NewMapType(jsonCELType(t, rt.Key()), jsonCELType(t, rt.Elem()))
	case reflect.Slice:
		return types.NewListType(jsonCELType(t, rt.Elem()))
	}
	t.Fatalf("no CEL type for %s", rt)
	return nil
}

// A replace of literals is built when the program is planned, before any
// cost check: one whose result is over the bound is refused at load.
func TestWhereLiteralReplaceIsBoundedAtLoad(t *testing.T) {
	bomb := `'` + strings.Repeat("a", 2000) + `'.replace('a', '` + strings.Repeat("b", 1000) + `') != ''`
	if _, errs := CompileWhere(bomb); len(errs) != 1 || errs[0].Error() != "replace builds a string of 2000000 bytes, more than 1048576" {
		t.Errorf("errors = %v", errs)
	}
	if _, errs := CompileWhere(`'aaa'.replace('a', 'bb') == 'bbbbbb'`); len(errs) != 0 {
		t.Errorf("a small literal replace: %v", errs)
	}
}

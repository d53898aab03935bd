package informer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unique"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// The cache transform drops managedFields and interns keys and repeating
// values without changing the object.
func TestStripManagedFieldsInterns(t *testing.T) {
	decode := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"alpha","namespace":"ns","labels":{"team":"pay"},
			"managedFields":[{"manager":"kubectl"}],"ownerReferences":[{"kind":"Deployment","name":"d"}]},"data":{"k":"v"}}`)); err != nil {
			t.Fatal(err)
		}
		return u
	}
	a, b := decode(), decode()
	for _, u := range []*unstructured.Unstructured{a, b} {
		if _, err := stripManagedFields(u); err != nil {
			t.Fatal(err)
		}
	}
	want := decode()
	unstructured.RemoveNestedField(want.Object, "metadata", "managedFields")
	if !reflect.DeepEqual(a.Object, want.Object) {
		t.Fatalf("transformed = %v, want %v", a.Object, want.Object)
	}
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(a.GetNamespace(), b.GetNamespace()) || !same(a.GetLabels()["team"], b.GetLabels()["team"]) || !same(a.GetKind(), b.GetKind()) {
		t.Error("namespace, label values and kind of two objects are not shared")
	}
	if same(a.GetName(), b.GetName()) {
		t.Error("names are interned: they are unique, interning only costs")
	}
}

// An object whose keys are canonical already (as internal/kubejson decodes
// them) is interned in place, to the same result.
func TestInternInPlaceWhenKeysAreCanonical(t *testing.T) {
	raw := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"alpha","namespace":"ns","labels":{"team":"pay"},
		"ownerReferences":[{"kind":"Deployment","name":"d","n":2.0}]},"data":{"k":"v"},"n":[1.0,{"x":3.0}]}`)
	decode := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			t.Fatal(err)
		}
		u.Object["f"] = 4.0 // a float64 as CBOR decodes a whole number
		return u
	}
	var canonical func(m map[string]any) map[string]any
	canonical = func(m map[string]any) map[string]any {
		out := make(map[string]any, len(m))
		for k, v := range m {
			switch v := v.(type) {
			case map[string]any:
				out[unique.Make(k).Value()] = canonical(v)
			case []any:
				for i, e := range v {
					if e, ok := e.(map[string]any); ok {
						v[i] = canonical(e)
					}
				}
				out[unique.Make(k).Value()] = v
			default:
				out[unique.Make(k).Value()] = v
			}
		}
		return out
	}
	want, got := decode(), decode()
	got.Object = canonical(got.Object)
	before, md := reflect.ValueOf(got.Object).UnsafePointer(), reflect.ValueOf(got.Object["metadata"]).UnsafePointer()
	for _, u := range []*unstructured.Unstructured{want, got} {
		if _, err := stripManagedFields(u); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(got.Object, want.Object) {
		t.Fatalf("interned in place = %v, want %v", got.Object, want.Object)
	}
	if reflect.ValueOf(got.Object).UnsafePointer() != before || reflect.ValueOf(got.Object["metadata"]).UnsafePointer() != md {
		t.Error("maps with canonical keys were rebuilt")
	}
	if unsafe.StringData(got.GetNamespace()) != unsafe.StringData(want.GetNamespace()) || got.Object["f"] != int64(4) {
		t.Errorf("values not interned in place: namespace not shared, f = %#v", got.Object["f"])
	}
}

// BenchmarkTransform is the cache transform's cost per decoded object (a
// ~1 KiB ConfigMap with managedFields), paid once per watch event.
func BenchmarkTransform(b *testing.B) {
	raw := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench-000001","namespace":"bench","uid":"6f1c1d2e-2f0a-4b8e-9c55-0d3c1a2b3c4d",
		"resourceVersion":"123456","creationTimestamp":"2026-11-21T10:00:00Z","labels":{"app":"bench","shard":"1"},
		"managedFields":[{"manager":"bench","operation":"Update","apiVersion":"v1","time":"2026-11-21T10:00:00Z","fieldsType":"FieldsV1",
		"fieldsV1":{"f:data":{".":{},"f:payload":{},"f:revision":{}},"f:metadata":{"f:labels":{".":{},"f:app":{},"f:shard":{}}}}}]},
		"data":{"payload":"` + strings.Repeat("x", 1000) + `","revision":"0"}}`)
	objs := make([]*unstructured.Unstructured, 1000)
	for i := range objs {
		objs[i] = &unstructured.Unstructured{}
		if err := objs[i].UnmarshalJSON(raw); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		u := objs[i%len(objs)]
		_, _ = stripManagedFields(u)
	}
}

// A whole float (as CBOR carries 1.0) is cached as the int64 JSON decodes it
// to, in maps and in lists; fractions and out-of-range values stay floats.
func TestWholeFloatsBecomeInts(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "x"},
		"spec":     map[string]any{"a": float64(1), "b": 1.5, "c": []any{float64(2), 2.5, map[string]any{"d": float64(-3)}}, "e": 1e300},
	}}
	out, err := stripManagedFields(u)
	if err != nil {
		t.Fatal(err)
	}
	spec := out.(*unstructured.Unstructured).Object["spec"].(map[string]any)
	list := spec["c"].([]any)
	for name, c := range map[string]struct{ got, want any }{
		"a": {spec["a"], int64(1)}, "b": {spec["b"], 1.5}, "c[0]": {list[0], int64(2)}, "c[1]": {list[1], 2.5},
		"c[2].d": {list[2].(map[string]any)["d"], int64(-3)}, "e": {spec["e"], 1e300},
	} {
		if c.got != c.want {
			t.Errorf("spec.%s = %#v, want %#v", name, c.got, c.want)
		}
	}
}

// secretRules compiles rules under a config with the redaction block
// given (YAML under "redaction:", or "").
func secretRules(t *testing.T, redaction, rules string) []*filters.Rule {
	t.Helper()
	if redaction != "" {
		redaction = "redaction:\n" + redaction
	}
	return testenv.CompileRules(t, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
sinks:
  - {name: live, file: {path: x}}
`+redaction+`rules:
`+rules, components.SinkRegistry(), nil)
}

// secretValues are the values of testSecret that must not be cached: its
// data and stringData, and its annotations' that hold Secret values.
var secretValues = map[string]string{
	"password": "aHVudGVyMg==", "tls.crt": "LS0tLS1CRUdJTi" + strings.Repeat("Q0VSVElGSUNBVEUtLS0t", 200), "token": "s3cr3t-t0ken",
	"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","data":{"password":"aHVudGVyMg=="},"kind":"Secret"}`,
	"vault.example.com/hint":                           "the-dog's-name",
	"team":                                             "payments",
}

// testSecret is a Secret as the apiserver sends it, with a data value
// twice (password and copy), an empty one, and annotations: two with
// Secret values, one (team) without.
func testSecret(t testing.TB, rv string, labels string) *unstructured.Unstructured {
	t.Helper()
	v := func(k string) string { b, _ := json.Marshal(secretValues[k]); return string(b) }
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db","namespace":"ns","uid":"u1","resourceVersion":"` + rv + `",
		"labels":{` + labels + `},"annotations":{"kubectl.kubernetes.io/last-applied-configuration":` + v("kubectl.kubernetes.io/last-applied-configuration") + `,
		"vault.example.com/hint":` + v("vault.example.com/hint") + `,"team":` + v("team") + `},"managedFields":[{"manager":"kubectl"}]},"type":"Opaque",
		"data":{"password":` + v("password") + `,"copy":` + v("password") + `,"tls.crt":` + v("tls.crt") + `,"empty":""},"stringData":{"token":` + v("token") + `}}`)); err != nil {
		t.Fatal(err)
	}
	return u
}

// plaintexts lists every place in m (keys and values, walked whole) that
// holds one of values.
func plaintexts(m any, path string, values []string) []string {
	var out []string
	switch m := m.(type) {
	case map[string]any:
		for k, v := range m {
			out = append(out, plaintexts(k, path+"{key}", values)...)
			out = append(out, plaintexts(v, path+"."+k, values)...)
		}
	case []any:
		for i, v := range m {
			out = append(out, plaintexts(v, fmt.Sprintf("%s[%d]", path, i), values)...)
		}
	case string:
		for _, v := range values {
			if strings.Contains(m, v) {
				out = append(out, path)
			}
		}
	}
	return out
}

func transformed(t *testing.T, w Watch, u *unstructured.Unstructured) map[string]any {
	t.Helper()
	out, err := w.transform()(u)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*unstructured.Unstructured).Object
}

func str(m map[string]any, path ...string) string {
	s, _, _ := unstructured.NestedString(m, path...)
	return s
}

// A Secret whose values no rule of its informer may deliver is cached with
// a digest in place of each data and stringData value, and of each
// annotation every rule redacts (the two that always are, those listed in
// redaction.secretAnnotations, all with "*"): keys stay, equal values have
// equal digests, different values different ones, and nothing of a value
// is left anywhere in the cached object.
func TestSecretsCachedDigested(t *testing.T) {
	const lastApplied, hint = "kubectl.kubernetes.io/last-applied-configuration", "vault.example.com/hint"
	for _, tc := range []struct {
		name, redaction, include string
		digested, plain          []string // annotations
	}{
		{"default", "", "", []string{lastApplied}, []string{hint, "team"}},
		{"listed", "  secretAnnotations: [vault.example.com/hint]\n", "", []string{lastApplied, hint}, []string{"team"}},
		{"every annotation", "  secretAnnotations: ['*']\n", "", []string{lastApplied, hint, "team"}, nil},
		{"metadata only", "  secretAnnotations: [vault.example.com/hint]\n", "\n    include: [metadata]", []string{lastApplied, hint}, []string{"team"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := secretRules(t, tc.redaction, "  - {name: s, resource: v1/secrets, sinks: [live]"+strings.ReplaceAll(tc.include, "\n    ", ", ")+"}\n")
			w := Watch{Spec: Spec{GVR: rs[0].GVR}, Rules: rs}
			if tc.include != "" && !w.MetadataOnly() {
				t.Fatal("the watch is not metadata only")
			}
			obj := transformed(t, w, testSecret(t, "1", `"app":"db"`))
			var leaked []string
			for _, a := range tc.digested {
				leaked = append(leaked, secretValues[a])
			}
			for _, k := range []string{"password", "tls.crt", "token"} {
				leaked = append(leaked, secretValues[k])
			}
			if where := plaintexts(obj, "", leaked); len(where) > 0 {
				t.Errorf("plaintext cached at %v", where)
			}
			md := obj["metadata"].(map[string]any)
			if _, ok := md["managedFields"]; ok {
				t.Error("managedFields cached")
			}
			for _, a := range tc.digested {
				if v := str(md, "annotations", a); !strings.HasPrefix(v, event.DigestPrefix) {
					t.Errorf("annotation %s cached as %.40q, want a digest", a, v)
				}
			}
			for _, a := range tc.plain {
				if v := str(md, "annotations", a); v != secretValues[a] {
					t.Errorf("annotation %s cached as %.40q, want its value", a, v)
				}
			}
			if str(md, "labels", "app") != "db" || str(md, "name") != "db" {
				t.Errorf("metadata changed: %v", md)
			}
			if tc.include != "" {
				if _, ok := obj["data"]; ok {
					t.Error("metadata-only cache holds data")
				}
				return
			}
			data := obj["data"].(map[string]any)
			if got := slices.Sorted(maps.Keys(data)); !slices.Equal(got, []string{"copy", "empty", "password", "tls.crt"}) {
				t.Errorf("data keys %v", got)
			}
			if keys := slices.Collect(maps.Keys(obj["stringData"].(map[string]any))); !slices.Equal(keys, []string{"token"}) {
				t.Errorf("stringData keys %v", keys)
			}
			digests := map[string]string{}
			for _, k := range []string{"password", "copy", "tls.crt", "empty"} {
				digests[k] = str(data, k)
				if !strings.HasPrefix(digests[k], event.DigestPrefix) {
					t.Errorf("data.%s cached as %.40q, want a digest", k, digests[k])
				}
			}
			if digests["password"] != digests["copy"] {
				t.Error("equal values, different digests")
			}
			if digests["password"] == digests["tls.crt"] || digests["password"] == digests["empty"] || str(obj, "stringData", "token") == digests["password"] {
				t.Errorf("different values, equal digests: %v", digests)
			}
			again := transformed(t, w, testSecret(t, "2", `"app":"db"`))
			if !reflect.DeepEqual(again["data"], obj["data"]) {
				t.Error("the same values cached twice have different digests")
			}
		})
	}
}

// An annotation is digested only if every rule of the informer redacts
// it: a rule that does not must deliver its value.
func TestSecretAnnotationsDigestedOnlyIfEveryRuleRedacts(t *testing.T) {
	const lastApplied, hint = "kubectl.kubernetes.io/last-applied-configuration", "vault.example.com/hint"
	for _, tc := range []struct {
		a, b     []string // more annotations the rules redact
		digested []string
	}{
		{[]string{event.AllAnnotations}, []string{hint}, []string{lastApplied, hint}},
		{[]string{hint}, nil, []string{lastApplied}},
		{[]string{event.AllAnnotations}, []string{event.AllAnnotations}, []string{lastApplied, hint, "team"}},
	} {
		rs := secretRules(t, "", "  - {name: a, resource: v1/secrets, sinks: [live]}\n  - {name: b, resource: v1/secrets, sinks: [live]}\n")
		rs[0].Event.SecretAnnotations = append(rs[0].Event.SecretAnnotations, tc.a...)
		rs[1].Event.SecretAnnotations = append(rs[1].Event.SecretAnnotations, tc.b...)
		obj := transformed(t, Watch{Spec: Spec{GVR: rs[0].GVR}, Rules: rs}, testSecret(t, "1", ""))
		for k, v := range obj["metadata"].(map[string]any)["annotations"].(map[string]any) {
			if digested := strings.HasPrefix(v.(string), event.DigestPrefix); digested != slices.Contains(tc.digested, k) {
				t.Errorf("rules redacting %v and %v: annotation %s cached as %.40q", tc.a, tc.b, k, v)
			}
		}
	}
}

// What the rules see and send of a digested Secret is what they saw of the
// plain one: where sees <redacted>, changed compares the digests (a
// changed value passes changed: [data], a label-only update does not), and
// the event carries <redacted> values and no digest.
func TestDigestedSecretsFilterAndDeliverAsBefore(t *testing.T) {
	rs := secretRules(t, "", `  - name: s
    resource: v1/secrets
    sinks: [live]
    include: [object, oldObject, patch]
    changed: [data]
    where: "object.data.password == '<redacted>' && object.metadata.annotations['team'] == 'payments'"
`)
	r := rs[0]
	w := Watch{Spec: Spec{GVR: r.GVR}, Rules: rs}
	cache := func(rv, labels string, edit func(data map[string]any)) *unstructured.Unstructured {
		u := testSecret(t, rv, labels)
		if edit != nil {
			edit(u.Object["data"].(map[string]any))
		}
		return &unstructured.Unstructured{Object: transformed(t, w, u)}
	}
	v1 := cache("1", `"app":"db"`, nil)
	relabelled := cache("2", `"app":"db2"`, nil)
	changed := cache("3", `"app":"db2"`, func(d map[string]any) { d["password"] = "aHVudGVyMw==" })
	if !r.InView(v1) {
		t.Error("where does not see <redacted> and the team annotation")
	}
	if r.Changed(v1, relabelled) {
		t.Error("a label-only update passes changed: [data]")
	}
	if !r.Changed(relabelled, changed) {
		t.Error("an update of data.password does not pass changed: [data]")
	}
	d, err := event.New(r.Event, event.Updated, changed, relabelled, time.Now()).Data()
	if err != nil {
		t.Fatal(err)
	}
	if leaks := plaintexts(string(d), "data", []string{"aHVudGVy", "digest", "s3cr3t", "LS0tLS1CRUdJTi"}); len(leaks) > 0 {
		t.Errorf("the event carries a value or a digest: %s", d)
	}
	if !strings.Contains(string(d), `"password":"\u003credacted\u003e"`) || !strings.Contains(string(d), `"path":"/data/password"`) {
		t.Errorf("the event does not show the redacted password and its change: %s", d)
	}
}

// With a rule that may deliver Secret data (allowSecretData, the bridge
// run with --allow-secret-data) on the informer, Secrets are cached with
// their values, whatever the other rules; other resources (ConfigMaps,
// a "secrets" resource of another group) are never digested.
func TestValuesCachedWhenDelivered(t *testing.T) {
	rs := secretRules(t, "  secretAnnotations: ['*']\n", `  - {name: plain, resource: v1/secrets, sinks: [live]}
  - {name: allowed, resource: v1/secrets, sinks: [live], allowSecretData: true}
  - {name: cms, resource: v1/configmaps, sinks: [live]}
`)
	for _, w := range []Watch{
		{Spec: Spec{GVR: rs[0].GVR}, Rules: rs[:2]},
		{Spec: Spec{GVR: rs[0].GVR}, Rules: rs[1:2]},
		{Spec: Spec{GVR: rs[2].GVR}, Rules: rs[2:]},
		{Spec: Spec{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "secrets"}}, Rules: rs[:1]},
	} {
		want := testSecret(t, "1", "")
		unstructured.RemoveNestedField(want.Object, "metadata", "managedFields")
		if got := transformed(t, w, testSecret(t, "1", "")); !reflect.DeepEqual(got, want.Object) {
			t.Errorf("%s with rules %v: cached %.300v, want the object as it is", w.Spec, ruleNames(w.Rules), got)
		}
	}
}

// BenchmarkTransformSecret is the cache transform's cost per decoded
// Secret whose values are digested (a 4 KiB value and three small ones,
// two annotations redacted), paid once per watch event.
func BenchmarkTransformSecret(b *testing.B) {
	r := testenv.CompileRules(b, "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: live, file: {path: x}}]\n"+
		"redaction: {secretAnnotations: [vault.example.com/hint]}\nrules: [{name: s, resource: v1/secrets, sinks: [live]}]\n", components.SinkRegistry(), nil)[0]
	transform := Watch{Spec: Spec{GVR: r.GVR}, Rules: []*filters.Rule{r}}.transform()
	objs := make([]*unstructured.Unstructured, 1000)
	for i := range objs {
		objs[i] = testSecret(b, "1", "")
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(objs) == 0 && i > 0 {
			b.StopTimer()
			for j := range objs { // each object is transformed once, as it is decoded
				objs[j] = testSecret(b, "1", "")
			}
			b.StartTimer()
		}
		_, _ = transform(objs[i%len(objs)])
	}
}

// The informer's cache itself, filled by the real informer machinery (list,
// watch, transform, indexer) from a client, holds no Secret value after
// the initial list nor after an update, and the update's new value is
// told apart by its digest.
func TestSecretInformerCacheHoldsNoPlaintext(t *testing.T) {
	rs := secretRules(t, "", "  - {name: s, resource: v1/secrets, sinks: [live], changed: [data]}\n")
	gvr := rs[0].GVR
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "SecretList"}, testSecret(t, "1", ""))
	// Updates made before the informer watches would be lost by the fake:
	// watching signals once the watch is registered.
	watching := make(chan struct{}, 1)
	client.PrependWatchReactor("secrets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(gvr, a.GetNamespace())
		select {
		case watching <- struct{}{}:
		default:
		}
		return true, w, err
	})
	in, err := New(client, Plan(rs, map[*filters.Rule]RuleSelectors{rs[0]: {}}, map[schema.GroupVersionResource]bool{gvr: true}), func(Notification) {}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	values := []string{secretValues["password"], secretValues["tls.crt"], secretValues["token"], secretValues["kubectl.kubernetes.io/last-applied-configuration"]}
	cached := func() *unstructured.Unstructured {
		objs := in.running[0].inf().GetIndexer().List()
		if len(objs) != 1 {
			t.Fatalf("%d objects cached, want 1", len(objs))
		}
		u := objs[0].(*unstructured.Unstructured)
		if where := plaintexts(u.Object, "", values); len(where) > 0 {
			t.Errorf("rv %s: plaintext cached at %v", u.GetResourceVersion(), where)
		}
		return u
	}
	first := cached()
	<-watching
	update := testSecret(t, "2", "")
	update.Object["data"].(map[string]any)["password"] = "bmV3LXBhc3N3b3Jk"
	values = append(values, "bmV3LXBhc3N3b3Jk")
	if _, err := client.Resource(gvr).Namespace("ns").Update(ctx, update, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for cached().GetResourceVersion() != "2" {
		if ctx.Err() != nil {
			t.Fatal("the update never reached the cache")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if second := cached(); !rs[0].Changed(first, second) || str(first.Object, "data", "copy") != str(second.Object, "data", "copy") {
		t.Error("the cached digests do not tell the new password from the old, or the unchanged copy changed")
	}
}

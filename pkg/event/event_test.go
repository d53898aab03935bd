package event

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func obj(ns, name, rv string, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
	for k, v := range fields {
		u.Object[k] = v
	}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID("u1")
	u.SetResourceVersion(rv)
	return u
}

var secrets = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// appendID is hand-written for speed: it must equal the definition, FNV-1a
// over the rule, a 0, the entry time in decimal and, when set, a 0 and the
// kbreason, for any input.
func TestIDMatchesItsDefinition(t *testing.T) {
	ref := func(rule, uid, rv string, change Change, entered int64, reason string) string {
		h := fnv.New64a()
		h.Write([]byte(rule))
		h.Write([]byte{0})
		h.Write([]byte(strconv.FormatInt(entered, 10)))
		if reason != "" {
			h.Write([]byte{0})
			h.Write([]byte(reason))
		}
		return fmt.Sprintf("%s.%012x.%s.%s", uid, h.Sum64()&(1<<48-1), rv, change)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	entered := []int64{0, 1, 9, 10, -1, -10, math.MaxInt64, math.MinInt64, 1764115200123456789}
	for range 2000 {
		entered = append(entered, rnd.Int64()>>rnd.IntN(63), -rnd.Int64()>>rnd.IntN(63))
	}
	for i, e := range entered {
		rule, reason := fmt.Sprintf("rule-%d", i%7), []string{"", ReasonUnmatched}[i%2]
		if got, want := ID(rule, "u1", "42", Updated, e, reason), ref(rule, "u1", "42", Updated, e, reason); got != want {
			t.Fatalf("ID(entered %d, reason %q) = %s; want %s", e, reason, got, want)
		}
	}
}

// TestIDs pins the id scheme: unique per transition (rule, incarnation,
// resourceVersion, type), stable when the same transition is built again.
func TestIDs(t *testing.T) {
	if got := ID("r", "u1", "42", Updated, 7, ""); got != "u1.0119615ec608.42.updated" {
		t.Errorf("ID = %s", got)
	}
	base := ID("r", "u1", "42", Added, 1000, "")
	if ID("r", "u1", "42", Added, 1000, "") != base {
		t.Error("the same transition got another id")
	}
	for name, other := range map[string]string{
		"another rule":           ID("r2", "u1", "42", Added, 1000, ""),
		"a re-entry (unchanged)": ID("r", "u1", "42", Added, 2000, ""),
		"a re-created object":    ID("r", "u2", "42", Added, 1000, ""),
		"another type":           ID("r", "u1", "42", Deleted, 1000, ""),
		"another version":        ID("r", "u1", "43", Added, 1000, ""),
		"another reason":         ID("r", "u1", "42", Added, 1000, ReasonUnmatched),
	} {
		if other == base {
			t.Errorf("%s shares the id %s", name, base)
		}
	}
}

// An incarnation sent again after a checkpoint's load keeps its entry time
// (a request's for, event.entered) under a new stamp: the stamp, not the
// entry time, makes its ids; an unset stamp is the entry time.
func TestStampMakesTheIDEnteredStays(t *testing.T) {
	r := &Rule{Name: "r", GVR: secrets}
	o := obj("ns", "a", "42", nil)
	plain := Build(r, Transition{Change: Updated, Object: o, Entered: 1000})
	if plain.Stamp != 1000 || plain.ID != ID("r", "u1", "42", Updated, 1000, "") {
		t.Errorf("without a stamp: stamp %d, id %s", plain.Stamp, plain.ID)
	}
	again := Build(r, Transition{Change: Updated, Object: o, Entered: 1000, Stamp: 5000})
	if again.Entered != 1000 || again.Stamp != 5000 || again.ID != ID("r", "u1", "42", Updated, 5000, "") || again.ID == plain.ID {
		t.Errorf("restamped: entered %d, stamp %d, id %s (first %s)", again.Entered, again.Stamp, again.ID, plain.ID)
	}
	if c := again.WithReplay(ReplayResync); c.Entered != 1000 || c.Stamp != 5000 || c.ID != again.ID {
		t.Errorf("a copy: entered %d, stamp %d, id %s", c.Entered, c.Stamp, c.ID)
	}
}

func TestEnvelope(t *testing.T) {
	r := &Rule{Name: "r", Cluster: "prod", GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, IncludeObject: true}
	ev := New(r, Updated, obj("ns", "web", "42", nil), obj("ns", "web", "41", nil), time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)))
	raw, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"specversion": "1.0", "id": ID("r", "u1", "42", Updated, ev.Entered, ""), "source": "kubebridge/prod", "type": "io.kubebridge.deployments.apps.updated",
		"subject": "ns/web", "time": "2026-01-02T02:04:05.000000006Z", "datacontenttype": "application/json", "kbrule": "r", "kbcluster": "prod", "kbchange": "updated",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, has := got["kbreplay"]; has {
		t.Error("kbreplay set on a live event")
	}
	var sdk cloudevents.Event
	if err := json.Unmarshal(raw, &sdk); err != nil || sdk.Validate() != nil {
		t.Errorf("sdk-go: %v %v", err, sdk.Validate())
	}
	replay := ev.WithReplay(ReplayResync)
	if replay.ID != ev.ID || replay.Replay != "resync" || ev.Replay != "" {
		t.Errorf("WithReplay changed the id or the original: %+v", replay)
	}
	cluster := New(&Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}}, Added, obj("", "kube-system", "1", nil), nil, time.Now())
	if cluster.Subject != "kube-system" || cluster.Type() != "io.kubebridge.namespaces.core.added" {
		t.Errorf("cluster-scoped: %s %s", cluster.Subject, cluster.Type())
	}
}

// Build's routing strings: Key and QueueKey from the rule, the subject and
// the uid; a Subject the caller passes is used only when it names the
// object.
func TestBuildKeys(t *testing.T) {
	r := &Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}
	u := obj("ns", "web", "42", nil)
	for _, subject := range []string{"", "ns/web", "other/web", "ns/webx", "ns-web", "web"} {
		ev := Build(r, Transition{Change: Updated, Object: u, Entered: 7, Subject: subject})
		if ev.Subject != "ns/web" || ev.Key() != "r/ns/web" || ev.QueueKey() != "r/ns/web\x00u1" || ev.ID != ID("r", "u1", "42", Updated, 7, "") ||
			ev.Namespace() != "ns" || ev.Name() != "web" || ev.UID() != "u1" || ev.Kind() != "Secret" || ev.Source() != "kubebridge/c" ||
			ev.Type() != "io.kubebridge.configmaps.core.updated" {
			t.Errorf("subject %q: %+v", subject, ev)
		}
	}
	cluster := obj("", "n1", "1", nil)
	for _, subject := range []string{"", "n1", "/n1", "x"} {
		ev := Build(r, Transition{Change: Deleted, Object: cluster, Subject: subject, Reason: ReasonUnmatched})
		if ev.Subject != "n1" || ev.Key() != "r/n1" || ev.QueueKey() != "r/n1\x00u1" || ev.ID != ID("r", "u1", "1", Deleted, 0, ReasonUnmatched) ||
			ev.Namespace() != "" || ev.Name() != "n1" || ev.UID() != "u1" || ev.Type() != "io.kubebridge.configmaps.core.deleted" {
			t.Errorf("cluster-scoped, subject %q: %+v", subject, ev)
		}
	}
	// An Event not made by Build derives nothing, and does not panic.
	var zero Event
	if got := []string{zero.Source(), zero.Type(), zero.Rule(), zero.Cluster(), zero.GVR().Resource, zero.Key(), zero.QueueKey(), zero.UID(),
		zero.Namespace(), zero.Name(), zero.Kind()}; strings.Join(got, "") != "" {
		t.Errorf("the zero Event derives %q", got)
	}
	// The rule's shared attributes follow the rule.
	r.Cluster, r.GVR = "d", schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	if ev := Build(r, Transition{Change: Added, Object: u}); ev.Source() != "kubebridge/d" || ev.Type() != "io.kubebridge.deployments.apps.added" {
		t.Errorf("after the rule changed: %s %s", ev.Source(), ev.Type())
	}
}

func TestSecretRedaction(t *testing.T) {
	old := obj("ns", "db", "1", map[string]any{"data": map[string]any{"pw": "c2VjcmV0MQ==", "user": "YWRtaW4="}})
	old.SetAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"pw":"c2VjcmV0MQ=="}}`})
	cur := obj("ns", "db", "2", map[string]any{"data": map[string]any{"pw": "c2VjcmV0Mg==", "user": "YWRtaW4=", "new": "bmV3"}, "stringData": map[string]any{"x": "plain"}})
	cur.SetAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"pw":"c2VjcmV0Mg=="}}`})
	r := &Rule{Name: "r", Cluster: "c", GVR: secrets, IncludeObject: true, IncludeOld: true, IncludePatch: true, SecretAnnotations: lastApplied}
	d, err := New(r, Updated, cur, old, time.Now()).Data()
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"c2VjcmV0", "YWRtaW4", "bmV3", "plain"} {
		if strings.Contains(string(d), leak) {
			t.Errorf("secret value %q in %s", leak, d)
		}
	}
	for _, must := range []string{`"pw":"\u003credacted\u003e"`, `"new":"\u003credacted\u003e"`, `"path":"/data/pw"`, `"path":"/data/new"`} {
		if !strings.Contains(string(d), must) {
			t.Errorf("%s missing from %s", must, d)
		}
	}
	if v, _, _ := unstructured.NestedString(cur.Object, "data", "pw"); v != "c2VjcmV0Mg==" {
		t.Error("redaction modified the cached object")
	}
	r.AllowSecretData = true
	d, _ = New(r, Updated, cur, old, time.Now()).Data()
	if !strings.Contains(string(d), "c2VjcmV0Mg==") {
		t.Errorf("allowSecretData: value missing from %s", d)
	}
}

var lastApplied = []string{"kubectl.kubernetes.io/last-applied-configuration"}

// The annotations redacted are the rule's list (from the config's
// redaction.secretAnnotations): listed ones in the object and in patches,
// "*" every one; the others stay readable.
func TestSecretAnnotationsRedacted(t *testing.T) {
	old := obj("ns", "db", "1", map[string]any{"data": map[string]any{"pw": "c2VjcmV0MQ=="}})
	old.SetAnnotations(map[string]string{"vault.example/token": "hvs.OLD", "team": "pay"})
	cur := obj("ns", "db", "2", map[string]any{"data": map[string]any{"pw": "c2VjcmV0MQ=="}})
	cur.SetAnnotations(map[string]string{"vault.example/token": "hvs.NEW", "team": "pay", "added/one": "hvs.ADDED"})
	for _, tc := range []struct {
		list         []string
		leaks, stays []string
	}{
		{[]string{"vault.example/token", "added/one"}, []string{"hvs."}, []string{`"team":"pay"`}},
		{[]string{"*"}, []string{"hvs.", `"team":"pay"`}, []string{`"team":"\u003credacted\u003e"`}},
		{nil, nil, []string{"hvs.NEW", "hvs.ADDED", `"team":"pay"`}},
	} {
		r := &Rule{Name: "r", Cluster: "c", GVR: secrets, IncludeObject: true, IncludePatch: true, SecretAnnotations: tc.list}
		d, err := New(r, Updated, cur, old, time.Now()).Data()
		if err != nil {
			t.Fatal(err)
		}
		for _, leak := range tc.leaks {
			if strings.Contains(string(d), leak) {
				t.Errorf("%v: %q in %s", tc.list, leak, d)
			}
		}
		for _, want := range tc.stays {
			if !strings.Contains(string(d), want) {
				t.Errorf("%v: %q missing from %s", tc.list, want, d)
			}
		}
	}
}

func BenchmarkMarshal(b *testing.B) {
	r := &Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}
	o := obj("ns", "cm", "1", map[string]any{"data": map[string]any{"k": strings.Repeat("v", 1000)}})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(r, Added, o, nil, time.Now()).Structured(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshalWithPatch(b *testing.B) {
	r := &Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true, IncludePatch: true}
	old := obj("ns", "cm", "1", map[string]any{"data": map[string]any{"k": strings.Repeat("v", 1000)}})
	cur := obj("ns", "cm", "2", map[string]any{"data": map[string]any{"k": strings.Repeat("w", 1000)}})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(r, Updated, cur, old, time.Now()).Structured(); err != nil {
			b.Fatal(err)
		}
	}
}

// include: [metadata] delivers apiVersion, kind and metadata only, and a
// Secret's last-applied annotation stays redacted.
func TestIncludeMetadata(t *testing.T) {
	r := &Rule{Name: "r", Cluster: "c", GVR: secrets, IncludeMeta: true, SecretAnnotations: lastApplied}
	o := obj("ns", "s", "1", map[string]any{"data": map[string]any{"k": "c2VjcmV0"}})
	o.SetAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"k":"c2VjcmV0"}}`, "team": "pay"})
	o.SetLabels(map[string]string{"app": "x"})
	d, err := New(r, Added, o, nil, time.Now()).Data()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Object map[string]any `json:"object"`
	}
	if err := json.Unmarshal(d, &got); err != nil {
		t.Fatal(err)
	}
	if _, has := got.Object["data"]; has || got.Object["kind"] != "Secret" || got.Object["apiVersion"] != "v1" {
		t.Errorf("object = %v, want apiVersion, kind and metadata only", got.Object)
	}
	if strings.Contains(string(d), "c2VjcmV0") || !strings.Contains(string(d), `"app":"x"`) {
		t.Errorf("data = %s, want labels and no secret value", d)
	}
	if _, has := o.Object["data"]; !has {
		t.Error("the cached object was modified")
	}
}

// Every event carries its change as an attribute of its own, kbchange, in
// the fixed order Attributes promises; kbreplay and kbreason only when set.
func TestAttributes(t *testing.T) {
	r := &Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}
	for _, tc := range []struct {
		tr   Transition
		want string
	}{
		{Transition{Change: Added}, "specversion id source type subject time kbrule kbcluster kbchange=added"},
		{Transition{Change: Updated, Replay: ReplayResync}, "specversion id source type subject time kbrule kbcluster kbchange=updated kbreplay=resync"},
		{Transition{Change: Deleted, Replay: ReplayCheckpoint, Reason: ReasonUnmatched}, "specversion id source type subject time kbrule kbcluster kbchange=deleted kbreplay=checkpoint kbreason=unmatched"},
	} {
		tc.tr.Object = obj("ns", "cm", "1", nil)
		ev := Build(r, tc.tr)
		var got []string
		ev.Attributes(func(name, value string) {
			if strings.HasPrefix(name, "kb") && name != "kbrule" && name != "kbcluster" {
				name += "=" + value
			}
			got = append(got, name)
		})
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: attributes %s, want %s", tc.tr.Change, strings.Join(got, " "), tc.want)
		}
		raw, err := ev.Structured()
		if err != nil {
			t.Fatal(err)
		}
		var sdk cloudevents.Event
		if err := json.Unmarshal(raw, &sdk); err != nil || sdk.Validate() != nil {
			t.Fatalf("sdk-go: %v %v", err, sdk.Validate())
		}
		if c, _ := sdk.Extensions()["kbchange"].(string); c != string(tc.tr.Change) || !strings.HasSuffix(sdk.Type(), "."+c) {
			t.Errorf("kbchange %q, type %s", c, sdk.Type())
		}
	}
}

// metadataOnly is an object as a restart rebuilds it from a checkpoint:
// metadata alone, no apiVersion, no kind.
func metadataOnly(ns, name, uid string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion("9")
	return u
}

// An object that does not carry its apiVersion and kind (rebuilt from a
// checkpoint: a deletion found at a restart) gets its resource's in the
// data, whatever the rule includes, Secrets redacted as ever: from the
// rule's Kind, an object of the resource seen (Learn), or Kubernetes'
// built-in resources. The object itself is not modified.
func TestObjectsCarryAPIVersionAndKind(t *testing.T) {
	widgets := schema.GroupVersionResource{Group: "example.io", Version: "v1", Resource: "widgets"}
	for _, tc := range []struct {
		name               string
		rule               *Rule
		learn              *unstructured.Unstructured
		apiVersion, kind   string
		absent, oldPresent bool
	}{
		{name: "built in", rule: &Rule{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}, apiVersion: "v1", kind: "ConfigMap"},
		{name: "built in, group", rule: &Rule{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, IncludeMeta: true}, apiVersion: "apps/v1", kind: "Deployment"},
		{name: "built in, irregular", rule: &Rule{GVR: schema.GroupVersionResource{Version: "v1", Resource: "endpoints"}, IncludeObject: true}, apiVersion: "v1", kind: "Endpoints"},
		{name: "secret, redacted", rule: &Rule{GVR: secrets, IncludeObject: true, IncludeOld: true}, apiVersion: "v1", kind: "Secret", oldPresent: true},
		{name: "custom, set", rule: &Rule{GVR: widgets, Kind: "Widget", IncludeObject: true}, apiVersion: "example.io/v1", kind: "Widget"},
		{name: "custom, learnt", rule: &Rule{GVR: widgets, IncludeObject: true, IncludeOld: true}, learn: &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.io/v1", "kind": "Widget"}},
			apiVersion: "example.io/v1", kind: "Widget", oldPresent: true},
		{name: "custom, another version's object teaches nothing", rule: &Rule{GVR: widgets, IncludeObject: true}, learn: &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.io/v2", "kind": "Gadget"}},
			apiVersion: "example.io/v1", absent: true},
		{name: "custom, unknown", rule: &Rule{GVR: widgets, IncludeObject: true}, apiVersion: "example.io/v1", absent: true},
	} {
		tc.rule.Name, tc.rule.Cluster = "r", "c"
		tc.rule.Learn(tc.learn)
		o := metadataOnly("ns", "a", "u1")
		o.Object["data"] = map[string]any{"k": "c2VjcmV0"}
		ev := Build(tc.rule, Transition{Change: Deleted, Object: o, Old: metadataOnly("ns", "a", "u1"), Replay: ReplayCheckpoint})
		d, err := ev.Data()
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Object, OldObject map[string]any }
		if err := json.Unmarshal(d, &got); err != nil {
			t.Fatal(err)
		}
		kind, hasKind := got.Object["kind"]
		if got.Object["apiVersion"] != tc.apiVersion || (tc.absent && hasKind) || (!tc.absent && kind != tc.kind) {
			t.Errorf("%s: object %v, want apiVersion %s, kind %q", tc.name, got.Object, tc.apiVersion, tc.kind)
		}
		if tc.oldPresent && (got.OldObject["apiVersion"] != tc.apiVersion || got.OldObject["kind"] != tc.kind) {
			t.Errorf("%s: oldObject %v, want apiVersion %s, kind %s", tc.name, got.OldObject, tc.apiVersion, tc.kind)
		}
		if ev.Kind() != tc.kind {
			t.Errorf("%s: Kind() = %q, want %q", tc.name, ev.Kind(), tc.kind)
		}
		if IsSecret(tc.rule.GVR) && strings.Contains(string(d), "c2VjcmV0") {
			t.Errorf("%s: secret value in %s", tc.name, d)
		}
		if _, has := o.Object["kind"]; has {
			t.Errorf("%s: the object was modified", tc.name)
		}
	}
	// An object that carries them keeps its own, and is not copied.
	r := &Rule{Name: "r", GVR: secrets, Kind: "Other"}
	o := obj("ns", "a", "1", nil)
	if got := r.typed(o.Object); got["kind"] != "Secret" || fmt.Sprintf("%p", got) != fmt.Sprintf("%p", o.Object) {
		t.Errorf("typed(%v) = %v, want the object itself", o.Object, got)
	}
}

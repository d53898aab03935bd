package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// cborNS is the namespace of this file's objects, on both control planes.
const cborNS = "kube-cbor"

// cborConfig is the config of every bridge here: rules whose selectors,
// CEL and changed paths read the value types CBOR could change (ints,
// floats, bools, nulls, empty maps, base64 bytes), with the whole payload.
func cborConfig(out string) string {
	return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: out
    file: {path: ` + out + `}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + cborNS + `]
    labelSelector: app=cbor
    index: {"label:tier": [front]}
    include: [object, oldObject, patch]
    sinks: [out]
  - name: deploys
    resource: apps/v1/deployments
    namespaces: [` + cborNS + `]
    fieldSelector: metadata.name=web
    where: >-
      type(object.spec.replicas) == int && object.spec.replicas == 3 &&
      object.spec.template.spec.containers[0].resources.limits.cpu == '1500m' &&
      object.spec.template.spec.containers[0].ports[0].containerPort == 8080
    include: [object, oldObject, patch]
    sinks: [out]
  - name: widgets
    resource: example.kubebridge.io/v1/widgets
    namespaces: [` + cborNS + `]
    where: >-
      type(object.spec.count) == int && object.spec.count >= 2 &&
      type(object.spec.ratio) == double && object.spec.ratio > 0.5 &&
      object.spec.enabled == true && object.spec.nothing == null &&
      size(object.spec.empty) == 0 && object.spec.big == 9007199254740993
    changed: [spec.count]
    include: [object, oldObject, patch]
    sinks: [out]
  - name: secrets
    resource: v1/secrets
    namespaces: [` + cborNS + `]
    where: "object.data.k == 'aGVsbG8='"
    allowSecretData: true
    include: [object, oldObject, patch]
    sinks: [out]
`
}

// cborObjects applies step ("create", "update" or "delete") of the same
// script to cp, with a JSON client as any other writer would be.
func cborObjects(t *testing.T, cp *testenv.ControlPlane, step string) {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	res := func(gvr schema.GroupVersionResource) dynamic.ResourceInterface {
		return dyn.Resource(gvr).Namespace(cborNS)
	}
	cms := res(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	deploys := res(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"})
	secrets := res(schema.GroupVersionResource{Version: "v1", Resource: "secrets"})
	widgets := res(testenv.WidgetGVR)
	create := func(ri dynamic.ResourceInterface, doc string) {
		t.Helper()
		u := &unstructured.Unstructured{}
		must(t, u.UnmarshalJSON([]byte(doc)))
		_, err := ri.Create(ctx, u, metav1.CreateOptions{})
		must(t, err)
	}
	patch := func(ri dynamic.ResourceInterface, name, doc string) {
		t.Helper()
		_, err := ri.Patch(ctx, name, types.MergePatchType, []byte(doc), metav1.PatchOptions{})
		must(t, err)
	}
	switch step {
	case "create":
		create(cms, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings","labels":{"app":"cbor","tier":"front"},"annotations":{"n":"1"}},
			"data":{"a":"1","empty":""},"binaryData":{"bin":"AAEC/w=="}}`)
		create(cms, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"unlabelled"},"data":{"a":"1"}}`)
		create(cms, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"back","labels":{"app":"cbor","tier":"back"}}}`)
		for _, name := range []string{"web", "other"} {
			create(deploys, `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"`+name+`","labels":{"app":"web"}},
				"spec":{"replicas":3,"revisionHistoryLimit":0,"selector":{"matchLabels":{"app":"web"}},
				"strategy":{"rollingUpdate":{"maxSurge":"25%","maxUnavailable":1}},
				"template":{"metadata":{"labels":{"app":"web"}},"spec":{"terminationGracePeriodSeconds":0,
				"containers":[{"name":"c","image":"nginx:1","ports":[{"containerPort":8080}],
				"resources":{"limits":{"cpu":"1500m","memory":"1Gi"},"requests":{"cpu":"0.5","memory":"128974848","ephemeral-storage":"1e3"}}}]}}}}`)
		}
		for name, count := range map[string]int{"w1": 2, "w0": 1} {
			create(widgets, fmt.Sprintf(`{"apiVersion":"example.kubebridge.io/v1","kind":"Widget","metadata":{"name":%q},
				"spec":{"count":%d,"ratio":0.75,"enabled":true,"nothing":null,"empty":{},"emptyList":[],"big":9007199254740993,
				"max":9223372036854775807,"neg":-4,"tiny":1e-7,"huge":1e300,"whole":2.0,"note":"",
				"nested":{"l":[1,2.5,"x",null,{},[],{"deep":{"b":false}}]}}}`, name, count))
		}
		create(secrets, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"aGVsbG8=","bin":"AAEC/w=="},"stringData":{"plain":"text"}}`)
	case "update":
		patch(cms, "settings", `{"data":{"a":"2"},"metadata":{"labels":{"new":"yes"}}}`)
		_, err := deploys.Patch(ctx, "web", types.StrategicMergePatchType, []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"nginx:2"}]}}}}`), metav1.PatchOptions{})
		must(t, err)
		patch(widgets, "w1", `{"spec":{"note":"not in changed: no event"}}`)
		patch(widgets, "w1", `{"spec":{"count":3,"ratio":1.25,"nested":{"l":[]}}}`)
		patch(secrets, "s", `{"data":{"extra":"AQ=="}}`)
	case "delete":
		must(t, cms.Delete(ctx, "settings", metav1.DeleteOptions{}))
	}
}

// cborWant is what every bridge delivers after each step of cborObjects.
var cborWant = map[string][]string{
	"create": {"cms settings added", "deploys web added", "widgets w1 added", "secrets s added"},
	"update": {"cms settings added", "cms settings updated", "deploys web added", "deploys web updated",
		"widgets w1 added", "widgets w1 updated", "secrets s added", "secrets s updated"},
	"delete": {"cms settings added", "cms settings updated", "cms settings deleted", "deploys web added", "deploys web updated",
		"widgets w1 added", "widgets w1 updated", "secrets s added", "secrets s updated"},
}

// rawEvent is a delivered event with its data as the bytes the sink wrote.
type rawEvent struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Rule    string          `json:"kbrule"`
	Replay  string          `json:"kbreplay"`
	Data    json.RawMessage `json:"data"`
}

func (e rawEvent) key() string {
	return e.Rule + " " + e.Subject[strings.LastIndex(e.Subject, "/")+1:] + " " + e.Type[strings.LastIndex(e.Type, ".")+1:]
}

func readRawEvents(t *testing.T, path string) []rawEvent {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	must(t, err)
	data = data[:bytes.LastIndexByte(data, '\n')+1] // a line still being written is left for the next read
	var out []rawEvent
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e rawEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: bad line %q: %v", path, sc.Bytes(), err)
		}
		out = append(out, e)
	}
	return out
}

func keys(evs []rawEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.key()
	}
	sort.Strings(out)
	return out
}

// waitKeys waits until path holds exactly the events want (in any order
// across objects).
func waitKeys(t *testing.T, path string, want []string) []rawEvent {
	t.Helper()
	want = append([]string(nil), want...)
	sort.Strings(want)
	var evs []rawEvent
	eventually(t, 30*time.Second, func() error {
		evs = readRawEvents(t, path)
		if got := keys(evs); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("%s: waiting for\n  %v\nhave\n  %v", path, want, got)
		}
		return nil
	})
	return evs
}

// clusterFree is an event's data without what differs between two
// clusters given the same writes: uids, resourceVersions, timestamps.
func clusterFree(t *testing.T, data json.RawMessage) string {
	t.Helper()
	var d map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // exact integers
	must(t, dec.Decode(&d))
	for _, k := range []string{"object", "oldObject"} {
		if o, ok := d[k].(map[string]any); ok {
			md, _ := o["metadata"].(map[string]any)
			for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "managedFields"} {
				delete(md, f)
			}
		}
	}
	if ops, ok := d["patch"].([]any); ok {
		var kept []any
		for _, op := range ops {
			if m, _ := op.(map[string]any); m["path"] != "/metadata/resourceVersion" {
				kept = append(kept, op)
			}
		}
		d["patch"] = kept
	}
	out, err := json.Marshal(d)
	must(t, err)
	return string(out)
}

// startLine is the bridge's "starting" log line.
func startLine(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg=starting`) {
			return l
		}
	}
	return "(no start line)"
}

// idFree is an event id without its tag, which each bridge draws for
// itself: <uid>.<resourceVersion>.<type>.
func idFree(id string) string {
	parts := strings.Split(id, ".")
	if len(parts) != 4 {
		return id
	}
	return parts[0] + "." + parts[2] + "." + parts[3]
}

// informerPaths are the collections the bridges here list and watch.
var informerPaths = []string{
	"/api/v1/namespaces/" + cborNS + "/configmaps",
	"/apis/apps/v1/namespaces/" + cborNS + "/deployments",
	"/apis/example.kubebridge.io/v1/namespaces/" + cborNS + "/widgets",
	"/api/v1/namespaces/" + cborNS + "/secrets",
}

// checkEncoding checks what the apiserver answered the informers' lists and
// watches through rec: each collection was read, with a watch, the Accept
// header offered CBOR or not (offered), and every successful answer had a
// Content-Type matching want.
func checkEncoding(t *testing.T, name string, rec *testenv.APIRecorder, offered bool, want *regexp.Regexp) {
	t.Helper()
	byPath := map[string][]testenv.APIExchange{}
	for _, e := range rec.Exchanges() {
		byPath[e.Path] = append(byPath[e.Path], e)
	}
	for _, p := range informerPaths {
		watched := false
		for _, e := range byPath[p] {
			if e.Method != http.MethodGet || e.Status != http.StatusOK {
				continue
			}
			watched = watched || e.Watch()
			if strings.Contains(e.Accept, "application/cbor") != offered {
				t.Errorf("%s: GET %s?%s sent Accept %q; CBOR offered = %v, want %v", name, p, e.RawQuery, e.Accept, !offered, offered)
			}
			if !want.MatchString(e.ContentType) {
				t.Errorf("%s: GET %s?%s was answered in %q, want %s", name, p, e.RawQuery, e.ContentType, want)
			}
		}
		if !watched {
			t.Errorf("%s: no successful watch of %s went through the recorder: %+v", name, p, byPath[p])
		}
	}
}

// With the defaults, the bridge reads CBOR from an apiserver that serves it
// (CBORServingAndStorage on) and JSON from one that does not, and its events
// are the same byte for byte as with --kube-cbor=false, and the same as
// from a JSON-only apiserver but for uids, resourceVersions and times:
// built-in objects with nested ints and quantities, a CRD object with
// floats, int64s, bools, nulls and empty maps, Secret bytes; selectors, CEL
// where, changed paths and index terms decide the same. The typed clients
// (preflight's reviews, discovery, the leader Lease, /replay's TokenReview
// and SubjectAccessReview) work against the CBOR apiserver, and a
// checkpoint written by a JSON bridge is taken over by a CBOR one without
// a spurious event; CBOR watches survive an apiserver restart.
func TestKubeCBOR(t *testing.T) {
	t.Parallel() // client-go's own switch is out of the environment (TestMain)
	on := testenv.StartControlPlaneWithOptions(t, testenv.ControlPlaneOptions{FeatureGates: []string{"CBORServingAndStorage=true"}})
	off := testenv.SharedControlPlane(t)
	for _, cp := range []*testenv.ControlPlane{on, off} {
		testenv.InstallWidgetCRD(t, cp)
		testenv.EnsureNamespace(t, cp, cborNS)
	}

	dir := t.TempDir()
	type bridge struct {
		name string
		cp   *testenv.ControlPlane
		rec  *testenv.APIRecorder
		out  string
		proc *bridgeProc
	}
	jsonCheckpoint := filepath.Join(dir, "json-state.db")
	bridges := []*bridge{
		{name: "cbor", cp: on}, {name: "json", cp: on}, {name: "gate-off", cp: off},
	}
	for _, b := range bridges {
		b.rec = testenv.StartAPIRecorder(t, b.cp)
		kc, err := b.rec.Kubeconfig(t.TempDir())
		must(t, err)
		b.out = filepath.Join(dir, b.name+".jsonl")
		opts := []bridgeOption{withKubeconfig(kc), withFlags("--allow-secret-data")}
		switch b.name {
		case "cbor":
			opts = append(opts, withFlags("--leader-elect", "--leader-elect-namespace", cborNS, "--leader-elect-retry-period", "200ms"))
		case "json":
			opts = append(opts, withFlags("--kube-cbor=false"), withCheckpointFile(jsonCheckpoint))
		}
		b.proc = startBridge(t, b.cp, cborConfig(b.out), opts...)
	}
	if !strings.Contains(bridges[0].proc.log(), "kubeCBOR=true kubeCBORFrom=default") ||
		!strings.Contains(bridges[1].proc.log(), "kubeCBOR=false kubeCBORFrom=--kube-cbor") {
		t.Errorf("the start lines do not say how the bridges read the cluster:\n%s\n%s", startLine(bridges[0].proc.log()), startLine(bridges[1].proc.log()))
	}

	for _, step := range []string{"create", "update", "delete"} {
		cborObjects(t, on, step)
		cborObjects(t, off, step)
		for _, b := range bridges {
			waitKeys(t, b.out, cborWant[step])
		}
	}

	events := map[string]map[string]rawEvent{}
	for _, b := range bridges {
		events[b.name] = map[string]rawEvent{}
		for _, e := range readRawEvents(t, b.out) {
			events[b.name][e.key()] = e
		}
	}
	for k, c := range events["cbor"] {
		j := events["json"][k]
		if idFree(c.ID) != idFree(j.ID) || !bytes.Equal(c.Data, j.Data) {
			t.Errorf("%s differs between CBOR and JSON from the same apiserver:\ncbor %s %s\njson %s %s", k, c.ID, c.Data, j.ID, j.Data)
		}
		if a, b := clusterFree(t, c.Data), clusterFree(t, events["gate-off"][k].Data); a != b {
			t.Errorf("%s differs between the CBOR and the JSON-only apiserver:\ncbor     %s\ngate-off %s", k, a, b)
		}
	}
	// The payloads hold what the rules tested: a check that they are real.
	if w := string(events["cbor"]["widgets w1 updated"].Data); !strings.Contains(w, `"big":9007199254740993`) ||
		!strings.Contains(w, `"max":9223372036854775807`) || !strings.Contains(w, `"nothing":null`) || !strings.Contains(w, `"count":3`) {
		t.Errorf("widget payload: %s", w)
	}
	if s := string(events["cbor"]["secrets s updated"].Data); !strings.Contains(s, `"bin":"AAEC/w=="`) || !strings.Contains(s, `"plain":"dGV4dA=="`) {
		t.Errorf("secret payload (base64 bytes): %s", s)
	}

	cborRE, jsonRE := regexp.MustCompile(`^application/cbor(-seq)?$`), regexp.MustCompile(`^application/json(;|$)`)
	checkEncoding(t, "defaults, gate on", bridges[0].rec, true, cborRE)
	checkEncoding(t, "--kube-cbor=false, gate on", bridges[1].rec, false, jsonRE)
	checkEncoding(t, "defaults, gate off", bridges[2].rec, true, jsonRE)
	// The typed clients did their work on the CBOR apiserver.
	for _, want := range []string{"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "/apis/coordination.k8s.io/v1/namespaces/" + cborNS + "/leases"} {
		ok := false
		for _, e := range bridges[0].rec.Exchanges() {
			ok = ok || (strings.HasPrefix(e.Path, want) && e.Status/100 == 2)
		}
		if !ok {
			t.Errorf("no successful request to %s from the CBOR bridge", want)
		}
	}

	// /replay on the CBOR bridge: TokenReview and SubjectAccessReview.
	token := saToken(t, on, "cbor-replayer", true)
	req, err := http.NewRequest(http.MethodPost, bridges[0].proc.adminURL()+"/replay?sink=out", nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"done":true`) {
		t.Errorf("/replay on the CBOR bridge: %d %s", resp.StatusCode, body)
	}
	waitEvents(t, bridges[0].out, "the replay", func(evs []ce) bool {
		n := 0
		for _, e := range evs {
			if e.Replay == "resync" {
				n++
			}
		}
		return n == 3 // web, w1, s
	})

	// `bridge replay --config` reads CBOR too.
	rec := testenv.StartAPIRecorder(t, on)
	kc, err := rec.Kubeconfig(t.TempDir())
	must(t, err)
	cfg := filepath.Join(dir, "replay.yaml")
	must(t, writeFile(cfg, cborConfig(filepath.Join(dir, "replay.jsonl"))))
	res, code := runBridgeCommand(t, "replay", "--config", cfg, "--kubeconfig", kc, "--sink", "out", "--allow-secret-data")
	if code != 0 || !regexp.MustCompile(`(?m)^replay to sink out: 3 events delivered$`).MatchString(res) {
		t.Errorf("bridge replay --config: exit status %d\n%s", code, res)
	}
	checkEncoding(t, "bridge replay --config", rec, true, cborRE)

	// The JSON bridge's checkpoint, taken over by a CBOR bridge: only what
	// changed meanwhile is delivered.
	bridges[1].proc.stop()
	_, err = dynamic.NewForConfigOrDie(on.RESTConfig()).Resource(testenv.WidgetGVR).Namespace(cborNS).
		Patch(context.Background(), "w1", types.MergePatchType, []byte(`{"spec":{"count":5}}`), metav1.PatchOptions{})
	must(t, err)
	after := filepath.Join(dir, "after.jsonl")
	b := startBridge(t, on, cborConfig(after), withFlags("--allow-secret-data"), withCheckpointFile(jsonCheckpoint))
	evs := waitKeys(t, after, []string{"widgets w1 updated"})
	if evs[0].Replay != "checkpoint" || !strings.Contains(string(evs[0].Data), `"count":5`) {
		t.Errorf("after the switch: %s %s", evs[0].Replay, evs[0].Data)
	}
	admin := b.adminURL()
	testenv.Eventually(t, 10*time.Second, "/readyz", func() bool { code, _ := get(t, admin+"/readyz"); return code == http.StatusOK })
	time.Sleep(time.Second)
	if got := keys(readRawEvents(t, after)); len(got) != 1 {
		t.Errorf("a CBOR bridge on a JSON bridge's checkpoint delivered %v, want only the change made meanwhile", got)
	}

	// CBOR watches broken by an apiserver restart are resumed: a change
	// after it arrives once. (The leader stops first: its lease would
	// expire.)
	bridges[0].proc.stop()
	must(t, on.RestartAPIServer())
	_, err = dynamic.NewForConfigOrDie(on.RESTConfig()).Resource(testenv.WidgetGVR).Namespace(cborNS).
		Patch(context.Background(), "w1", types.MergePatchType, []byte(`{"spec":{"count":6}}`), metav1.PatchOptions{})
	must(t, err)
	evs = waitKeys(t, after, []string{"widgets w1 updated", "widgets w1 updated"})
	if last := evs[len(evs)-1]; last.Replay != "" || !strings.Contains(string(last.Data), `"count":6`) {
		t.Errorf("after the restart: %s %s", last.Replay, last.Data)
	}
}

// The chart passes kubeCBOR to `bridge run` as --kube-cbor, on by default;
// its schema refuses anything but a bool.
func TestChartKubeCBOR(t *testing.T) {
	t.Parallel()
	for set, want := range map[string]string{"": "--kube-cbor=true", "kubeCBOR=false": "--kube-cbor=false", "kubeCBOR=true": "--kube-cbor=true"} {
		args := []string{"template", "kb", chartDir, "--namespace", "kb-system"}
		if set != "" {
			args = append(args, "--set", set)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm template --set %q: %v\n%s", set, err, out)
		}
		if !strings.Contains(out, "            - "+want+"\n") {
			t.Errorf("--set %q: no %s in the args:\n%s", set, want, out)
		}
	}
	if out, err := helm(t, "template", "kb", chartDir, "--set", "kubeCBOR=yes"); err == nil || !strings.Contains(out, "kubeCBOR") {
		t.Errorf("kubeCBOR=yes rendered: %v\n%s", err, out)
	}
}

package e2e

// Tests of the level-based delivery contract (docs/guarantees.md):
// a rule is a view, the checkpoint holds the view each sink acknowledged
// for every rule whatever its events, and every transition is the diff
// between the desired and the acknowledged view. Each test asserts the exact
// sequence of transitions per object uid that a consumer mirroring the
// rule's events must see.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// ---------------------------------------------------------------- helpers

// viewRule is a rule on resource that delivers to "out"; extra is more YAML
// for the rule, each line indented by four spaces (events, selectors).
func viewRule(name, resource string, extra ...string) string {
	s := "  - name: " + name + "\n    resource: " + resource + "\n    sinks: [out]\n"
	for _, e := range extra {
		s += "    " + e + "\n"
	}
	return s
}

// viewUIDOf is the uid of the object an event carries (data.object).
func viewUIDOf(e ce) string {
	uid, _, _ := unstructured.NestedString(e.Data.Object, "metadata", "uid")
	return uid
}

func viewRVOf(e ce) string {
	rv, _, _ := unstructured.NestedString(e.Data.Object, "metadata", "resourceVersion")
	return rv
}

// viewEvents returns rule's events for subject, in order.
func viewEvents(evs []ce, rule, subject string) []ce {
	var out []ce
	for _, e := range evs {
		if e.Rule == rule && e.Subject == subject {
			out = append(out, e)
		}
	}
	return out
}

// viewSeq renders events as "change(uidN)" ("deleted:unmatched(uid1)" with
// a kbreason), uids named by names (uid -> "uid1"); unknown uids verbatim.
func viewSeq(evs []ce, names map[string]string) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		c := e.change()
		if e.Reason != "" {
			c += ":" + e.Reason
		}
		uid := viewUIDOf(e)
		if n, ok := names[uid]; ok {
			uid = n
		} else if uid == "" {
			uid = "no-uid"
		}
		out = append(out, c+"("+uid+")")
	}
	return out
}

func viewSame(got, want []string) bool {
	return strings.Join(got, ",") == strings.Join(want, ",")
}

// viewDump renders events for failure messages.
func viewDump(evs []ce) string {
	var lines []string
	for _, e := range evs {
		lines = append(lines, fmt.Sprintf("rule=%s %s %s uid=%s rv=%s id=%s replay=%q reason=%q", e.Rule, e.change(), e.Subject, viewUIDOf(e), viewRVOf(e), e.ID, e.Replay, e.Reason))
	}
	if len(lines) == 0 {
		return "  (none)"
	}
	return "  " + strings.Join(lines, "\n  ")
}

// viewDistinctIDs reports ids carried by more than one of evs.
func viewDistinctIDs(evs []ce) []string {
	seen := map[string]int{}
	var dup []string
	for _, e := range evs {
		seen[e.ID]++
		if seen[e.ID] == 2 {
			dup = append(dup, e.ID)
		}
	}
	return dup
}

// viewMetric reads one sample from the admin endpoint; ok is false when the
// endpoint or the sample is missing.
func viewMetric(adminURL, name string) (float64, bool) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(adminURL + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}

// viewSettle waits until sink has acknowledged at least n events and the
// checkpoint has no unwritten change (kubebridge_checkpoint_lag 0 in two
// samples in a row), so that a SIGKILL loses no acknowledged state. Should
// the lag metric be gone, it waits out the default flush interval (1s).
func viewSettle(t *testing.T, adminURL, sink string, n int) {
	t.Helper()
	delivered := `kubebridge_sink_delivered_total{sink="` + sink + `"}`
	if !poll(30*time.Second, func() bool { v, ok := viewMetric(adminURL, delivered); return ok && v >= float64(n) }) {
		v, _ := viewMetric(adminURL, delivered)
		t.Fatalf("precondition: sink %s acknowledged %v events, want %d", sink, v, n)
	}
	if _, ok := viewMetric(adminURL, "kubebridge_checkpoint_lag"); !ok {
		t.Log("no kubebridge_checkpoint_lag metric: waiting 1.5s for the checkpoint flush")
		time.Sleep(1500 * time.Millisecond)
		return
	}
	zeroes := 0
	if !poll(30*time.Second, func() bool {
		if v, ok := viewMetric(adminURL, "kubebridge_checkpoint_lag"); ok && v == 0 {
			zeroes++
		} else {
			zeroes = 0
		}
		return zeroes >= 3
	}) {
		t.Fatal("precondition: the checkpoint did not catch up within 30s")
	}
}

func viewCreateCM(t *testing.T, cs kubernetes.Interface, ns, name string, data map[string]string) *corev1.ConfigMap {
	t.Helper()
	cm, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{})
	must(t, err)
	return cm
}

func viewNamespace(t *testing.T, cs kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	must(t, err)
}

// viewStreamMsg is one message of a JetStream stream.
type viewStreamMsg struct {
	seq   uint64
	msgID string // Nats-Msg-Id
	ev    ce
}

// viewStream reads every message of stream name (none when it does not exist yet).
func viewStream(t *testing.T, js jetstream.JetStream, name string) []viewStreamMsg {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil
	}
	var out []viewStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var e ce
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatalf("stream %s seq %d: not a structured CloudEvent: %v: %s", name, seq, err, m.Data)
		}
		e.raw = m.Data
		out = append(out, viewStreamMsg{seq: seq, msgID: m.Header.Get(natsgo.MsgIdHdr), ev: e})
	}
	return out
}

func viewStreamEvents(msgs []viewStreamMsg) []ce {
	out := make([]ce, len(msgs))
	for i, m := range msgs {
		out[i] = m.ev
	}
	return out
}

func viewJetStream(t *testing.T, srv *testenv.NATS) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	must(t, err)
	return js
}

// ---------------------------------------------------------------- 1

// An object deleted and re-created under the same name (a new uid) while
// the bridge is down (SIGTERM, or SIGKILL after the checkpoint settled)
// reaches the sink after the restart as deleted(old uid) then added(new
// uid), both with kbreplay checkpoint, so that a consumer keyed by uid
// drops the old object.
func TestViewRecreatedWhileStopped(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	for _, mode := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGTERM", syscall.SIGTERM}, {"SIGKILL", syscall.SIGKILL}} {
		t.Run(mode.name, func(t *testing.T) {
			ns := "vw-recreate-" + strings.ToLower(mode.name)
			testenv.EnsureNamespace(t, cp, ns)
			out := filepath.Join(t.TempDir(), "events.jsonl")
			b := startBridge(t, cp, fileConfig(out, rule("cms", "v1/configmaps", ns)), withRestartFlags())
			subject := ns + "/x"
			first := viewCreateCM(t, cs, ns, "x", map[string]string{"gen": "1"})
			uid1 := string(first.UID)
			waitEvents(t, out, "added(uid1)", func(evs []ce) bool { return len(viewEvents(evs, "cms", subject)) >= 1 })
			viewSettle(t, b.adminURL(), "out", 1)
			b.stopWith(mode.sig)

			must(t, cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), "x", metav1.DeleteOptions{}))
			second := viewCreateCM(t, cs, ns, "x", map[string]string{"gen": "2"})
			uid2 := string(second.UID)
			if uid1 == uid2 {
				t.Fatal("the re-created object has the same uid")
			}
			names := map[string]string{uid1: "uid1", uid2: "uid2"}

			b.start() // on the same checkpoint
			poll(30*time.Second, func() bool {
				for _, e := range viewEvents(readEvents(t, out), "cms", subject) {
					if viewUIDOf(e) == uid2 {
						return true
					}
				}
				return false
			})
			// The new object's transition is there (or 30s passed): the
			// old one's deletion must precede it.
			evs := viewEvents(readEvents(t, out), "cms", subject)
			want := []string{"added(uid1)", "deleted(uid1)", "added(uid2)"}
			if got := viewSeq(evs, names); !viewSame(got, want) {
				t.Fatalf("after a %s restart, rule cms %s: got %v, want %v (a consumer keyed by uid still holds uid1):\n%s", mode.name, subject, got, want, viewDump(evs))
			}
			for _, e := range evs[1:] {
				if e.Replay != "checkpoint" {
					t.Errorf("%s(%s) found at start has kbreplay %q, want checkpoint", e.change(), names[viewUIDOf(e)], e.Replay)
				}
			}
			if dup := viewDistinctIDs(evs); len(dup) > 0 {
				t.Errorf("ids shared by distinct transitions: %v\n%s", dup, viewDump(evs))
			}
		})
	}
}

// ---------------------------------------------------------------- 2

// The same, while the bridge's watch is broken: a second apiserver on the
// same etcd deletes and re-creates the object, the watched apiserver comes
// back and the informer relists. The sink gets deleted(uid1) then
// added(uid2); a second rule on the same sink with events: [deleted] gets
// deleted(uid1).
func TestViewRecreatedWhileWatchBroken(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t)
	const ns = "vw-gap"
	testenv.EnsureNamespace(t, cp, ns)
	out := filepath.Join(t.TempDir(), "events.jsonl")
	b := startBridge(t, cp, fileConfig(out,
		viewRule("cms", "v1/configmaps", "namespaces: ["+ns+"]"),
		viewRule("dels", "v1/configmaps", "namespaces: ["+ns+"]", "events: [deleted]")))
	cs := cp.Clientset(t)
	ctx := context.Background()
	subject := ns + "/x"
	uid1 := string(viewCreateCM(t, cs, ns, "x", map[string]string{"gen": "1"}).UID)
	waitEvents(t, out, "added(uid1)", func(evs []ce) bool { return len(viewEvents(evs, "cms", subject)) >= 1 })
	viewSettle(t, b.adminURL(), "out", 1)

	var uid2 string
	cp.WhileAPIServerDown(t, func(alt *rest.Config) {
		altCS := kubernetes.NewForConfigOrDie(alt)
		must(t, altCS.CoreV1().ConfigMaps(ns).Delete(ctx, "x", metav1.DeleteOptions{}))
		uid2 = string(viewCreateCM(t, altCS, ns, "x", map[string]string{"gen": "2"}).UID)
	})
	names := map[string]string{uid1: "uid1", uid2: "uid2"}

	poll(60*time.Second, func() bool {
		evs := readEvents(t, out)
		seenUID2 := false
		for _, e := range viewEvents(evs, "cms", subject) {
			seenUID2 = seenUID2 || viewUIDOf(e) == uid2
		}
		return seenUID2 && len(viewEvents(evs, "dels", subject)) >= 1
	})
	evs := readEvents(t, out)
	cms, dels := viewEvents(evs, "cms", subject), viewEvents(evs, "dels", subject)
	if got, want := viewSeq(cms, names), []string{"added(uid1)", "deleted(uid1)", "added(uid2)"}; !viewSame(got, want) {
		t.Errorf("rule cms %s: got %v, want %v:\n%s", subject, got, want, viewDump(cms))
	}
	if got, want := viewSeq(dels, names), []string{"deleted(uid1)"}; !viewSame(got, want) {
		t.Errorf("rule dels (events: [deleted]) %s: got %v, want %v:\n%s", subject, got, want, viewDump(dels))
	}
	if dup := viewDistinctIDs(append(cms, dels...)); len(dup) > 0 {
		t.Errorf("ids shared by distinct transitions: %v\n%s", dup, viewDump(append(cms, dels...)))
	}
}

// ---------------------------------------------------------------- 3

// events: filters what is delivered, never what is recorded. A rule with
// events: [deleted] gets, after a restart, the deletion of an object that
// was in its view before the bridge went down (SIGTERM, or SIGKILL once the
// checkpoint settled) and was deleted meanwhile; a rule with events:
// [updated, deleted] gets an update made during the outage. Neither was
// ever sent the object's addition.
func TestViewFilteredEventsAcrossRestart(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	for _, mode := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGTERM", syscall.SIGTERM}, {"SIGKILL", syscall.SIGKILL}} {
		t.Run(mode.name, func(t *testing.T) {
			ns := "vw-filtered-" + strings.ToLower(mode.name)
			testenv.EnsureNamespace(t, cp, ns)
			out := filepath.Join(t.TempDir(), "events.jsonl")
			sel := "namespaces: [" + ns + "]"
			b := startBridge(t, cp, fileConfig(out,
				viewRule("all", "v1/configmaps", sel),
				viewRule("dels", "v1/configmaps", sel, "events: [deleted]"),
				viewRule("upds", "v1/configmaps", sel, "events: [updated, deleted]")), withRestartFlags())
			gone := viewCreateCM(t, cs, ns, "gone", map[string]string{"v": "1"})
			changed := viewCreateCM(t, cs, ns, "changed", map[string]string{"v": "1"})
			names := map[string]string{string(gone.UID): "gone", string(changed.UID): "changed"}
			goneSubj, changedSubj := ns+"/gone", ns+"/changed"
			// Barrier: rule all saw both, and one queue carries all three rules.
			waitEvents(t, out, "rule all: both added", func(evs []ce) bool {
				return len(viewEvents(evs, "all", goneSubj)) == 1 && len(viewEvents(evs, "all", changedSubj)) == 1
			})
			viewSettle(t, b.adminURL(), "out", 2)
			for _, e := range readEvents(t, out) {
				if e.Rule != "all" {
					t.Fatalf("rule %s was delivered %s before any deletion or update:\n%s", e.Rule, e.change(), viewDump(readEvents(t, out)))
				}
			}
			b.stopWith(mode.sig)

			must(t, cs.CoreV1().ConfigMaps(ns).Delete(ctx, "gone", metav1.DeleteOptions{}))
			upd, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, "changed", types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{})
			must(t, err)

			b.start() // on the same checkpoint
			poll(30*time.Second, func() bool {
				evs := readEvents(t, out)
				return len(viewEvents(evs, "all", goneSubj)) >= 2 && len(viewEvents(evs, "all", changedSubj)) >= 2 &&
					len(viewEvents(evs, "dels", goneSubj)) >= 1 && len(viewEvents(evs, "upds", goneSubj)) >= 1 && len(viewEvents(evs, "upds", changedSubj)) >= 1
			})
			evs := readEvents(t, out)
			for _, c := range []struct {
				rule, subject string
				want          []string
			}{
				{"all", goneSubj, []string{"added(gone)", "deleted(gone)"}},
				{"all", changedSubj, []string{"added(changed)", "updated(changed)"}},
				{"dels", goneSubj, []string{"deleted(gone)"}},
				{"dels", changedSubj, nil},
				{"upds", goneSubj, []string{"deleted(gone)"}},
				{"upds", changedSubj, []string{"updated(changed)"}},
			} {
				got := viewEvents(evs, c.rule, c.subject)
				if !viewSame(viewSeq(got, names), c.want) {
					t.Errorf("after a %s restart, rule %s %s: got %v, want %v:\n%s", mode.name, c.rule, c.subject, viewSeq(got, names), c.want, viewDump(got))
					continue
				}
				for _, e := range got {
					if e.change() == "added" {
						continue // the live addition before the outage
					}
					if e.Replay != "checkpoint" {
						t.Errorf("rule %s: %s found at start has kbreplay %q, want checkpoint", c.rule, e.change(), e.Replay)
					}
					if e.change() == "updated" && viewRVOf(e) != upd.ResourceVersion {
						t.Errorf("rule %s: the update carries rv %s, want the current %s", c.rule, viewRVOf(e), upd.ResourceVersion)
					}
				}
			}
			if dup := viewDistinctIDs(evs); len(dup) > 0 {
				t.Errorf("ids shared by distinct transitions: %v\n%s", dup, viewDump(evs))
			}
		})
	}
}

// ---------------------------------------------------------------- 4

// A namespace that leaves and re-enters a rule's namespaceSelector, with
// its object unchanged, makes the object leave (deleted, kbreason
// unmatched) and enter (added) the view each time. Published to a JetStream
// stream with the default 2 min duplicate window, every transition must be
// stored: distinct ids, nothing dropped as a duplicate.
func TestViewNamespaceReentryJetStream(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns, label = "vw-reenter", "vw-reenter"
	viewNamespace(t, cs, ns, map[string]string{label: "on"})
	obj := viewCreateCM(t, cs, ns, "o", map[string]string{"v": "1"})
	names := map[string]string{string(obj.UID): "uid1"}
	srv := testenv.StartNATS(t)
	b := startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: bus
    nats: {url: "`+srv.ClientURL()+`", jetstream: true, stream: {name: VIEWREENTER}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: sel
    resource: v1/configmaps
    namespaceSelector: "`+label+`=on"
    sinks: [bus]
`)
	js := viewJetStream(t, srv)
	admin := b.adminURL()
	delivered := `kubebridge_sink_delivered_total{sink="bus"}`
	subject := ns + "/o"

	// Each step: the namespace's label, and the transition it must cause.
	steps := []struct{ value, want string }{
		{"on", "added(uid1)"}, // at start
		{"off", "deleted:unmatched(uid1)"},
		{"on", "added(uid1)"},
		{"off", "deleted:unmatched(uid1)"},
	}
	var want []string
	for i, step := range steps {
		if i > 0 {
			_, err := cs.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+label+`":"`+step.value+`"}}}`), metav1.PatchOptions{})
			must(t, err)
		}
		want = append(want, step.want)
		n := len(want)
		// The bridge acknowledges the publish (PubAck, duplicates included)...
		if !poll(30*time.Second, func() bool { v, ok := viewMetric(admin, delivered); return ok && v >= float64(n) }) {
			v, _ := viewMetric(admin, delivered)
			t.Fatalf("step %d (namespace label %s): the bridge acknowledged %v publishes, want %d; stream:\n%s", i, step.value, v, n, viewDump(viewStreamEvents(viewStream(t, js, "VIEWREENTER"))))
		}
		// ...and PubAck means stored, unless JetStream took it for a duplicate.
		poll(3*time.Second, func() bool { return len(viewStream(t, js, "VIEWREENTER")) >= n })
		got := viewStreamEvents(viewStream(t, js, "VIEWREENTER"))
		if !viewSame(viewSeq(viewEvents(got, "sel", subject), names), want) {
			v, _ := viewMetric(admin, delivered)
			t.Errorf("step %d (namespace label %s): the bridge acknowledged %v publishes, the stream holds %d; want %v, stream has %v (dropped as duplicates: same id as an earlier transition?):\n%s",
				i, step.value, v, len(got), want, viewSeq(viewEvents(got, "sel", subject), names), viewDump(got))
		}
	}
	msgs := viewStream(t, js, "VIEWREENTER")
	got := viewStreamEvents(msgs)
	if dup := viewDistinctIDs(got); len(dup) > 0 {
		t.Errorf("ids shared by distinct transitions in the stream: %v", dup)
	}
	for _, m := range msgs {
		if m.msgID != m.ev.ID {
			t.Errorf("seq %d: Nats-Msg-Id %q differs from the event id %q", m.seq, m.msgID, m.ev.ID)
		}
	}
	if v, _ := viewMetric(admin, delivered); int(v) != len(msgs) {
		t.Errorf("the bridge acknowledged %v publishes but the stream holds %d: JetStream dropped the rest as duplicates:\n%s", v, len(msgs), viewDump(got))
	}
}

// ---------------------------------------------------------------- 5

// Two rules matching the same object, both publishing to one JetStream
// stream: each rule's transitions are stored, under distinct ids.
func TestViewTwoRulesOneStream(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "vw-two-rules"
	testenv.EnsureNamespace(t, cp, ns)
	srv := testenv.StartNATS(t)
	b := startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: bus
    nats: {url: "`+srv.ClientURL()+`", jetstream: true, stream: {name: VIEWTWO}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: one
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [bus]
  - name: two
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [bus]
`)
	js := viewJetStream(t, srv)
	admin := b.adminURL()
	delivered := `kubebridge_sink_delivered_total{sink="bus"}`
	obj := viewCreateCM(t, cs, ns, "o", map[string]string{"v": "1"})
	_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, "o", types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{})
	must(t, err)
	names := map[string]string{string(obj.UID): "uid1"}
	if !poll(30*time.Second, func() bool { v, ok := viewMetric(admin, delivered); return ok && v >= 4 }) {
		v, _ := viewMetric(admin, delivered)
		t.Fatalf("the bridge acknowledged %v publishes, want 4 (2 rules x added, updated); stream:\n%s", v, viewDump(viewStreamEvents(viewStream(t, js, "VIEWTWO"))))
	}
	poll(3*time.Second, func() bool { return len(viewStream(t, js, "VIEWTWO")) >= 4 })
	msgs := viewStream(t, js, "VIEWTWO")
	got := viewStreamEvents(msgs)
	subject := ns + "/o"
	for _, r := range []string{"one", "two"} {
		if seq, want := viewSeq(viewEvents(got, r, subject), names), []string{"added(uid1)", "updated(uid1)"}; !viewSame(seq, want) {
			t.Errorf("rule %s in the stream: got %v, want %v", r, seq, want)
		}
	}
	if dup := viewDistinctIDs(got); len(dup) > 0 {
		t.Errorf("ids shared by the two rules' transitions: %v", dup)
	}
	if v, _ := viewMetric(admin, delivered); int(v) != len(msgs) {
		t.Errorf("the bridge acknowledged %v publishes but the stream holds %d (JetStream dropped the rest as duplicates):\n%s", v, len(msgs), viewDump(got))
	}
}

// ---------------------------------------------------------------- 6

// A webhook receiver that answers POST with 301 (to another path of the
// same server, which answers GET with 200) has not taken the event: the
// bridge must neither count it delivered nor acknowledge it, and once the
// receiver accepts POSTs the event arrives as a POST with its body.
func TestViewWebhookRedirectIsNotDelivery(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	const ns = "vw-redirect"
	testenv.EnsureNamespace(t, cp, ns)

	var mu sync.Mutex
	accept := false
	var redirected, gets int
	type post struct {
		header http.Header
		body   []byte
	}
	var accepted []post
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodGet:
			gets++
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodPost && !accept:
			redirected++
			w.Header().Set("Location", "/moved")
			w.WriteHeader(http.StatusMovedPermanently)
		case r.Method == http.MethodPost:
			accepted = append(accepted, post{r.Header.Clone(), body})
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	defer hook.Close()
	counts := func() (int, int, int) {
		mu.Lock()
		defer mu.Unlock()
		return redirected, gets, len(accepted)
	}

	b := startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook: {url: "`+hook.URL+`/events"}
    retry: {initialInterval: 100ms, maxInterval: 500ms}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [hook]
`)
	admin := b.adminURL()
	metricOf := func(name string) float64 { v, _ := viewMetric(admin, name+`{sink="hook"}`); return v }
	obj := viewCreateCM(t, cs, ns, "o", map[string]string{"v": "1"})

	// Either the bridge took the redirect for a delivery, or it retried.
	if !poll(30*time.Second, func() bool {
		r, _, _ := counts()
		return r >= 3 || metricOf("kubebridge_sink_delivered_total") > 0
	}) {
		r, g, _ := counts()
		t.Fatalf("the event never reached the receiver: %d redirected POSTs, %d GETs", r, g)
	}
	r, g, _ := counts()
	if d := metricOf("kubebridge_sink_delivered_total"); d != 0 {
		t.Errorf("after %d POSTs answered 301 and %d GETs, kubebridge_sink_delivered_total = %v: the redirect was counted as a delivery", r, g, d)
	}

	mu.Lock()
	accept = true
	mu.Unlock()
	if !poll(30*time.Second, func() bool { _, _, a := counts(); return a >= 1 }) {
		r, g, _ := counts()
		t.Fatalf("the event was never POSTed again after the receiver accepted POSTs (%d redirected POSTs, %d GETs, delivered_total=%v, failed_total=%v): lost on the redirect",
			r, g, metricOf("kubebridge_sink_delivered_total"), metricOf("kubebridge_sink_failed_total"))
	}
	mu.Lock()
	p := accepted[0]
	mu.Unlock()
	if p.header.Get("ce-subject") != ns+"/o" || p.header.Get("ce-type") != "io.kubebridge.configmaps.core.added" {
		t.Errorf("accepted POST headers: %v", p.header)
	}
	var data ceData
	if err := json.Unmarshal(p.body, &data); err != nil {
		t.Fatalf("accepted POST body %q: %v", p.body, err)
	}
	if uid, _, _ := unstructured.NestedString(data.Object, "metadata", "uid"); uid != string(obj.UID) {
		t.Errorf("accepted POST body carries uid %q, want %s: %s", uid, obj.UID, p.body)
	}
	poll(5*time.Second, func() bool { return metricOf("kubebridge_sink_delivered_total") >= 1 })
	if d, f, dl := metricOf("kubebridge_sink_delivered_total"), metricOf("kubebridge_sink_failed_total"), metricOf("kubebridge_sink_dead_lettered_total"); d != 1 || f != 0 || dl != 0 {
		t.Errorf("delivered_total=%v failed_total=%v dead_lettered_total=%v, want 1, 0, 0", d, f, dl)
	}
	t.Logf("receiver: %d POSTs answered 301, %d GETs, %d POSTs accepted", r, g, len(accepted))
}

// ---------------------------------------------------------------- 7

// viewNamespacePairs creates n namespaces named prefix-<i> with labels,
// each with a ConfigMap "o" created the moment its namespace exists, in
// parallel, and returns the ConfigMaps' uids.
func viewNamespacePairs(t *testing.T, cs kubernetes.Interface, prefix string, n int, labels map[string]string) []string {
	t.Helper()
	ctx := context.Background()
	uids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s-%d", prefix, i)
			if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			cm, err := cs.CoreV1().ConfigMaps(name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "o"}}, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			uids[i] = string(cm.UID)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return uids
}

// viewExpectPairs waits (30s at most) until rule delivered exactly one
// added for each pair's object, and reports those that did not arrive.
func viewExpectPairs(t *testing.T, out, rule, prefix string, uids []string) {
	t.Helper()
	missing := func(evs []ce) []string {
		var m []string
		for i, uid := range uids {
			subject := fmt.Sprintf("%s-%d/o", prefix, i)
			if got := viewSeq(viewEvents(evs, rule, subject), map[string]string{uid: "uid"}); !viewSame(got, []string{"added(uid)"}) {
				m = append(m, fmt.Sprintf("%s: %v", subject, got))
			}
		}
		return m
	}
	poll(30*time.Second, func() bool { return len(missing(readEvents(t, out))) == 0 })
	if m := missing(readEvents(t, out)); len(m) > 0 {
		t.Errorf("%d of %d objects created right after their (selected) namespace did not arrive as exactly one added:\n  %s", len(m), len(uids), strings.Join(m, "\n  "))
	}
}

// Namespaces created with labels a namespaceSelector matches, each with an
// object created in it at once (no wait): every object's addition arrives,
// whichever of the bridge's two watches (namespaces, the objects) shows it
// first. "idle": as is. "busy namespace watch": while other namespaces get
// large updates, so that the bridge's namespace watch lags its ConfigMap
// watch and objects are seen before their namespace is in the cache.
func TestViewNamespaceCreatedWithObject(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	const label = "vw-fresh"
	out := filepath.Join(t.TempDir(), "events.jsonl")
	startBridge(t, cp, fileConfig(out, viewRule("fresh", "v1/configmaps", `namespaceSelector: "`+label+`=on"`)))
	selected := map[string]string{label: "on"}

	t.Run("idle", func(t *testing.T) {
		uids := viewNamespacePairs(t, cs, "vw-fresh-idle", 20, selected)
		viewExpectPairs(t, out, "fresh", "vw-fresh-idle", uids)
	})

	t.Run("busy namespace watch", func(t *testing.T) {
		ctx := context.Background()
		const fillers, workers = 4, 8
		for i := range fillers {
			viewNamespace(t, cs, fmt.Sprintf("vw-fresh-filler-%d", i), nil)
		}
		big := strings.Repeat("x", 200<<10) // annotations may total 256 KiB
		stop := make(chan struct{})
		var patched sync.WaitGroup
		var mu sync.Mutex
		done := 0
		var patchErr error
		for w := range workers {
			patched.Add(1)
			go func() {
				defer patched.Done()
				for i := 0; i < 100; i++ { // bounded, whatever happens
					select {
					case <-stop:
						return
					default:
					}
					ns := fmt.Sprintf("vw-fresh-filler-%d", (w+i)%fillers)
					p := fmt.Sprintf(`{"metadata":{"annotations":{"vw-fresh/filler":"%d-%d-%s"}}}`, w, i, big)
					_, err := cs.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(p), metav1.PatchOptions{})
					mu.Lock()
					done++
					if err != nil && patchErr == nil {
						patchErr = err
					}
					mu.Unlock()
				}
			}()
		}
		testenv.Eventually(t, 60*time.Second, "the namespace updates to get going", func() bool { mu.Lock(); defer mu.Unlock(); return done >= 2*workers })
		uids := viewNamespacePairs(t, cs, "vw-fresh-busy", 20, selected)
		close(stop)
		patched.Wait()
		must(t, patchErr)
		t.Logf("%d large namespace updates", done)
		viewExpectPairs(t, out, "fresh", "vw-fresh-busy", uids)
	})
}

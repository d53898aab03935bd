package e2e

// Hot reload of a changed sink, seen from the checkpoint and from the
// consumer (docs/guarantees.md, "hot reload"): a changed sink's old delivery
// is drained and stopped, and its acknowledgements written, before the new
// one loads its view from the checkpoint; the NATS connection of a natsKV
// checkpoint belongs to the bridge and survives the reload of the sink it
// names.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// ---------------------------------------------------------------- helpers

// rvWaitReload writes config to the bridge's config file and waits until
// the current run logs one more "config reloaded" than before; it returns
// that log line.
func rvWaitReload(t *testing.T, b *bridgeProc, config string) string {
	t.Helper()
	before := strings.Count(b.runLog(), "config reloaded")
	must(t, os.WriteFile(b.configPath, []byte(config), 0o600))
	var line string
	failed := false
	ok := poll(60*time.Second, func() bool {
		log := b.runLog()
		if strings.Contains(log, "config change refused") || strings.Contains(log, "msg=stopping") {
			failed = true
			return true
		}
		if strings.Count(log, "config reloaded") <= before {
			return false
		}
		i := strings.LastIndex(log, "config reloaded")
		start := strings.LastIndex(log[:i], "\n") + 1
		end := strings.Index(log[i:], "\n")
		if end < 0 {
			end = len(log) - i
		}
		line = log[start : i+end]
		return true
	})
	if !ok {
		t.Fatalf("the config change was not applied within 60s:\n%s", lastLines(b.runLog(), 40))
	}
	if failed {
		t.Fatalf("the config change was refused, or the bridge stopped:\n%s", lastLines(b.runLog(), 40))
	}
	return line
}

// rvCheckpointSettled waits until kubebridge_checkpoint_lag reads 0 three
// times in a row, and reports whether it did (within 30s).
func rvCheckpointSettled(adminURL string) (last float64, ok bool) {
	zeroes := 0
	ok = poll(30*time.Second, func() bool {
		v, got := viewMetric(adminURL, "kubebridge_checkpoint_lag")
		last = v
		if got && v == 0 {
			zeroes++
		} else {
			zeroes = 0
		}
		return zeroes >= 3
	})
	return last, ok
}

// rvDelivered is kubebridge_sink_delivered_total of sink (of the current
// delivery: a replaced sink starts from 0).
func rvDelivered(adminURL, sink string) float64 {
	v, _ := viewMetric(adminURL, `kubebridge_sink_delivered_total{sink="`+sink+`"}`)
	return v
}

// rvKVEntry is one checkpoint record as the bridge writes it
// (internal/checkpoint.Entry).
type rvKVEntry struct {
	UID     string      `json:"uid"`
	RV      string      `json:"rv"`
	Pending []rvKVEntry `json:"pending"`
}

// rvReadKV reads the natsKV checkpoint bucket directly: sink -> rule ->
// object key -> entry; intent records (object keys starting with NUL) are
// returned apart, as "sink.rule.ns/name".
func rvReadKV(t *testing.T, srv *testenv.NATS, bucket string) (acked map[string]map[string]map[string]rvKVEntry, intents map[string]rvKVEntry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatalf("checkpoint bucket %s: %v", bucket, err)
	}
	acked = map[string]map[string]map[string]rvKVEntry{}
	intents = map[string]rvKVEntry{}
	keys, err := kv.ListKeys(ctx)
	must(t, err)
	for k := range keys.Keys() {
		parts := strings.SplitN(k, ".", 3)
		if len(parts) != 3 {
			t.Errorf("checkpoint key %q is not <sink>.<rule>.<base64url(key)>", k)
			continue
		}
		raw, err := base64.RawURLEncoding.DecodeString(parts[2])
		if err != nil {
			t.Errorf("checkpoint key %q: %v", k, err)
			continue
		}
		v, err := kv.Get(ctx, k)
		if err != nil {
			t.Errorf("checkpoint key %q: %v", k, err)
			continue
		}
		var e rvKVEntry
		if err := json.Unmarshal(v.Value(), &e); err != nil {
			t.Errorf("checkpoint key %q: %v: %s", k, err, v.Value())
			continue
		}
		if len(raw) > 0 && raw[0] == 0 {
			intents[parts[0]+"."+parts[1]+"."+string(raw[1:])] = e
			continue
		}
		if acked[parts[0]] == nil {
			acked[parts[0]] = map[string]map[string]rvKVEntry{}
		}
		if acked[parts[0]][parts[1]] == nil {
			acked[parts[0]][parts[1]] = map[string]rvKVEntry{}
		}
		acked[parts[0]][parts[1]][string(raw)] = e
	}
	return acked, intents
}

// rvCurrent lists the ConfigMaps of ns: ns/name -> (uid, resourceVersion).
func rvCurrent(t *testing.T, cs kubernetes.Interface, ns string) map[string]rvKVEntry {
	t.Helper()
	list, err := cs.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
	must(t, err)
	out := map[string]rvKVEntry{}
	for _, cm := range list.Items {
		if cm.Name == "kube-root-ca.crt" {
			continue
		}
		out[ns+"/"+cm.Name] = rvKVEntry{UID: string(cm.UID), RV: cm.ResourceVersion}
	}
	return out
}

// rvNamespace is a namespace name of its own for each run (-count=N
// reuses the package's control plane).
func rvNamespace(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
}

// rvNum parses a resourceVersion (etcd's revision) for ordering; -1 when
// it is not a number.
func rvNum(rv string) int64 {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func rvSorted[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ---------------------------------------------------------------- 1

// A NATS sink that also carries the natsKV checkpoint is changed by a hot
// reload (another subject template): the sink is rebuilt and its old
// connection closed, but the checkpoint lives on the bridge's own
// connection, so what is delivered after the reload is written to the
// bucket. The test reads the bucket itself, then SIGKILLs the bridge,
// deletes one object and updates another meanwhile, and restarts it: both
// sinks get exactly that deletion and that update (kbreplay checkpoint) and
// nothing re-sent.
func TestReloadKeepsNATSKVCheckpoint(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	ns := rvNamespace("rl-natskv")
	testenv.EnsureNamespace(t, cp, ns)
	srv := testenv.StartNATS(t)
	bucket := fmt.Sprintf("kb-reload-%d", time.Now().UnixNano())
	const stream = "RLNATSKV"
	out := filepath.Join(t.TempDir(), "events.jsonl")
	config := func(busExtra string) string {
		return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: ` + bucket + `}}
sinks:
  - name: bus
    nats: {url: "` + srv.ClientURL() + `", jetstream: true, stream: {name: ` + stream + `}` + busExtra + `}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: out
    file: {path: ` + out + `}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + ns + `]
    sinks: [bus, out]
`
	}
	const v2Subject = "k8s.{cluster}.v2.{resource}.{namespace}.{name}.{type}"
	v1, v2 := config(""), config(`, subject: "`+v2Subject+`"`)

	b := startBridge(t, cp, v1, withConfigCheckpoint(), withRestartFlags())
	js := viewJetStream(t, srv)
	cms := cs.CoreV1().ConfigMaps(ns)
	patch := func(name, v string) {
		t.Helper()
		_, err := cms.Patch(ctx, name, types.MergePatchType, []byte(`{"data":{"v":"`+v+`"}}`), metav1.PatchOptions{})
		must(t, err)
	}

	// Before the reload: a1..a3 added to both sinks.
	for _, name := range []string{"a1", "a2", "a3"} {
		viewCreateCM(t, cs, ns, name, map[string]string{"v": "1"})
	}
	waitEvents(t, out, "a1..a3 added to the file sink", func(evs []ce) bool { return len(evs) >= 3 })
	if !poll(30*time.Second, func() bool { return len(viewStream(t, js, stream)) >= 3 }) {
		t.Fatalf("the stream holds %d messages before the reload, want 3", len(viewStream(t, js, stream)))
	}
	admin := b.adminURL()
	if lag, ok := rvCheckpointSettled(admin); !ok {
		t.Fatalf("precondition: kubebridge_checkpoint_lag = %v before the reload, want 0", lag)
	}
	if acked, _ := rvReadKV(t, srv, bucket); len(acked["bus"]["cms"]) != 3 || len(acked["out"]["cms"]) != 3 {
		t.Fatalf("precondition: the natsKV checkpoint holds %v before the reload, want a1..a3 for bus and out", acked)
	}

	// The reload: bus changed (subject), out kept.
	line := rvWaitReload(t, b, v2)
	if !strings.Contains(line, "sinksKept=1") || !strings.Contains(line, "sinksStarted=1") || !strings.Contains(line, "sinksStopped=1") {
		t.Fatalf("the reload did not replace exactly the bus sink: %s", line)
	}

	// After the reload: b1..b3 created, a1 and a2 updated, a3 deleted.
	for _, name := range []string{"b1", "b2", "b3"} {
		viewCreateCM(t, cs, ns, name, map[string]string{"v": "1"})
	}
	patch("a1", "2")
	patch("a2", "2")
	must(t, cms.Delete(ctx, "a3", metav1.DeleteOptions{}))
	waitEvents(t, out, "the changes after the reload in the file sink", func(evs []ce) bool {
		return len(evs) >= 9 && has(evs, "cms", ns+"/a3", "added", "deleted")
	})
	busAfterReload := func() []ce {
		var got []ce
		for _, m := range viewStream(t, js, stream) {
			got = append(got, m.ev)
		}
		return got[min(3, len(got)):]
	}
	if !poll(30*time.Second, func() bool { return len(busAfterReload()) >= 6 }) {
		t.Fatalf("the bus published %d events after the reload, want 6:\n%s", len(busAfterReload()), viewDump(busAfterReload()))
	}
	if !poll(10*time.Second, func() bool { return rvDelivered(admin, "bus") >= 6 && rvDelivered(admin, "out") >= 9 }) {
		t.Fatalf("the rebuilt bus sink acknowledged %v events, want 6; the kept file sink %v, want 9", rvDelivered(admin, "bus"), rvDelivered(admin, "out"))
	}
	// The new subject shows that the rebuilt sink published them.
	msgs := viewStream(t, js, stream)
	for _, m := range msgs[3:] {
		if want := "k8s.e2e.v2.configmaps." + strings.ReplaceAll(m.ev.Subject, "/", ".") + "."; !strings.HasPrefix(rvSubjectOf(t, js, stream, m.seq), want) {
			t.Errorf("seq %d (%s %s) published on %s, want %s.<type>: not the rebuilt sink", m.seq, m.ev.change(), m.ev.Subject, rvSubjectOf(t, js, stream, m.seq), want)
		}
	}
	lag, ok := rvCheckpointSettled(admin)
	if !ok {
		t.Errorf("kubebridge_checkpoint_lag = %v for 30s after the reload, want 0: the checkpoint cannot be written (%q in the log: %d)",
			lag, "writing the checkpoint failed", strings.Count(b.runLog(), "writing the checkpoint failed"))
	}
	if n := strings.Count(b.runLog(), "writing the checkpoint failed"); n > 0 {
		t.Errorf("%d checkpoint writes failed after the reload:\n%s", n, lastLines(b.runLog(), 20))
	}

	// The bucket itself: for both sinks, exactly the objects that exist,
	// each at its current uid and resourceVersion; no intents left.
	current := rvCurrent(t, cs, ns)
	if want := []string{ns + "/a1", ns + "/a2", ns + "/b1", ns + "/b2", ns + "/b3"}; !slices.Equal(rvSorted(current), want) {
		t.Fatalf("precondition: the namespace holds %v, want %v", rvSorted(current), want)
	}
	acked, intents := rvReadKV(t, srv, bucket)
	for _, sink := range []string{"bus", "out"} {
		got := acked[sink]["cms"]
		for key, want := range current {
			e, ok := got[key]
			switch {
			case !ok:
				t.Errorf("checkpoint %s.cms: %s (uid %s, rv %s) is missing", sink, key, want.UID, want.RV)
			case e.UID != want.UID || e.RV != want.RV:
				t.Errorf("checkpoint %s.cms: %s holds uid %s rv %s, want uid %s rv %s (the current state, acknowledged after the reload)", sink, key, e.UID, e.RV, want.UID, want.RV)
			}
		}
		for key, e := range got {
			if _, ok := current[key]; !ok {
				t.Errorf("checkpoint %s.cms: %s (uid %s, rv %s) is still recorded, but the object was deleted (and its deletion acknowledged) after the reload", sink, key, e.UID, e.RV)
			}
		}
		for rule := range acked[sink] {
			if rule != "cms" {
				t.Errorf("checkpoint: unexpected rule %s.%s", sink, rule)
			}
		}
	}
	for sink := range acked {
		if sink != "bus" && sink != "out" {
			t.Errorf("checkpoint: unexpected sink %s", sink)
		}
	}
	for k, e := range intents {
		t.Errorf("checkpoint: intent record %s still pending after everything was acknowledged: %+v", k, e)
	}
	if t.Failed() {
		t.FailNow() // the restart below would only repeat it
	}

	// SIGKILL; meanwhile b1 deleted (created after the reload) and b2 updated.
	nFile := len(readEvents(t, out))
	nBus := len(viewStream(t, js, stream))
	b.kill()
	must(t, cms.Delete(ctx, "b1", metav1.DeleteOptions{}))
	patch("b2", "2")
	b2rv := rvCurrent(t, cs, ns)[ns+"/b2"].RV
	b.start()
	admin = b.adminURL()

	afterFile := func() []ce { return readEvents(t, out)[nFile:] }
	afterBus := func() []ce {
		msgs := viewStream(t, js, stream)
		return viewStreamEvents(msgs[min(nBus, len(msgs)):])
	}
	poll(30*time.Second, func() bool {
		return len(afterFile()) >= 2 && len(afterBus()) >= 2 && rvDelivered(admin, "bus") >= 2 && rvDelivered(admin, "out") >= 2
	})
	if _, ok := rvCheckpointSettled(admin); !ok {
		t.Error("kubebridge_checkpoint_lag not 0 after the restart")
	}
	time.Sleep(time.Second) // anything re-sent by mistake has had time to arrive
	want := []string{"deleted " + ns + "/b1 checkpoint", "updated " + ns + "/b2 checkpoint"}
	render := func(evs []ce) []string {
		var out []string
		for _, e := range evs {
			out = append(out, e.change()+" "+e.Subject+" "+e.Replay)
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		sink string
		evs  []ce
	}{{"out (file)", afterFile()}, {"bus (JetStream)", afterBus()}} {
		if got := render(c.evs); !slices.Equal(got, want) {
			t.Errorf("sink %s after the SIGKILL and restart: got %v, want exactly %v:\n%s", c.sink, got, want, viewDump(c.evs))
		}
		for _, e := range c.evs {
			if e.Subject == ns+"/b2" && viewRVOf(e) != b2rv {
				t.Errorf("sink %s: the update of b2 carries rv %s, want the current %s", c.sink, viewRVOf(e), b2rv)
			}
		}
	}
	for _, sink := range []string{"bus", "out"} {
		if d := rvDelivered(admin, sink); d != 2 {
			t.Errorf("sink %s acknowledged %v events after the restart, want 2 (the deletion and the update)", sink, d)
		}
	}
}

// rvSubjectOf is the NATS subject of message seq of stream.
func rvSubjectOf(t *testing.T, js jetstream.JetStream, stream string, seq uint64) string {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, stream)
	must(t, err)
	m, err := st.GetMsg(ctx, seq)
	must(t, err)
	return m.Subject
}

// ---------------------------------------------------------------- 2

// rvHookReq is one request the webhook received.
type rvHookReq struct {
	gen string // X-Gen: which incarnation of the sink sent it
	ev  ce
}

// rvHook is a webhook receiver (structured mode) that records arrival
// order, and whether two incarnations of the sink ever had requests in
// flight at once.
type rvHook struct {
	mu       sync.Mutex
	reqs     []rvHookReq
	inFlight map[string]int
	overlaps []string
	srv      *httptest.Server
}

// newRVHook answers every request with 200 after delay[X-Gen].
func newRVHook(t *testing.T, delay map[string]time.Duration) *rvHook {
	h := &rvHook{inFlight: map[string]int{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		gen := r.Header.Get("X-Gen")
		var e ce
		if err := json.Unmarshal(body, &e); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		e.raw = body
		h.mu.Lock()
		for g, n := range h.inFlight {
			if g != gen && n > 0 {
				h.overlaps = append(h.overlaps, fmt.Sprintf("request %d (gen %s, %s %s rv %s) arrived while %d request(s) of gen %s were in flight", len(h.reqs), gen, e.change(), e.Subject, viewRVOf(e), n, g))
			}
		}
		h.inFlight[gen]++
		h.reqs = append(h.reqs, rvHookReq{gen: gen, ev: e})
		h.mu.Unlock()
		time.Sleep(delay[gen])
		h.mu.Lock()
		h.inFlight[gen]--
		h.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *rvHook) snapshot() []rvHookReq {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reqs)
}

// A webhook sink changed by a hot reload (another header) while 20
// ConfigMaps are updated 30 times each: the old delivery has drained and
// stopped before the new one sends anything (no request of the old sink
// after, or beside, one of the new), no object is ever handed an older
// state after a newer one, and each object's last event carries its final
// resourceVersion. A SIGKILL once the checkpoint settled, then a restart
// with nothing changed, re-sends nothing.
func TestReloadChangedSinkUnderLoad(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	ns := rvNamespace("rl-load")
	const objects, rounds, reloadAt, gateAt = 20, 30, 5, 25
	testenv.EnsureNamespace(t, cp, ns)
	// The old sink's receiver is slow, so that it has a backlog to drain
	// when the reload comes: run beside the new one, it would show.
	hook := newRVHook(t, map[string]time.Duration{"1": 40 * time.Millisecond, "2": 2 * time.Millisecond})
	config := func(gen string) string {
		return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook: {url: "` + hook.srv.URL + `/events", mode: structured, headers: {X-Gen: "` + gen + `"}}
    workers: 2
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + ns + `]
    sinks: [hook]
`
	}
	names := make([]string, objects)
	for i := range names {
		names[i] = fmt.Sprintf("c-%02d", i)
		viewCreateCM(t, cs, ns, names[i], map[string]string{"v": "0"})
	}
	b := startBridge(t, cp, config("1"), withRestartFlags())
	subjectOf := func(name string) string { return ns + "/" + name }
	if !poll(30*time.Second, func() bool { return len(hook.snapshot()) >= objects }) {
		t.Fatalf("the webhook got %d events at start, want the %d additions", len(hook.snapshot()), objects)
	}

	// The load: 4 writers, each updating its 5 objects round after round.
	// They pass round reloadAt before the reload is written, and wait at
	// round gateAt until it was applied, so that some of the updates
	// surely come after it; the reload happens under load.
	var (
		mu       sync.Mutex
		finalRV  = map[string]string{}
		loadErr  error
		done     atomic.Int64
		reloaded = make(chan struct{})
		wg       sync.WaitGroup
	)
	const writers = 4
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 1; round <= rounds; round++ {
				if round == gateAt {
					select {
					case <-reloaded:
					case <-time.After(60 * time.Second):
					}
				}
				for i := w; i < objects; i += writers {
					p := fmt.Sprintf(`{"data":{"v":"%d"}}`, round)
					cm, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, names[i], types.MergePatchType, []byte(p), metav1.PatchOptions{})
					mu.Lock()
					if err != nil && loadErr == nil {
						loadErr = err
					}
					if err == nil {
						finalRV[subjectOf(names[i])] = cm.ResourceVersion
					}
					mu.Unlock()
					done.Add(1)
					time.Sleep(30 * time.Millisecond)
				}
			}
		}()
	}
	testenv.Eventually(t, 60*time.Second, "the load to pass round 5", func() bool { return done.Load() >= int64(objects*reloadAt) })
	atReload := done.Load()
	line := rvWaitReload(t, b, config("2"))
	atApplied := done.Load()
	close(reloaded)
	wg.Wait()
	must(t, loadErr)
	t.Logf("reload written after %d updates, applied after %d, of %d: %s", atReload, atApplied, objects*rounds, line)
	if !strings.Contains(line, "sinksStarted=1") || !strings.Contains(line, "sinksStopped=1") {
		t.Fatalf("the reload did not replace the hook sink: %s", line)
	}

	// Settle: every object's last event carries its final state, and the
	// checkpoint has written it all.
	lastRV := func(reqs []rvHookReq) map[string]string {
		last := map[string]string{}
		for _, r := range reqs {
			last[r.ev.Subject] = viewRVOf(r.ev)
		}
		return last
	}
	behind := func() []string {
		last := lastRV(hook.snapshot())
		var out []string
		for _, name := range names {
			s := subjectOf(name)
			if last[s] != finalRV[s] {
				out = append(out, fmt.Sprintf("%s: last event rv %q, final rv %s", s, last[s], finalRV[s]))
			}
		}
		return out
	}
	poll(60*time.Second, func() bool { return len(behind()) == 0 })
	admin := b.adminURL()
	// The receiver records a request when it arrives; the bridge counts it
	// once answered. Every request of the new sink is acknowledged first.
	newSent := func() (n int) {
		for _, r := range hook.snapshot() {
			if r.gen == "2" {
				n++
			}
		}
		return n
	}
	if !poll(10*time.Second, func() bool { return rvDelivered(admin, "hook") >= float64(newSent()) }) {
		t.Errorf("the reloaded sink acknowledged %v events, its receiver got %d", rvDelivered(admin, "hook"), newSent())
	}
	if lag, ok := rvCheckpointSettled(admin); !ok {
		t.Errorf("kubebridge_checkpoint_lag = %v for 30s after the load, want 0", lag)
	}
	reqs := hook.snapshot()

	// 1. The old sink's requests all came before the new one's, never beside them.
	firstNew, lastOld := -1, -1
	for i, r := range reqs {
		switch r.gen {
		case "1":
			lastOld = i
		case "2":
			if firstNew < 0 {
				firstNew = i
			}
		default:
			t.Errorf("request %d has X-Gen %q", i, r.gen)
		}
	}
	if firstNew < 0 {
		t.Fatalf("the reloaded sink sent nothing (%d requests in all)", len(reqs))
	}
	if lastOld > firstNew {
		var lines []string
		late := 0
		for i := firstNew; i <= lastOld; i++ {
			if r := reqs[i]; r.gen == "1" {
				late++
				if len(lines) < 10 {
					lines = append(lines, fmt.Sprintf("#%d gen %s %s %s rv %s id %s", i, r.gen, r.ev.change(), r.ev.Subject, viewRVOf(r.ev), r.ev.ID))
				}
			}
		}
		t.Errorf("the old sink (gen 1) sent %d requests after the new one's first (#%d), the last #%d: old and new delivery ran side by side; the first of them:\n  %s", late, firstNew, lastOld, strings.Join(lines, "\n  "))
	}
	hook.mu.Lock()
	overlaps := slices.Clone(hook.overlaps)
	hook.mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("%d requests of one sink incarnation arrived while the other's were in flight:\n  %s", len(overlaps), strings.Join(overlaps[:min(len(overlaps), 10)], "\n  "))
	}

	// 2. Per object, resourceVersions never go backwards, across the reload
	// too; the last event carries the final resourceVersion.
	type seen struct {
		rv  int64
		idx int
		gen string
	}
	checkOrder := func(reqs []rvHookReq, from int, prior map[string]seen, what string) (dups int) {
		last := map[string]seen{}
		for k, v := range prior {
			last[k] = v
		}
		ids := map[string]int{}
		var bad []string
		defer func() {
			if len(bad) > 0 {
				t.Errorf("%s: %d violations (first %d):\n  %s", what, len(bad), min(len(bad), 15), strings.Join(bad[:min(len(bad), 15)], "\n  "))
			}
		}()
		for i, r := range reqs {
			ids[r.ev.ID]++
			if i < from {
				continue
			}
			if ids[r.ev.ID] > 1 {
				dups++
			}
			rv := rvNum(viewRVOf(r.ev))
			if rv < 0 {
				bad = append(bad, fmt.Sprintf("request #%d (%s %s) has no numeric resourceVersion: %s", i, r.ev.change(), r.ev.Subject, r.ev.raw))
				continue
			}
			if p, ok := last[r.ev.Subject]; ok && rv < p.rv {
				bad = append(bad, fmt.Sprintf("%s went backwards: #%d (gen %s) %s rv %d after #%d (gen %s) rv %d",
					r.ev.Subject, i, r.gen, r.ev.change(), rv, p.idx, p.gen, p.rv))
			}
			if r.ev.change() == "added" && i >= objects {
				bad = append(bad, fmt.Sprintf("#%d (gen %s): %s sent as added again (rv %d, replay %q)", i, r.gen, r.ev.Subject, rv, r.ev.Replay))
			}
			if r.ev.change() == "deleted" {
				bad = append(bad, fmt.Sprintf("#%d (gen %s): %s sent as deleted, but it exists", i, r.gen, r.ev.Subject))
			}
			last[r.ev.Subject] = seen{rv, i, r.gen}
		}
		return dups
	}
	dups := checkOrder(reqs, 0, nil, "under load")
	if late := behind(); len(late) > 0 {
		t.Errorf("%d objects' last event is not their final state:\n  %s", len(late), strings.Join(late, "\n  "))
	}
	afterReload := 0
	for _, r := range reqs {
		if r.gen == "2" {
			afterReload++
		}
	}
	t.Logf("under load: %d updates, %d requests (%d from the reloaded sink), %d duplicate ids", objects*rounds, len(reqs), afterReload, dups)
	if t.Failed() {
		t.FailNow()
	}

	// 3. SIGKILL with the checkpoint settled, restart with nothing changed:
	// nothing is re-sent (nothing was in flight, everything was written).
	prior := map[string]seen{}
	for i, r := range reqs {
		prior[r.ev.Subject] = seen{rvNum(viewRVOf(r.ev)), i, r.gen}
	}
	n0 := len(reqs)
	b.kill()
	b.start()
	admin = b.adminURL()
	// Quiet for 2s in a row (at most 20s): whatever the restart sends has arrived.
	quietSince, lastLen := time.Now(), n0
	poll(20*time.Second, func() bool {
		if n := len(hook.snapshot()); n != lastLen {
			lastLen, quietSince = n, time.Now()
		}
		return time.Since(quietSince) >= 2*time.Second
	})
	all := hook.snapshot()
	resent := all[n0:]
	restartDups := checkOrder(all, n0, prior, "after the restart")
	t.Logf("after the SIGKILL and restart: %d events re-sent, %d of them duplicates of acknowledged ids", len(resent), restartDups)
	if len(resent) > 0 {
		var lines []string
		for i, r := range resent {
			lines = append(lines, fmt.Sprintf("#%d gen %s %s %s rv %s replay %q id %s", n0+i, r.gen, r.ev.change(), r.ev.Subject, viewRVOf(r.ev), r.ev.Replay, r.ev.ID))
		}
		t.Errorf("a restart after a SIGKILL with the checkpoint settled (lag 0) and nothing changed re-sent %d events (%d with ids already delivered):\n  %s",
			len(resent), restartDups, strings.Join(lines[:min(len(lines), 20)], "\n  "))
	}
	if d := rvDelivered(admin, "hook"); d != 0 {
		t.Errorf("the restarted sink acknowledged %v events, want 0", d)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/shards"
	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A replica cut off from NATS (not from the apiserver) never writes after
// the replica that took its shard over (issue 30, item 1). Two replicas
// share 2 shards (NATS KV checkpoint, a JetStream stream); replica A
// reaches NATS through a link the test stalls. A, alone, delivers
// ConfigMap X (in shard 1, the one A gives back when another replica
// joins); the link stalls; X is updated and A publishes the update into
// the stalled link; replica B joins (straight to NATS); A gives shard 1
// back when its drain times out, B takes it and sends X's update, then X's
// deletion. The link recovers and A's late bytes reach NATS. The stream
// must refuse them: its last message of X is B's deletion, and a consumer
// that applies the stream by uid holds what the apiserver holds (X gone),
// not X forever.
func TestStaleOwnerCannotWriteAfterItsSuccessor(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns, stream, group = "partition", "PARTITION", "kb-partition"
	testenv.EnsureNamespace(t, cp, ns)
	srv := testenv.StartNATS(t)
	link := testenv.StartProxy(t, srv.Addr().String())

	cfg := func(url string) string {
		return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: ` + group + `}}
sharding: {shards: 2}
sinks:
  - name: bus
    nats: {url: "` + url + `", jetstream: true, stream: {name: ` + stream + `, duplicateWindow: 10m}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + ns + `]
    sinks: [bus]
`
	}
	replica := func(name, url string, opts ...bridgeOption) *bridgeProc {
		return startBridge(t, cp, cfg(url), append([]bridgeOption{withConfigCheckpoint(), withLogLevel("info"),
			// The shortest settings: a renewal every 250ms, the drain of a
			// shard given back cut after 500ms.
			withFlags("--leader-elect-lease-duration", "2s", "--leader-elect-renew-deadline", "1500ms", "--leader-elect-retry-period", "250ms",
				"--drain-timeout", "500ms",
				"--leader-elect-namespace", "default", "--leader-elect-name", group, "--identity", name),
			withReadyLog("bridge started; sharing the shards")}, opts...)...)
	}

	// Every publish as NATS receives it (before the stream judges it), and
	// every answer the stream gives (to the publisher's reply inbox).
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	t.Cleanup(nc.Close)
	var mu sync.Mutex
	var pubs []*natsgo.Msg
	answers := map[string][]byte{} // reply subject -> the stream's answer
	_, err = nc.Subscribe("k8s.>", func(m *natsgo.Msg) { mu.Lock(); pubs = append(pubs, m); mu.Unlock() })
	must(t, err)
	_, err = nc.Subscribe("_INBOX.>", func(m *natsgo.Msg) { mu.Lock(); answers[m.Subject] = m.Data; mu.Unlock() })
	must(t, err)
	must(t, nc.Flush())
	published := func() []*natsgo.Msg { mu.Lock(); defer mu.Unlock(); return append([]*natsgo.Msg(nil), pubs...) }
	js := viewJetStream(t, srv)

	// A, alone, holds both shards; X is the first of x-0, x-1, ... whose
	// uid falls in shard 1: A gives back its highest shard when B joins.
	a := replica("replica-a", "nats://"+link.Addr(), withKillAtEnd())
	space := shards.Space{N: 2, Key: shards.KeyUID}
	var x *corev1.ConfigMap
	run := strconv.FormatInt(time.Now().UnixNano(), 36) // names of this run's objects (go test -count)
	for i := 0; x == nil; i++ {
		if i == 30 {
			t.Fatal("30 ConfigMaps, none in shard 1")
		}
		cm := viewCreateCM(t, cs, ns, fmt.Sprintf("x-%s-%d", run, i), map[string]string{"v": "0"})
		if space.OfHash(shards.Hash(string(cm.UID))) == 1 {
			x = cm
		}
	}
	uid := string(x.UID)
	t.Logf("X is %s/%s, uid %s (shard 1)", ns, x.Name, uid)
	xEvents := func() []viewStreamMsg {
		var out []viewStreamMsg
		for _, m := range viewStream(t, js, stream) {
			if md, _ := m.ev.Data.Object["metadata"].(map[string]any); md["uid"] == uid {
				out = append(out, m)
			}
		}
		return out
	}
	describe := func(msgs []viewStreamMsg) string {
		var s []string
		for _, m := range msgs {
			d := fmt.Sprintf("#%d %s@%s id=%s", m.seq, m.ev.change(), objectRV(m.ev), m.ev.ID)
			if m.ev.Replay != "" {
				d += " [" + m.ev.Replay + "]"
			}
			s = append(s, d)
		}
		return strings.Join(s, ", ")
	}
	waitX := func(what string, cond func([]viewStreamMsg) bool) []viewStreamMsg {
		t.Helper()
		var msgs []viewStreamMsg
		if !poll(60*time.Second, func() bool { msgs = xEvents(); return cond(msgs) }) {
			t.Fatalf("waiting for %s; the stream holds for X: %s\nreplica A:\n%s", what, describe(msgs), a.runLogTail())
		}
		return msgs
	}
	isChange := func(c string) func(viewStreamMsg) bool {
		return func(m viewStreamMsg) bool { return m.ev.change() == c }
	}
	added := waitX("X's addition", func(m []viewStreamMsg) bool { return slices.ContainsFunc(m, isChange("added")) })
	// What A publishes answers to inboxes under one prefix (its connection's).
	aInbox := ""
	for _, m := range published() {
		if strings.Contains(string(m.Data), added[0].ev.ID) && strings.Contains(m.Reply, ".") {
			aInbox = m.Reply[:strings.LastIndexByte(m.Reply, '.')+1]
		}
	}
	if aInbox == "" {
		t.Fatal("A's publish of X's addition was not seen with a reply inbox")
	}
	viewSettle(t, a.adminURL(), "bus", 1) // X's addition in A's checkpoint before the link stalls

	// The partition: A publishes X's update into the stalled link.
	link.Stall()
	x, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, x.Name, types.MergePatchType, []byte(`{"data":{"v":"1"}}`), metav1.PatchOptions{})
	must(t, err)
	if !poll(20*time.Second, func() bool { return link.Held() > 0 }) {
		t.Fatalf("A wrote nothing into the stalled link after X's update (rv %s):\n%s", x.ResourceVersion, a.runLogTail())
	}
	t.Logf("X updated (rv %s); A wrote %d bytes into the stalled link", x.ResourceVersion, link.Held())

	// B joins; A gives shard 1 back once its drain times out; B takes it
	// and delivers X's update from the checkpoint, then X's deletion.
	replica("replica-b", srv.ClientURL())
	waitX("B's update of X", func(m []viewStreamMsg) bool { return slices.ContainsFunc(m, isChange("updated")) })
	must(t, cs.CoreV1().ConfigMaps(ns).Delete(ctx, x.Name, metav1.DeleteOptions{}))
	byB := waitX("B's deletion of X", func(m []viewStreamMsg) bool { return slices.ContainsFunc(m, isChange("deleted")) })
	deletion := byB[slices.IndexFunc(byB, isChange("deleted"))].ev
	if log := a.runLog(); strings.Contains(log, "stopped delivering a shard") {
		line := log[strings.LastIndex(log, "stopped delivering a shard"):]
		t.Logf("replica A: %s", line[:strings.IndexByte(line+"\n", '\n')])
	}
	t.Logf("before the link recovers, the stream holds for X: %s", describe(byB))

	// The link recovers: A's late bytes reach NATS, and the stream answers
	// each of A's publishes of X.
	seen := len(published())
	link.Resume()
	var late []*natsgo.Msg
	var lateAnswers [][]byte
	ok := poll(60*time.Second, func() bool {
		late, lateAnswers = late[:0], lateAnswers[:0]
		for _, m := range published()[seen:] {
			if strings.HasPrefix(m.Reply, aInbox) && strings.Contains(string(m.Data), uid) {
				late = append(late, m)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, m := range late {
			if ans, ok := answers[m.Reply]; ok {
				lateAnswers = append(lateAnswers, ans)
			}
		}
		return len(late) > 0 && len(lateAnswers) == len(late)
	})
	if !ok {
		t.Fatalf("after the link recovered, %d late publishes of X by A reached NATS, %d answered by the stream (the partition did not hold A's update?)\nreplica A:\n%s",
			len(late), len(lateAnswers), a.runLogTail())
	}
	for i, m := range late {
		var e ce
		_ = json.Unmarshal(m.Data, &e)
		var ack struct {
			Seq       uint64 `json:"seq"`
			Duplicate bool   `json:"duplicate"`
			Error     *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		_ = json.Unmarshal(lateAnswers[i], &ack)
		switch {
		case ack.Error != nil:
			t.Logf("A's late %s of X (id %s) was refused by the stream: %s", e.change(), e.ID, ack.Error.Description)
		case ack.Duplicate:
			t.Logf("A's late %s of X (id %s) was a duplicate (seq %d)", e.change(), e.ID, ack.Seq)
		default:
			t.Errorf("A's late %s of X (id %s, rv %s), published before B took the shard over, was stored after B's deletion, at seq %d", e.change(), e.ID, objectRV(e), ack.Seq)
		}
	}

	// What a consumer of the stream sees.
	final := xEvents()
	t.Logf("the stream holds for X: %s", describe(final))
	if last := final[len(final)-1]; last.ev.ID != deletion.ID {
		t.Errorf("the stream's last message of X is %s, not B's deletion (id %s)", describe(final[len(final)-1:]), deletion.ID)
	}
	held := map[string]string{} // uid -> rv, as a consumer applying by uid holds it
	names := map[string]string{}
	for _, m := range viewStream(t, js, stream) {
		md, _ := m.ev.Data.Object["metadata"].(map[string]any)
		u, _ := md["uid"].(string)
		names[u] = m.ev.Subject
		if m.ev.change() == "deleted" {
			delete(held, u)
		} else {
			held[u] = objectRV(m.ev)
		}
	}
	list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	truth := map[string]string{}
	for _, cm := range list.Items {
		if strings.HasPrefix(cm.Name, "x-") {
			truth[string(cm.UID)] = cm.ResourceVersion
		}
	}
	for u, rv := range truth {
		if held[u] != rv {
			t.Errorf("%s (uid %s) is at rv %s; a consumer of the stream holds %q", names[u], u, rv, held[u])
		}
	}
	for u, rv := range held {
		if _, ok := truth[u]; !ok {
			t.Errorf("%s (uid %s) is deleted; a consumer of the stream holds it forever, at rv %s", names[u], u, rv)
		}
	}
}

// The model test's partition fault (model_test.go): with it enabled, each
// bridge reaches NATS through a link of its own (a proxy the test owns) and
// runs on a config file of its own, the model's with the link's URL.

// modelLink is one bridge's link to NATS.
type modelLink struct {
	name  string
	proxy *testenv.Proxy
}

// The bridge's defaults the partition outlasts: --drain-timeout (the
// model's bridges keep it) and withShortLease's lease duration.
const (
	modelDrain = 10 * time.Second
	modelLease = 4 * time.Second
)

// configFor is the config file the bridge named name runs on: the model's,
// or (partition fault) its own, whose NATS URL is a new link's.
func (m *modelRun) configFor(name string) string {
	if !m.faults["partition"] {
		return m.cfgPath
	}
	if m.links == nil {
		m.links = map[string]*modelLink{}
	}
	path := m.cfgPath + "." + name
	if m.links[path] == nil {
		m.links[path] = &modelLink{name: name, proxy: testenv.StartProxy(m.t, m.nats.Addr().String())}
	}
	m.writeLinkConfigs()
	return path
}

// writeLinkConfigs writes each link's config file: the model's config with
// the link's URL for NATS (the sink, and so the KV checkpoint).
func (m *modelRun) writeLinkConfigs() {
	cfg := m.config()
	direct := `url: "` + m.nats.ClientURL() + `"`
	if !strings.Contains(cfg, direct) {
		m.t.Fatalf("the model's config has no %s to route through a link:\n%s", direct, cfg)
	}
	for path, l := range m.links {
		tmp := path + ".tmp"
		must(m.t, os.WriteFile(tmp, []byte(strings.ReplaceAll(cfg, direct, `url: "nats://`+l.proxy.Addr()+`"`)), 0o600))
		must(m.t, os.Rename(tmp, path))
	}
}

// partition stalls one bridge's link to NATS (the apiserver stays
// reachable) for longer than the drain and the lease, then lets it
// recover. Meanwhile objects of its shards change (it publishes their
// events, and writes its checkpoint, into the stalled link) and, sharded,
// its shards move: another replica joins (it gives shards back when their
// drain times out) or it is SIGTERMed (its drain times out; it starts
// again once the link is back); or nothing moves and it only waits. Then
// the same objects change again, one is deleted: the shards' new owners
// deliver that. When the link recovers, what the bridge wrote meanwhile
// lands late, after its successors' newer events: a destination that
// fences (JetStream, the KV checkpoint) must refuse it, so the checker
// stays strict for it.
func (m *modelRun) partition(i int) {
	var linked []*bridgeProc
	for _, b := range m.bridges {
		if m.links[b.configPath] != nil {
			linked = append(linked, b)
		}
	}
	if len(linked) == 0 {
		m.opUpdate(m.cs, i)
		return
	}
	b := linked[m.rng.IntN(len(linked))]
	l := m.links[b.configPath]
	how := []string{"term", "wait"}[m.rng.IntN(2)]
	if m.shards > 0 {
		how = []string{"join", "term", "wait"}[m.rng.IntN(3)]
		if how == "join" && len(m.bridges) >= 3 {
			how = "term"
		}
	}
	stallFor := modelDrain + modelLease + time.Duration(m.rng.IntN(2000))*time.Millisecond
	// Up to three objects of b's shards (as many draws whatever b holds,
	// so that the seed's schedule stays the same), once b delivers some
	// (a replica that just started may hold none yet).
	draws := []int{m.rng.IntN(1 << 20), m.rng.IntN(1 << 20), m.rng.IntN(1 << 20)}
	if m.shards > 0 && !poll(30*time.Second, func() bool {
		return bridgeReady(b) && len(scrapeLabels(b, "kubebridge_shard_pending_events", "shard")) > 0
	}) {
		m.logOp("partition: %s holds no shard after 30s", l.name)
	}
	mine := m.objectsOf(b)
	var targets [][2]string
	for _, d := range draws {
		if len(mine) > 0 {
			o := mine[d%len(mine)]
			if !slices.Contains(targets, o) {
				targets = append(targets, o)
			}
		}
	}

	t0 := time.Now()
	l.proxy.Stall()
	m.logOp("partition: %s's link to NATS stalled (then: %s); %d of its objects change", l.name, how, len(targets))
	for _, o := range targets { // published into the stalled link
		m.patch(m.cs, o[0], o[1], "update (partitioned)", fmt.Sprintf(`{"data":{"v":"%d-p"}}`, i))
	}
	m.randomChange(m.cs, i)
	time.Sleep(300 * time.Millisecond)
	held := l.proxy.Held()
	m.logOp("partition: %s wrote %d bytes into the stalled link", l.name, held)
	switch how {
	case "join":
		// Its shard's Lease is released (and taken) once the drain timed
		// out and the final checkpoint write gave up.
		before, _ := viewMetric(b.adminURL(), `kubebridge_shard_handovers_total{kind="released"}`)
		held := scrapeLabels(b, "kubebridge_shard_pending_events", "shard")
		t1 := time.Now()
		m.addReplica()
		released := poll(90*time.Second, func() bool {
			v, _ := viewMetric(b.adminURL(), `kubebridge_shard_handovers_total{kind="released"}`)
			return v > before
		})
		took := time.Since(t1).Round(time.Millisecond)
		m.logOp("partition: %s held shards %v; a shard's Lease released: %v, after %s", l.name, held, released, took)
		if !released || took > modelDrain+5*time.Second {
			m.notes = append(m.notes, fmt.Sprintf("partition: %s, holding shards %v, released a Lease %v %s after a replica joined (drain %s); its log's end:\n%s",
				l.name, held, released, took, modelDrain, lastLines(b.runLog(), 25)))
		}
	case "term":
		t1 := time.Now()
		m.terminate(b) // its drain times out: what it did not deliver, the shards' next owners send
		if took := time.Since(t1); took > modelDrain+5*time.Second {
			m.notes = append(m.notes, fmt.Sprintf("partition: %s took %s to stop on SIGTERM (drain %s); its log's end:\n%s",
				l.name, took.Round(time.Millisecond), modelDrain, lastLines(b.runLog(), 25)))
		}
	}
	time.Sleep(time.Second)     // the shards' new owners take them
	for j, o := range targets { // superseding what waits in the link
		if j == 0 {
			err := m.cs.CoreV1().ConfigMaps(o[0]).Delete(context.Background(), o[1], metav1.DeleteOptions{})
			m.logOp("delete %s/%s uid=%s (after the partition's handover): %v", o[0], o[1], m.uids[o[0]+"/"+o[1]], err)
			if err == nil {
				m.forget(o[0], o[1])
			}
			continue
		}
		m.patch(m.cs, o[0], o[1], "update (after the partition's handover)", fmt.Sprintf(`{"data":{"v":"%d-q"}}`, i))
	}
	m.opUpdate(m.cs, i)
	time.Sleep(max(time.Second, time.Until(t0.Add(stallFor))))
	l.proxy.Resume()
	m.logOp("partition: %s's link recovered after %s", l.name, time.Since(t0).Round(time.Millisecond))
	m.notes = append(m.notes, fmt.Sprintf("partition at %s: %s's link stalled %s (%s), %d objects of its shards changed before and after, %d bytes held",
		t0.Sub(m.start).Round(time.Millisecond), l.name, time.Since(t0).Round(time.Millisecond), how, len(targets), held))
	if how == "term" {
		b.start()
		m.logOp("bridge %s started again (pid %d, config variant %d)", l.name, b.cmd.Process.Pid, m.variant)
	}
}

// objectsOf is the live ConfigMaps (namespace, name) of the shards b
// holds: all of them without sharding.
func (m *modelRun) objectsOf(b *bridgeProc) [][2]string {
	held := map[int]bool{}
	if m.shards > 0 {
		for _, s := range scrapeLabels(b, "kubebridge_shard_pending_events", "shard") {
			if n, err := strconv.Atoi(s); err == nil {
				held[n] = true
			}
		}
	}
	space := shards.Space{N: max(m.shards, 1), Key: shards.KeyUID}
	var out [][2]string
	for _, ns := range modelNamespaces {
		for _, name := range m.live[ns] {
			if m.shards == 0 || held[space.OfHash(shards.Hash(m.uids[ns+"/"+name]))] {
				out = append(out, [2]string{ns, name})
			}
		}
	}
	return out
}

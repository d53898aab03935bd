package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// load creates, updates and deletes ConfigMaps in several namespaces
// while it runs (startLoad, start, stop) and records the names it ever
// created.
type load struct {
	mu      sync.Mutex
	created map[string]bool // ns/name
	ops     int
	widgets bool // also change Widgets (the test CRD), named w-<n>

	t          *testing.T
	cp         *testenv.ControlPlane
	namespaces []string
	halt       chan struct{} // closed to stop it; nil while stopped
	wg         sync.WaitGroup
}

// startLoad starts changing objects in namespaces (and Widgets too with
// widgets). It stops at stop, or at the latest when the test ends.
func startLoad(t *testing.T, cp *testenv.ControlPlane, namespaces []string, widgets bool) *load {
	l := &load{created: map[string]bool{}, widgets: widgets, t: t, cp: cp, namespaces: namespaces}
	l.start()
	t.Cleanup(l.stop)
	return l
}

// start starts the load again after stop.
func (l *load) start() {
	l.halt = make(chan struct{})
	l.wg.Add(1)
	go l.run(l.halt)
}

// stop ends the load and waits until it has ended.
func (l *load) stop() {
	if l.halt == nil {
		return
	}
	close(l.halt)
	l.wg.Wait()
	l.halt = nil
}

// widgetOp creates, patches or deletes a Widget now and then.
func (l *load) widgetOp(ctx context.Context, dyn dynamic.Interface, ns string, i int, live map[string][]string) {
	res := dyn.Resource(testenv.WidgetGVR).Namespace(ns)
	key := "w/" + ns
	var err error
	switch r := rand.IntN(10); {
	case r < 4 || len(live[key]) < 3:
		name := "w-" + strconv.Itoa(i)
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.kubebridge.io/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"n": int64(i)}}}
		if _, err = res.Create(ctx, w, metav1.CreateOptions{}); err == nil {
			live[key] = append(live[key], name)
			l.mu.Lock()
			l.created[ns+"/"+name] = true
			l.mu.Unlock()
		}
	case r < 8:
		_, err = res.Patch(ctx, live[key][rand.IntN(len(live[key]))], types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"n":%d}}`, i)), metav1.PatchOptions{})
	default:
		j := rand.IntN(len(live[key]))
		if err = res.Delete(ctx, live[key][j], metav1.DeleteOptions{}); err == nil || apierrors.IsNotFound(err) {
			live[key] = append(live[key][:j], live[key][j+1:]...)
			err = nil
		}
	}
	if err == nil {
		l.mu.Lock()
		l.ops++
		l.mu.Unlock()
	}
}

func (l *load) run(stop <-chan struct{}) {
	defer l.wg.Done()
	t, cp, namespaces := l.t, l.cp, l.namespaces
	cs := cp.Clientset(t)
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	ctx := context.Background()
	live := map[string][]string{}
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		ns := namespaces[i%len(namespaces)]
		if l.widgets && i%4 == 0 {
			l.widgetOp(ctx, dyn, ns, i, live)
			continue
		}
		switch r := rand.IntN(10); {
		case r < 4 || len(live[ns]) < 5: // create
			name := "obj-" + strconv.Itoa(i)
			if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "0"}}, metav1.CreateOptions{}); err == nil {
				live[ns] = append(live[ns], name)
				l.mu.Lock()
				l.created[ns+"/"+name] = true
				l.ops++
				l.mu.Unlock()
			}
		case r < 8: // update
			name := live[ns][rand.IntN(len(live[ns]))]
			patch := fmt.Sprintf(`{"data":{"v":"%d"}}`, i)
			if _, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
				l.mu.Lock()
				l.ops++
				l.mu.Unlock()
			}
		default: // delete
			j := rand.IntN(len(live[ns]))
			name := live[ns][j]
			if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{}); err == nil || apierrors.IsNotFound(err) {
				live[ns] = append(live[ns][:j], live[ns][j+1:]...)
				l.mu.Lock()
				l.ops++
				l.mu.Unlock()
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// The bridge is SIGKILLed mid-stream and restarted, 5 times in a row
// ($KUBEBRIDGE_CHAOS_KILLS under make chaos), while
// a load generator keeps changing objects (also while it is down). Then
// what the file sink holds is compared with the apiserver: every existing
// object's last event carries its current state, every deleted object's
// last event is a deletion. Nothing may be lost; duplicates are counted.
func TestSIGKILLRestartsLoseNothing(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"kill-a", "kill-b", "kill-c"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	testenv.InstallWidgetCRD(t, cp)
	out := filepath.Join(t.TempDir(), "events.jsonl")
	cfg := fileConfig(out, rule("cms", "v1/configmaps", namespaces...), rule("widgets", "example.kubebridge.io/v1/widgets", namespaces...))

	l := startLoad(t, cp, namespaces, true)

	kills := 5
	if n, err := strconv.Atoi(os.Getenv("KUBEBRIDGE_CHAOS_KILLS")); err == nil && n > 0 {
		kills = n // make chaos runs more
	}
	b := startBridge(t, cp, cfg, withRestartFlags())
	for kill := 1; kill <= kills; kill++ {
		time.Sleep(time.Duration(700+rand.IntN(800)) * time.Millisecond)
		b.kill()
		time.Sleep(300 * time.Millisecond) // changes keep coming while it is down
		b.start()                          // on the same checkpoint
	}
	time.Sleep(500 * time.Millisecond)
	l.stop()

	verifyAgainstTruth(t, cp, namespaces, l, fmt.Sprintf("%d SIGKILLs", kills), func() []ce { return readEvents(t, out) })
	if !strings.Contains(b.log(), "replayedFromCheckpoint") {
		t.Error("no reconciliation logged")
	}
}

// replayEvery re-sends a sink the whole view (kbreplay: resync, the
// objects' current states) at its period, through the informer's resync;
// a sink without it gets no replays.
func TestResyncReplay(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "resync")
	dir := t.TempDir()
	replaying, quiet := filepath.Join(dir, "replaying.jsonl"), filepath.Join(dir, "quiet.jsonl")
	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: replaying
    file: {path: `+replaying+`}
    replayEvery: 1s
  - name: quiet
    file: {path: `+quiet+`}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [resync]
    labelSelector: keep=yes
    sinks: [replaying, quiet]
`)
	cs := cp.Clientset(t)
	ctx := context.Background()
	in, err := cs.CoreV1().ConfigMaps("resync").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "in", Labels: map[string]string{"keep": "yes"}}}, metav1.CreateOptions{})
	must(t, err)
	_, err = cs.CoreV1().ConfigMaps("resync").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "out"}}, metav1.CreateOptions{})
	must(t, err)
	evs := waitEvents(t, replaying, "two resync replays", func(evs []ce) bool {
		n := 0
		for _, e := range evs {
			if e.Subject == "resync/in" && e.Replay == "resync" {
				n++
			}
		}
		return n >= 2
	})
	replayID := ""
	for _, e := range evs {
		if e.Subject == "resync/out" {
			t.Errorf("an object outside the view was replayed: %s", e.raw)
		}
		if e.Replay != "resync" {
			continue
		}
		if !strings.HasPrefix(e.ID, string(in.UID)+".") || !strings.HasSuffix(e.ID, "."+in.ResourceVersion+".updated") {
			t.Errorf("replay id %s does not carry the object's current state", e.ID)
		}
		if replayID != "" && e.ID != replayID {
			t.Errorf("replays of one state got ids %s and %s, want one (stable across replays)", replayID, e.ID)
		}
		replayID = e.ID
	}
	for _, e := range readEvents(t, quiet) {
		if e.Replay != "" {
			t.Errorf("a sink without replayEvery got a replay: %s", e.raw)
		}
	}
}

// With the checkpoint in NATS KV, a bridge killed in one working directory
// and started in another (as a new pod would be) delivers what changed in
// between: the update, the deletion and the creation. The deletion, built
// from the metadata the checkpoint kept, carries the object's apiVersion
// and kind as every event does, and every message its change in kbchange
// (body and header).
func TestNATSKVCheckpointAcrossWorkingDirectories(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "kv")
	srv := testenv.StartNATS(t)
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {natsKV: {sink: bus, bucket: kb-e2e}}
sinks:
  - name: bus
    nats: {url: "` + srv.ClientURL() + `", jetstream: true, stream: {name: K8S}}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [kv]
    sinks: [bus]
`
	cs := cp.Clientset(t).CoreV1().ConfigMaps("kv")
	ctx := context.Background()
	for _, name := range []string{"keep", "change", "drop"} {
		_, err := cs.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
		must(t, err)
	}
	b := startBridge(t, cp, cfg, withConfigCheckpoint(), withRestartFlags())
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var msgs []*jetstream.RawStreamMsg
	read := func(want int) []string {
		t.Helper()
		var got []string
		testenv.Poll(30*time.Second, 100*time.Millisecond, func() bool {
			st, err := js.Stream(ctx, "K8S")
			if err == nil {
				info, _ := st.Info(ctx)
				got, msgs = got[:0], msgs[:0]
				for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
					m, err := st.GetMsg(ctx, seq)
					if err == nil {
						got = append(got, strings.TrimPrefix(m.Subject, "k8s.e2e.core.configmaps.kv.")+" "+m.Header.Get("ce-kbreplay"))
						msgs = append(msgs, m)
					}
				}
			}
			return len(got) >= want
		})
		return got
	}
	if got := read(3); len(got) != 3 {
		t.Fatalf("first start delivered %v, want the 3 objects", got)
	}
	viewSettle(t, b.adminURL(), "bus", 3) // the three in the checkpoint
	b.kill()

	_, err = cs.Patch(ctx, "change", types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{})
	must(t, err)
	must(t, cs.Delete(ctx, "drop", metav1.DeleteOptions{}))
	_, err = cs.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{})
	must(t, err)

	b.start() // in another working directory, as each run
	got := read(6)
	tail := got[3:]
	slices.Sort(tail)
	want := []string{"change.updated checkpoint", "drop.deleted checkpoint", "new.added checkpoint"}
	if strings.Join(tail, ",") != strings.Join(want, ",") {
		t.Errorf("after the move: %v, want %v (all: %v)", tail, want, got)
	}
	for _, m := range msgs {
		var e ce
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatalf("%s: %v", m.Subject, err)
		}
		change := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		if e.Change != change || m.Header.Get("ce-kbchange") != change || e.change() != change {
			t.Errorf("%s: kbchange %q, header ce-kbchange %q, type %s", m.Subject, e.Change, m.Header.Get("ce-kbchange"), e.Type)
		}
		if e.Data.Object["apiVersion"] != "v1" || e.Data.Object["kind"] != "ConfigMap" {
			t.Errorf("%s: data.object has apiVersion %v, kind %v; want v1, ConfigMap:\n%s", m.Subject, e.Data.Object["apiVersion"], e.Data.Object["kind"], m.Data)
		}
	}
}

// verifyAgainstTruth compares what a sink holds (events, in delivery order)
// with the apiserver, until they agree or a minute passes: every existing
// object's last event carries its current resourceVersion, every deleted
// object the consumer saw ends with a deletion. It logs delivered, lost and
// duplicated counts; lost must be 0.
func verifyAgainstTruth(t *testing.T, cp *testenv.ControlPlane, namespaces []string, l *load, fault string, received func() []ce) {
	t.Helper()
	cs := cp.Clientset(t)
	current := map[string]string{} // ns/name -> resourceVersion
	for _, ns := range namespaces {
		list, err := cs.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			if strings.HasPrefix(cm.Name, "obj-") {
				current[ns+"/"+cm.Name] = cm.ResourceVersion
			}
		}
		if l.widgets {
			ws, err := dynamic.NewForConfigOrDie(cp.RESTConfig()).Resource(testenv.WidgetGVR).Namespace(ns).List(context.Background(), metav1.ListOptions{})
			must(t, err)
			for _, w := range ws.Items {
				current[ns+"/"+w.GetName()] = w.GetResourceVersion()
			}
		}
	}
	check := func(evs []ce) (lost []string, dups int) {
		last := map[string]ce{}
		ids := map[string]int{}
		for _, e := range evs {
			last[e.Subject] = e
			ids[e.ID]++
		}
		for _, n := range ids {
			dups += n - 1
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for key := range l.created {
			e, ok := last[key]
			rv, exists := current[key]
			switch {
			case exists && (!ok || e.change() == "deleted" || !strings.HasSuffix(strings.TrimSuffix(e.ID, "."+e.change()), "."+rv)):
				lost = append(lost, fmt.Sprintf("%s: current rv %s, last event %q", key, rv, e.ID))
			case !exists && ok && e.change() != "deleted": // never seen at all is fine: the consumer's view never had it
				lost = append(lost, fmt.Sprintf("%s: deleted, last event %q", key, e.ID))
			}
		}
		return lost, dups
	}
	var lost []string
	var dups int
	var evs []ce
	testenv.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		evs = received()
		lost, dups = check(evs)
		return len(lost) == 0
	})
	l.mu.Lock()
	ops := l.ops
	l.mu.Unlock()
	t.Logf("%s, %d changes: delivered %d events, lost %d, duplicated %d", fault, ops, len(evs), len(lost), dups)
	if len(lost) > 0 {
		t.Errorf("lost:\n  %s", strings.Join(lost[:min(len(lost), 20)], "\n  "))
	}
}

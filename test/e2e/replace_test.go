package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The pod replacement the chart's default install makes (a helm upgrade, a
// config change, a node drain) is, for the bridge, strategy Recreate on a
// ReadWriteOnce claim: the old process gets SIGTERM and exits, then a new
// one starts, in a new working directory, on the same data directory, and
// takes the Lease (leader election with one replica, as the chart runs it). Here
// the bridge is replaced that way 5 times (once with SIGKILL, as an OOM
// kill or a node lost before the grace period ends) while ConfigMaps are
// created, updated and deleted, and objects the consumer holds are deleted
// while no bridge runs. A webhook consumer applying the events by uid must
// then hold exactly the apiserver's objects (lost = 0), never be sent an
// object it holds as added again under a new id (what a new pod on an empty
// checkpoint does), and get every deletion made during a handover.
func TestReplacementOnTheSameVolumeDuringChurn(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	run := rand.IntN(1 << 20) // namespaces of their own under -count
	namespaces := []string{fmt.Sprintf("replace-a-%d", run), fmt.Sprintf("replace-b-%d", run)}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	recv := newGenReceiver(t)
	volume := t.TempDir() // the PersistentVolumeClaim

	l := startLoad(t, cp, namespaces, false)
	cs := cp.Clientset(t)
	ctx := context.Background()

	lease := namespaces[0]
	bridge := startPod(t, cp, replaceConfig(recv.URL, filepath.Join(volume, "state.db"), namespaces), lease)
	const replacements = 5
	const killAt = 3                // this one is a SIGKILL
	handover := map[string]string{} // uid -> ns/name, deleted while no bridge ran
	for i := 1; i <= replacements; i++ {
		live := time.Duration(800+rand.IntN(700)) * time.Millisecond // churn delivered live
		if i == killAt {
			live += 4 * time.Second // longer than killWindow: what came before must not come again
		}
		time.Sleep(live)
		var killed time.Time
		if i == killAt {
			bridge.kill()
			killed = time.Now()
		} else {
			bridge.stop()
		}
		// No bridge runs: the churn goes on, and objects the consumer holds
		// are deleted (their deletions are what an empty checkpoint loses).
		held := recv.mirror(t)
		n := 0
		for uid, o := range held {
			if n == 3 {
				break
			}
			ns, name, _ := strings.Cut(o.key, "/")
			err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: (*types.UID)(&uid)}})
			if err == nil {
				handover[uid] = o.key
				n++
			} else if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				t.Fatalf("delete %s: %v", o.key, err)
			}
		}
		time.Sleep(300 * time.Millisecond) // changes keep coming while it is down
		recv.next(killed)
		bridge.start() // a new pod on the same volume
	}
	time.Sleep(time.Second)
	l.stop()
	if len(handover) < replacements {
		t.Fatalf("only %d objects deleted during %d handovers: the test did not exercise them", len(handover), replacements)
	}

	// The restart test's checker (by name: every object's last event carries
	// its current state, every deleted object's is a deletion) ...
	verifyAgainstTruth(t, cp, namespaces, l, fmt.Sprintf("%d replacements on one volume", replacements), recv.events)
	// ... and the model's: applied by uid, the consumer holds the truth.
	rep := waitReplaceReport(t, cp, namespaces, recv, handover)
	t.Logf("%d events, %d generations, %d deleted during handovers (%d delivered as kbreplay: checkpoint), %d duplicate ids, %d sent again after the SIGKILL (last acknowledged within %s before it)",
		len(recv.events()), replacements+1, len(handover), rep.handoverReplayed, rep.dups, rep.resentAfterKill, killWindow)
	rep.fail(t)
	if !strings.Contains(bridge.log(), "replayedFromCheckpoint") {
		t.Error("no reconciliation from the checkpoint logged")
	}
}

// The same replacement on an emptyDir (persistence.enabled=false): the new
// bridge starts from an empty checkpoint, sends every object the consumer
// holds as added under a new id and never sends the deletion made while it
// was replaced, which is what the chart's install notes warn about. This
// also shows that the checker above notices both.
func TestReplacementOnAnEmptyDirResendsAndLosesDeletions(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{fmt.Sprintf("replace-empty-%d", rand.IntN(1<<20))}
	testenv.EnsureNamespace(t, cp, namespaces[0])
	recv := newGenReceiver(t)
	config := func() string { // a new emptyDir for each pod
		return replaceConfig(recv.URL, filepath.Join(t.TempDir(), "state.db"), namespaces)
	}
	cs := cp.Clientset(t).CoreV1().ConfigMaps(namespaces[0])
	ctx := context.Background()
	for i := range 5 {
		_, err := cs.Create(ctx, newConfigMap(fmt.Sprintf("obj-%d", i)), metav1.CreateOptions{})
		must(t, err)
	}
	bridge := startPod(t, cp, config(), namespaces[0])
	testenv.Eventually(t, 30*time.Second, "the 5 objects delivered", func() bool { return len(recv.mirror(t)) == 5 })
	bridge.stop()
	handover := map[string]string{}
	for uid, o := range recv.mirror(t) {
		if len(handover) == 2 {
			break
		}
		must(t, cs.Delete(ctx, strings.TrimPrefix(o.key, namespaces[0]+"/"), metav1.DeleteOptions{}))
		handover[uid] = o.key
	}
	recv.next(time.Time{})
	must(t, os.WriteFile(bridge.configPath, []byte(config()), 0o600))
	bridge.start()
	testenv.Eventually(t, 30*time.Second, "the 3 remaining objects sent again", func() bool {
		n := 0
		for _, e := range recv.received() {
			if e.gen == 1 && e.change() == "added" {
				n++
			}
		}
		return n == 3
	})
	rep := replaceCheck(t, recv, replaceTruth(t, cp, namespaces), handover)
	if len(rep.reAddedNewID) != 3 || len(rep.handoverMissing) != 2 || len(rep.extra) != 2 {
		t.Errorf("on an empty checkpoint: %d re-sent under new ids (want 3), %d handover deletions missing (want 2), the consumer holds %d deleted objects (want 2)\n%s",
			len(rep.reAddedNewID), len(rep.handoverMissing), len(rep.extra), rep)
	}
}

// startPod starts the bridge as the chart's default install runs it: with
// leader election (one replica, the Lease lease) and without hot reload;
// each start is in a new working directory (a new pod). It returns once
// the bridge leads and has reconciled with its checkpoint. (Shorter lease
// durations than the defaults only shorten the wait after a SIGKILL.)
func startPod(t *testing.T, cp *testenv.ControlPlane, config, lease string) *bridgeProc {
	t.Helper()
	return startBridge(t, cp, config, withConfigCheckpoint(), withLogLevel("info"), withFlags("--reload=false"),
		withLeaderElection("default", lease), withShortLease(),
		withReadyLog(`msg="bridge started" `)) // (not "bridge started; campaigning")
}

func replaceConfig(url, checkpoint string, namespaces []string) string {
	return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
checkpoint: {file: ` + checkpoint + `}
sinks:
  - name: hook
    webhook: {url: "` + url + `", batch: {maxEvents: 100, maxWait: 20ms}}
    retry: {initialInterval: 50ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + strings.Join(namespaces, ", ") + `]
    sinks: [hook]
`
}

// newConfigMap is a ConfigMap named name with one data key.
func newConfigMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "0"}}
}

// genReceiver is a webhook consumer (batch mode) that stamps each event
// with the generation of the bridge that sent it: 0 for the first process,
// i after the i-th replacement.
type genReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	evs   []genEvent
	gen   int
	kills map[int]time.Time // generation -> when its predecessor was SIGKILLed
}

type genEvent struct {
	ce
	gen             int
	at              time.Time // arrival
	uid, rv, incarn string    // incarn: <uid>.<tag> of the id
}

func newGenReceiver(t *testing.T) *genReceiver {
	r := &genReceiver{kills: map[int]time.Time{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var batch []json.RawMessage
		if err := json.Unmarshal(body, &batch); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, raw := range batch {
			var e ce
			if err := json.Unmarshal(raw, &e); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			e.raw = raw
			r.evs = append(r.evs, genEvent{ce: e, gen: r.gen, at: time.Now()})
		}
	}))
	t.Cleanup(r.Close)
	return r
}

// next starts a generation: the previous bridge has exited, SIGKILLed at
// killed (or zero: stopped cleanly).
func (r *genReceiver) next(killed time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	if !killed.IsZero() {
		r.kills[r.gen] = killed
	}
}

func (r *genReceiver) received() []genEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// events is what the consumer got, in arrival order (for verifyAgainstTruth).
func (r *genReceiver) events() []ce {
	var out []ce
	for _, e := range r.received() {
		out = append(out, e.ce)
	}
	return out
}

// heldObj is what the consumer holds under a uid; last (for the checker)
// is the arrival of its last event.
type heldObj struct {
	key, rv, incarn string
	last            time.Time
}

// mirror applies the events so far by uid, as the consumer does.
func (r *genReceiver) mirror(t *testing.T) map[string]heldObj {
	held := map[string]heldObj{}
	for _, e := range r.received() {
		e := parseGenEvent(t, e)
		switch e.change() {
		case "added", "updated":
			held[e.uid] = heldObj{key: e.Subject, rv: e.rv, incarn: e.incarn}
		case "deleted":
			delete(held, e.uid)
		}
	}
	return held
}

// parseGenEvent reads the object's uid and resourceVersion and the id's
// incarnation (<uid>.<tag>.<resourceVersion>.<type>, docs/guarantees.md).
func parseGenEvent(t *testing.T, e genEvent) genEvent {
	t.Helper()
	md, _ := e.Data.Object["metadata"].(map[string]any)
	e.uid, _ = md["uid"].(string)
	e.rv, _ = md["resourceVersion"].(string)
	parts := strings.Split(e.ID, ".")
	if e.uid == "" || len(parts) != 4 || parts[0] != e.uid {
		t.Fatalf("event without data.object.metadata.uid, or whose id is not <uid>.<tag>.<resourceVersion>.<type>: %s", e.raw)
	}
	e.incarn = parts[0] + "." + parts[1]
	return e
}

// replaceTruth is the apiserver's obj-* ConfigMaps: uid -> resourceVersion.
func replaceTruth(t *testing.T, cp *testenv.ControlPlane, namespaces []string) map[string]heldObj {
	t.Helper()
	truth := map[string]heldObj{}
	for _, ns := range namespaces {
		list, err := cp.Clientset(t).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
		must(t, err)
		for _, cm := range list.Items {
			if strings.HasPrefix(cm.Name, "obj-") {
				truth[string(cm.UID)] = heldObj{key: ns + "/" + cm.Name, rv: cm.ResourceVersion}
			}
		}
	}
	return truth
}

// replaceReport is what a consumer applying the events by uid finds wrong.
type replaceReport struct {
	missing, stale, extra []string // the mirror against the truth
	// reAddedNewID: added for a uid the consumer holds, under another
	// incarnation than the one it holds (a new id for an object it has:
	// what a bridge on an empty checkpoint sends).
	reAddedNewID []string
	// resent: a state the consumer holds (same uid and resourceVersion)
	// sent again, or added again, otherwise.
	resent []string
	// handoverMissing: deleted while no bridge ran, never delivered as
	// deleted since.
	handoverMissing []string
	// resentAfterKill counts what a SIGKILL allows to be sent again: the
	// objects whose last event arrived within killWindow before it (their
	// acknowledgement may not be in the checkpoint yet). docs/guarantees.md:
	// duplicates, and after a crash an added or updated as a new
	// incarnation (Ids).
	handoverReplayed, resentAfterKill, dups int
}

func (r replaceReport) failed() bool {
	return len(r.missing)+len(r.stale)+len(r.extra)+len(r.reAddedNewID)+len(r.resent)+len(r.handoverMissing) > 0
}

func (r replaceReport) String() string {
	var b strings.Builder
	for _, c := range []struct {
		name string
		msgs []string
	}{{"view-missing (lost)", r.missing}, {"view-stale", r.stale}, {"view-extra", r.extra},
		{"sent as added again under a new id", r.reAddedNewID}, {"sent again unchanged", r.resent},
		{"deleted during a handover, never delivered", r.handoverMissing}} {
		if len(c.msgs) > 0 {
			fmt.Fprintf(&b, "%s: %d\n  %s\n", c.name, len(c.msgs), strings.Join(c.msgs[:min(len(c.msgs), 20)], "\n  "))
		}
	}
	return b.String()
}

func (r replaceReport) fail(t *testing.T) {
	t.Helper()
	if r.failed() {
		t.Errorf("the consumer disagrees with the apiserver:\n%s", r)
	}
}

// killWindow bounds what a SIGKILL may leave unrecorded: the acknowledgements
// of the last --checkpoint-interval (1s), the write in progress, and a slow
// write on a loaded machine.
const killWindow = 3 * time.Second

// replaceCheck applies the events received by uid, in arrival order, and
// compares the result with the truth (uid -> resourceVersion). Outside
// what a SIGKILL allows, a replacement must send exactly what changed: no
// event re-sends a state the consumer holds, and no added comes for an
// object it holds.
func replaceCheck(t *testing.T, recv *genReceiver, truth map[string]heldObj, handover map[string]string) replaceReport {
	t.Helper()
	var rep replaceReport
	evs := recv.received()
	recv.mu.Lock()
	kills := maps.Clone(recv.kills)
	recv.mu.Unlock()
	held := map[string]heldObj{}
	ids := map[string]bool{}
	deletedAfter := map[string]genEvent{} // uid -> its last deletion
	for _, e := range evs {
		e = parseGenEvent(t, e)
		if ids[e.ID] {
			rep.dups++
		}
		ids[e.ID] = true
		h, holds := held[e.uid]
		if c := e.change(); c == "deleted" {
			delete(held, e.uid)
			deletedAfter[e.uid] = e
			continue
		} else if holds && (c == "added" || h.rv == e.rv) {
			killed, afterKill := kills[e.gen]
			what := fmt.Sprintf("%s uid %s: held as %s at rv %s (last event %s), sent %s by bridge #%d",
				e.Subject, e.uid, h.incarn, h.rv, h.last.Format("15:04:05.000"), e.ID, e.gen)
			switch {
			case afterKill && h.last.After(killed.Add(-killWindow)):
				rep.resentAfterKill++
			case c == "added" && h.incarn != e.incarn:
				rep.reAddedNewID = append(rep.reAddedNewID, what)
			default:
				rep.resent = append(rep.resent, what)
			}
		}
		held[e.uid] = heldObj{key: e.Subject, rv: e.rv, incarn: e.incarn, last: e.at}
	}
	for uid, o := range truth {
		h, ok := held[uid]
		switch {
		case !ok:
			rep.missing = append(rep.missing, fmt.Sprintf("%s uid %s rv %s: not held", o.key, uid, o.rv))
		case h.rv != o.rv:
			rep.stale = append(rep.stale, fmt.Sprintf("%s uid %s: at rv %s, held at rv %s", o.key, uid, o.rv, h.rv))
		}
	}
	for uid, h := range held {
		if _, ok := truth[uid]; !ok {
			rep.extra = append(rep.extra, fmt.Sprintf("%s uid %s: deleted, held at rv %s", h.key, uid, h.rv))
		}
	}
	for uid, key := range handover {
		switch d, ok := deletedAfter[uid]; {
		case !ok:
			rep.handoverMissing = append(rep.handoverMissing, fmt.Sprintf("%s uid %s", key, uid))
		case d.Replay == "checkpoint":
			rep.handoverReplayed++
		}
	}
	for _, s := range [][]string{rep.missing, rep.stale, rep.extra, rep.handoverMissing} {
		slices.Sort(s)
	}
	return rep
}

// waitReplaceReport runs replaceCheck until the consumer agrees with the
// apiserver or 60s pass (a slow retry is not a loss).
func waitReplaceReport(t *testing.T, cp *testenv.ControlPlane, namespaces []string, recv *genReceiver, handover map[string]string) replaceReport {
	t.Helper()
	var rep replaceReport
	testenv.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		rep = replaceCheck(t, recv, replaceTruth(t, cp, namespaces), handover)
		return !rep.failed()
	})
	return rep
}

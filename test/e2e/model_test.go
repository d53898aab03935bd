package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/mirror"
)

// TestModel is a seeded randomized model test of the delivery contract
// (docs/guarantees.md). A random schedule of object changes (create,
// update, delete, delete+recreate under the same name, label changes that
// move objects in and out of views, namespace label flips under a
// namespaceSelector) is interleaved with faults (bridge SIGKILL and SIGTERM
// restarts, webhook outages, hot reloads that change selectors, apiserver
// restarts with changes made while it is down, NATS restarts, a webhook
// that refuses some objects for a while — retryably (500) or permanently
// (422), so that no refusal may be recorded as a delivery — and churn
// (objects created and deleted) while the webhook is down, under rules that
// send only deletions too; a rotation of the webhook's bearer token, 401
// until the bridge reads the new token file; a CRD deleted, its objects
// with it, and installed again, under rules on its resource). The bridge
// runs as a subprocess with a file checkpoint and sinks: a file, a
// JetStream stream, a webhook, a webhook whose request is shaped by CEL
// (with an update window, so that its updates coalesce per object), a
// digest (a webhook whose request lists a period's events, each object's
// latest state once, one request per namespace), an alert sink (the alertmanager preset, posting to a real Alertmanager) on
// the full rules of modelAlertRules, and two routed sinks (a file and a
// webhook) that rule r-all chooses between per object by a route over its
// namespace's kbteam label (and, in the other config variant, the object's
// team label), which namespace relabels (nsteam) and reloads move objects
// across. After quiescence a checker compares what each sink received with
// the apiserver's truth (a routed sink's view: the objects routed to it):
//
//   - rules with events [added, updated, deleted]: a consumer that applies
//     the events in arrival order, keyed by uid (added/updated hold the uid
//     at that resourceVersion, deleted drops it), holds exactly the rule's
//     view computed from the apiserver (each object at its final
//     resourceVersion, no other uid);
//   - rules with events [deleted] or [updated, deleted]: every uid that the
//     full rule with the same selectors saw on the same sink and that is
//     not in the final view has a last event that is a deletion (unless
//     the partial rule got nothing for it and the object lived under 2 s
//     or a queue was dropped during its life: the limits
//     docs/guarantees.md states; noted, not failed);
//   - no event of a type the rule does not deliver;
//   - a deletion of an object that still exists says kbreason: unmatched;
//   - one id never names two different transitions (rule, type, uid,
//     resourceVersion, kbreason, and for full rules which entry of the uid
//     into the view it belongs to); duplicates are allowed and counted;
//   - the alert sink: Alertmanager's active alerts of each alert rule
//     (alertname) fire for exactly the uids of the rule's view, none lost,
//     none for an object outside it (ghost), with the object's labels.
//
// Environment:
//
//	KUBEBRIDGE_MODEL_SEED    first seed (default: time-based); each run logs its seed
//	KUBEBRIDGE_MODEL_OPS     operations per run (default 60)
//	KUBEBRIDGE_MODEL_RUNS    runs, with seeds SEED, SEED+1, ... (default 1)
//	KUBEBRIDGE_MODEL_FAULTS  comma list of kill,term,hook,reload,apiserver,nats,refuse,churn,rotate,crd,scale,partition,kafka; "none"; default all
//	KUBEBRIDGE_MODEL_RULES   comma list of rule names to configure (default all: a-all,a-del,b-all,b-upd,c-all,c-del,g-all,g-del,r-all)
//	KUBEBRIDGE_MODEL_KEEP    a directory: on failure, the bridge log and what each sink received are copied there
//	KUBEBRIDGE_MODEL_SHARDS  TestModel with sharding: that many shards (default 0: one bridge, file checkpoint)
//
// TestModelSharded runs the same model with sharding (4 shards, NATS KV
// checkpoint) and two to three replicas: a kill or term hits one replica,
// the others keep delivering; a reload applies in place on every replica,
// with a replica joining meanwhile while there are fewer than three;
// scale adds a replica or takes one away (SIGTERM). The apiserver
// fault is an outage past the shard Leases' renew deadline: every
// replica's holds lapse, and resume with their queues once it is back.
//
// The partition fault (both tests) stalls one bridge's link to NATS (each
// bridge then reaches NATS through a proxy of its own) for longer than the
// drain and the lease while the apiserver stays reachable, with its shards
// moving meanwhile (a replica joins, or it is SIGTERMed), then lets it
// recover: what it wrote into the link lands late. JetStream and the KV
// checkpoint fence (a stale owner's write is refused where it lands), so
// the checker stays as strict for the stream as without it
// (partition_test.go).
//
// The seed fixes the schedule (operations, their targets, fault kinds and
// durations), not the timing relative to the bridge, so a rerun with the
// same seed explores the same scenario but may interleave differently.
func TestModel(t *testing.T) {
	t.Parallel()
	testModel(t, modelEnvInt("KUBEBRIDGE_MODEL_SHARDS", 0))
}

// TestModelSharded runs alone: in one of five parallel runs of the package
// on a loaded machine (2026-11-27) a check failed (seed 180165612, which
// passed alone), and until that is understood it gets the machine to itself.
func TestModelSharded(t *testing.T) { testModel(t, modelEnvInt("KUBEBRIDGE_MODEL_SHARDS", 4)) }

func testModel(t *testing.T, shards int) {
	seed := time.Now().UnixNano() % 1_000_000_000
	if s, err := strconv.ParseInt(os.Getenv("KUBEBRIDGE_MODEL_SEED"), 10, 64); err == nil {
		seed = s
	}
	ops := modelEnvInt("KUBEBRIDGE_MODEL_OPS", 60)
	runs := modelEnvInt("KUBEBRIDGE_MODEL_RUNS", 1)
	faults := map[string]bool{}
	for _, f := range modelFaultKinds {
		faults[f] = true
	}
	if v := os.Getenv("KUBEBRIDGE_MODEL_FAULTS"); v != "" {
		faults = map[string]bool{}
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" && f != "none" {
				if !slices.Contains(modelFaultKinds, f) {
					t.Fatalf("KUBEBRIDGE_MODEL_FAULTS: unknown fault %q (known: %v)", f, modelFaultKinds)
				}
				faults[f] = true
			}
		}
	}
	if shards == 0 {
		delete(faults, "scale") // replicas come and go only when they share shards
	}
	var only map[string]bool
	if v := os.Getenv("KUBEBRIDGE_MODEL_RULES"); v != "" {
		only = map[string]bool{}
		for _, r := range strings.Split(v, ",") {
			only[strings.TrimSpace(r)] = true
		}
	}
	for i := range runs {
		s := seed + int64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			m := &modelRun{t: t, seed: s, nOps: ops, faults: faults, only: only, shards: shards}
			m.run()
		})
	}
}

func modelEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

var (
	modelFaultKinds = []string{"kill", "term", "hook", "reload", "apiserver", "nats", "refuse", "churn", "rotate", "crd", "scale", "partition", "kafka"}
	modelNamespaces = []string{"mdl-a", "mdl-b", "mdl-c", "mdl-d"}
	modelNames      = []string{"o0", "o1", "o2", "o3", "o4", "o5"}
	modelSinks      = []string{"file", "bus", "hook", "shaped", "digest"}
	// modelRoutedSinks are the sinks of the routed rule (family r), the
	// first its route's default.
	modelRoutedSinks = []string{"rt-x", "rt-y"}
	modelAllEvents   = []string{"added", "updated", "deleted"}
	// modelAlertRules also send to the alert sink (when configured): full
	// rules, whose events describe the view; b's selectors are the same in
	// both config variants, c's change with a reload.
	modelAlertRules = []string{"b-all", "c-all"}
)

// modelRule is one rule of the config; family names the selectors it
// shares with the other rules of its family (one full rule, one partial).
type modelRule struct {
	name, family string
	events       []string
}

var modelRules = []modelRule{
	{"a-all", "a", modelAllEvents},
	{"a-del", "a", []string{"deleted"}},
	{"b-all", "b", modelAllEvents},
	{"b-upd", "b", []string{"updated", "deleted"}},
	{"c-all", "c", modelAllEvents},
	{"c-del", "c", []string{"deleted"}},
	// Family g watches gadgets, a CRD the crd fault deletes (its objects go
	// with it) and installs again.
	{"g-all", "g", modelAllEvents},
	{"g-del", "g", []string{"deleted"}},
	// Family r routes each object to one of modelRoutedSinks (modelRoute).
	{"r-all", "r", modelAllEvents},
}

func (r modelRule) full() bool { return len(r.events) == 3 }

// routed says whether the rule routes each object to one of
// modelRoutedSinks, rather than sending it to every one of modelSinks.
func (r modelRule) routed() bool { return r.family == "r" }

// modelRouteExpr is the routed rule's route in a config variant; modelRoute
// is what it chooses, as the bridge should: the namespace's kbteam (x or y;
// another team, or none, goes to the default rt-x) and, in variant 1, the
// object's team label blue first. An object without labels has no
// metadata.labels: `.?labels` reads it optionally, as a user must (a plain
// `.labels` fails the route, which then sends the object to its default).
func modelRouteExpr(variant int) string {
	byNS := "'rt-' + namespaceLabels.kbteam"
	if variant == 1 {
		return "object.metadata.?labels.?team.orValue('') == 'blue' ? 'rt-y' : " + byNS
	}
	return byNS
}

func modelRoute(o modelObj, nsLabels map[string]map[string]string, variant int) string {
	if variant == 1 && o.labels["team"] == "blue" {
		return "rt-y"
	}
	if t := nsLabels[o.ns]["kbteam"]; t == "x" || t == "y" {
		return "rt-" + t
	}
	return modelRoutedSinks[0]
}

// modelSelectors are a family's selectors in a config variant (0 or 1;
// a hot reload switches variants).
type modelSelectors struct {
	resource          string // "" for configmaps
	namespaces        []string
	namespaceSelector string
	labelSelector     string
}

func modelFamily(family string, variant int) modelSelectors {
	switch family {
	case "a":
		if variant == 1 {
			return modelSelectors{namespaces: []string{"mdl-a", "mdl-b"}, labelSelector: "team in (red,blue)"}
		}
		return modelSelectors{namespaces: []string{"mdl-a", "mdl-b"}, labelSelector: "team=red"}
	case "b":
		return modelSelectors{namespaceSelector: "kbmodel=on", labelSelector: "tier!=skip"}
	case "g":
		return modelSelectors{resource: "gadgets"}
	case "r":
		return modelSelectors{namespaces: modelNamespaces, labelSelector: "tier!=skip"}
	default:
		if variant == 1 {
			return modelSelectors{namespaces: []string{"mdl-a", "mdl-c"}, labelSelector: "team!=green"}
		}
		return modelSelectors{namespaces: []string{"mdl-a", "mdl-c"}}
	}
}

// matches applies the selectors to an object, as the bridge should.
func (s modelSelectors) matches(o modelObj, nsLabels map[string]map[string]string) bool {
	if o.resource != s.resource {
		return false
	}
	if len(s.namespaces) > 0 && !slices.Contains(s.namespaces, o.ns) {
		return false
	}
	if s.namespaceSelector != "" {
		sel, err := labels.Parse(s.namespaceSelector)
		if err != nil || !sel.Matches(labels.Set(nsLabels[o.ns])) {
			return false
		}
	}
	if s.labelSelector != "" {
		sel, err := labels.Parse(s.labelSelector)
		if err != nil || !sel.Matches(labels.Set(o.labels)) {
			return false
		}
	}
	return true
}

// modelObj is an object as the apiserver holds it.
type modelObj struct {
	resource          string // "" for configmaps
	ns, name, uid, rv string
	labels            map[string]string
}

// modelRun is one seeded run: its own control plane, NATS, webhook and bridge.
type modelRun struct {
	t      *testing.T
	seed   int64
	nOps   int
	faults map[string]bool
	only   map[string]bool
	rng    *rand.Rand

	cp   *testenv.ControlPlane
	cs   kubernetes.Interface
	nats *testenv.NATS
	// kafka is the broker of the kafka sink (kfake, a process of its
	// own, synced to disk), which the kafka fault restarts.
	kafka *testenv.Kafka
	nc    *natsgo.Conn
	js    jetstream.JetStream
	hook  *hookReceiver
	// shaped receives a webhook sink whose request is shaped by CEL (a
	// one-element list in the CloudEvents layout), so that the same
	// checker holds templated requests to the same promise.
	shaped *hookReceiver
	// digest receives a digest sink: each request lists a period's events
	// of one namespace (in the CloudEvents layout), each object once.
	digest *hookReceiver
	// am is the alert sink's receiver: a real Alertmanager.
	am *testenv.Alertmanager
	// routed receives the routed sink rt-y (a webhook; it goes down with
	// hook); rt-x appends to routedPath.
	routed     *hookReceiver
	routedPath string

	dir, cfgPath, ckptPath, filePath string
	// bridges are the running replicas: one, or (shards > 0) two to three
	// sharing the shards; replicaN names the next one.
	bridges     []*bridgeProc
	shards      int
	replicaN    int
	variant     int
	hookUpAt    time.Time // zero while the webhook is up
	refuseUntil time.Time // zero while the webhook refuses nothing
	apiBackAt   time.Time // when the last apiserver outage ended
	// drops are the moments a queue may have been dropped: a SIGKILL, a
	// SIGTERM whose drain timed out, and (sharded) any replica joining
	// or leaving, whose shards move with what their queues held.
	drops     []time.Time
	tokenPath string    // the webhook's bearerTokenFile
	token     string    // what the webhook takes
	rotateAt  time.Time // when the token file gets the new token; zero: done
	dyn       dynamic.Interface
	gadgets   int // gadgets made so far (names)

	start  time.Time
	opLog  []string
	live   map[string][]string // namespace -> names that exist (as far as the generator knows)
	uids   map[string]string   // namespace/name -> uid of the last creation
	nsOn   map[string]bool     // namespace -> kbmodel=on
	nsTeam map[string]string   // namespace -> kbteam ("": none)

	notes     []string       // fault outcomes worth reporting (not failures)
	kinds     map[string]int // operations scheduled, by kind
	noMetrics bool
	links     map[string]*modelLink // config path -> the link to NATS of the bridge running on it (partition fault)
}

func (m *modelRun) rules() []modelRule {
	var out []modelRule
	for _, r := range modelRules {
		if m.only == nil || m.only[r.name] {
			out = append(out, r)
		}
	}
	return out
}

func (m *modelRun) logOp(format string, args ...any) {
	line := fmt.Sprintf("#%03d +%6.2fs ", len(m.opLog), time.Since(m.start).Seconds()) + fmt.Sprintf(format, args...)
	m.opLog = append(m.opLog, line)
}

func (m *modelRun) seedLine() string {
	return fmt.Sprintf("seed %d (rerun with KUBEBRIDGE_MODEL_SEED=%d)", m.seed, m.seed)
}

func (m *modelRun) run() {
	t := m.t
	t.Logf("seed %d (rerun with KUBEBRIDGE_MODEL_SEED=%d)", m.seed, m.seed)
	m.rng = rand.New(rand.NewPCG(uint64(m.seed), 0x6b75626562726964))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s\noperation log:\n  %s", m.seedLine(), strings.Join(m.opLog, "\n  "))
		}
	})

	m.cp = testenv.StartControlPlane(t)
	m.cs = m.cp.Clientset(t)
	m.nats = testenv.StartNATS(t)
	m.kafka = testenv.StartKafka(t)
	var err error
	m.nc, err = natsgo.Connect(m.nats.ClientURL(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(100*time.Millisecond))
	must(t, err)
	t.Cleanup(m.nc.Close)
	m.js, err = jetstream.New(m.nc)
	must(t, err)
	m.hook = &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	m.hook.up(t)
	t.Cleanup(func() {
		if m.hookUpAt.IsZero() {
			m.hook.down()
			if m.routed != nil {
				m.routed.down()
			}
		}
	})
	m.shaped = &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	m.shaped.up(t)
	t.Cleanup(m.shaped.down)
	m.digest = &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	m.digest.up(t)
	t.Cleanup(m.digest.down)
	if m.rulesOn("r") {
		m.routed = &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
		m.routed.up(t)
	}
	if len(m.alertRules()) > 0 {
		m.am = testenv.StartAlertmanager(t)
	}

	m.dir = t.TempDir()
	m.cfgPath = filepath.Join(m.dir, "config.yaml")
	m.ckptPath = filepath.Join(m.dir, "state.db")
	m.filePath = filepath.Join(m.dir, "events.jsonl")
	m.routedPath = filepath.Join(m.dir, "routed.jsonl")
	m.tokenPath = filepath.Join(m.dir, "hook-token")
	m.token = "token-0"
	must(t, os.WriteFile(m.tokenPath, []byte(m.token+"\n"), 0o600))
	m.hook.setToken(m.token)
	m.dyn = dynamic.NewForConfigOrDie(m.cp.RESTConfig())

	ctx := context.Background()
	m.start = time.Now()
	m.live = map[string][]string{}
	m.uids = map[string]string{}
	m.nsOn = map[string]bool{"mdl-a": true, "mdl-c": true}
	// Teams of the routed rule: each sink's, one without a sink (z), none.
	m.nsTeam = map[string]string{"mdl-a": "x", "mdl-b": "y", "mdl-c": "z", "mdl-d": ""}
	for _, ns := range modelNamespaces {
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"kbmodel": "off"}}}
		if m.nsOn[ns] {
			nsObj.Labels["kbmodel"] = "on"
		}
		if m.nsTeam[ns] != "" {
			nsObj.Labels["kbteam"] = m.nsTeam[ns]
		}
		_, err := m.cs.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{})
		must(t, err)
	}
	for range 4 { // objects that exist before the bridge starts (its first list)
		m.opCreate(m.cs)
	}
	if m.rulesOn("g") {
		installGadgets(t, m.dyn)
		for range 2 {
			m.createGadget()
		}
	}
	m.writeConfig()
	m.startBridge()
	t.Cleanup(m.stopBridgeAtEnd)

	schedule := m.schedule()
	m.kinds = map[string]int{}
	for _, k := range schedule {
		m.kinds[k]++
	}
	for i, kind := range schedule {
		m.maybeHookUp(false)
		m.maybeAccept(false)
		m.maybeRotate(false)
		m.checkBridgeAlive()
		m.do(kind, i)
		if d := m.rng.IntN(10); d < 6 {
			time.Sleep(time.Duration(m.rng.IntN(120)) * time.Millisecond)
		}
	}
	m.maybeHookUp(true)
	m.maybeAccept(true)
	m.maybeRotate(true)
	m.checkBridgeAlive()
	m.logOp("schedule done; waiting for quiescence")
	m.verify()
}

// schedule draws the operation kinds; every enabled fault occurs at least
// once, somewhere in the first 80% (so that changes follow it).
func (m *modelRun) schedule() []string {
	type w struct {
		kind   string
		weight int
	}
	weights := []w{{"create", 22}, {"update", 20}, {"delete", 9}, {"recreate", 8}, {"relabel", 14}, {"nsflip", 7},
		{"kill", 4}, {"term", 2}, {"hook", 3}, {"reload", 4}, {"apiserver", 2}, {"nats", 2}, {"refuse", 3}, {"churn", 2},
		{"rotate", 2}, {"crd", 2}, {"scale", 3}, {"partition", 2}, {"kafka", 2}}
	if m.rulesOn("r") {
		weights = append(weights, w{"nsteam", 5})
	}
	total := 0
	for _, x := range weights {
		if m.isFault(x.kind) && !m.faults[x.kind] {
			continue
		}
		total += x.weight
	}
	out := make([]string, m.nOps)
	for i := range out {
		r := m.rng.IntN(total)
		for _, x := range weights {
			if m.isFault(x.kind) && !m.faults[x.kind] {
				continue
			}
			if r < x.weight {
				out[i] = x.kind
				break
			}
			r -= x.weight
		}
	}
	for _, f := range modelFaultKinds {
		if !m.faults[f] || slices.Contains(out, f) {
			continue
		}
		for range 100 {
			i := m.rng.IntN(max(1, m.nOps*8/10))
			if !m.isFault(out[i]) {
				out[i] = f
				break
			}
		}
	}
	return out
}

func (m *modelRun) isFault(kind string) bool { return slices.Contains(modelFaultKinds, kind) }

func (m *modelRun) do(kind string, i int) {
	switch kind {
	case "create":
		m.opCreate(m.cs)
	case "update":
		m.opUpdate(m.cs, i)
	case "delete":
		m.opDelete(m.cs)
	case "recreate":
		m.opRecreate(m.cs)
	case "relabel":
		m.opRelabel(m.cs)
	case "nsflip":
		m.opNSFlip(m.cs)
	case "nsteam":
		m.opNSTeam(m.cs)
	case "kill", "term":
		m.restartBridge(kind)
	case "scale":
		m.scale()
	case "hook":
		if !m.hookUpAt.IsZero() {
			m.opUpdate(m.cs, i)
			return
		}
		d := time.Duration(2000+m.rng.IntN(3000)) * time.Millisecond
		m.hooksDown()
		m.hookUpAt = time.Now().Add(d)
		m.logOp("webhook down for %s", d)
	case "reload":
		m.reload()
	case "apiserver":
		n := m.rng.IntN(4)
		m.logOp("apiserver down (%d changes through a second apiserver)", n)
		m.cp.WhileAPIServerDown(m.t, func(alt *rest.Config) {
			cs := kubernetes.NewForConfigOrDie(alt)
			for range n {
				m.randomChange(cs, i)
			}
		})
		m.apiBackAt = time.Now()
		m.logOp("apiserver back")
	case "partition":
		m.partition(i)
	case "nats":
		m.nats.Restart(m.t)
		m.logOp("NATS restarted")
	case "kafka":
		m.kafka.Restart(m.t)
		m.logOp("Kafka broker restarted")
	case "refuse":
		if !m.refuseUntil.IsZero() {
			m.opUpdate(m.cs, i)
			return
		}
		// Some objects' events are refused for a while: by name, so that
		// every incarnation of them is. The others must flow meanwhile.
		retryable := modelNames[m.rng.IntN(len(modelNames))]
		// The permanent refusal hits an object every config variant's
		// family c holds (mdl-a, mdl-c): its deletion below must reach the
		// webhook's consumer once the refusal ends.
		ns := []string{"mdl-a", "mdl-c"}[m.rng.IntN(2)]
		if len(m.live[ns]) == 0 {
			m.create(m.cs, ns, modelNames[m.rng.IntN(len(modelNames))], "create (to refuse)")
			time.Sleep(300 * time.Millisecond)
		}
		permanent := modelNames[0]
		if live := m.live[ns]; len(live) > 0 {
			permanent = live[m.rng.IntN(len(live))]
		}
		d := time.Duration(1500+m.rng.IntN(2500)) * time.Millisecond
		m.hook.setRefuse(func(e ce) int {
			switch name := e.Subject[strings.LastIndex(e.Subject, "/")+1:]; name {
			case permanent:
				return http.StatusUnprocessableEntity
			case retryable:
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		m.refuseUntil = time.Now().Add(d)
		m.logOp("webhook refuses %s (422) and %s (500) for %s", permanent, retryable, d)
		// A deletion refused is the loss that never heals (no later event
		// of that uid), an update refused the one that heals only by luck:
		// make both happen inside the window.
		for _, n := range modelNamespaces {
			if slices.Contains(m.live[n], retryable) && retryable != permanent {
				m.patch(m.cs, n, retryable, "update (refused 500)", fmt.Sprintf(`{"data":{"v":"%d"}}`, i))
			}
		}
		if slices.Contains(m.live[ns], permanent) {
			err := m.cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), permanent, metav1.DeleteOptions{})
			m.logOp("delete %s/%s (refused 422): %v", ns, permanent, err)
			if err == nil {
				m.forget(ns, permanent)
			}
		}
	case "rotate":
		// The receiver takes a new token at once; the token file follows a
		// little later, as a Secret's mounted copy does. Meanwhile the
		// webhook answers 401: retried, never dead-lettered, nothing lost.
		if !m.rotateAt.IsZero() {
			m.opUpdate(m.cs, i)
			return
		}
		m.token = fmt.Sprintf("token-%d", i)
		m.hook.setToken(m.token)
		d := time.Duration(300+m.rng.IntN(2000)) * time.Millisecond
		m.rotateAt = time.Now().Add(d)
		m.logOp("webhook token rotated; the token file follows in %s", d)
		m.opUpdate(m.cs, i)
	case "crd":
		if !m.rulesOn("g") {
			m.opUpdate(m.cs, i)
			return
		}
		for range 1 + m.rng.IntN(2) {
			m.createGadget()
		}
		time.Sleep(time.Duration(m.rng.IntN(800)) * time.Millisecond)
		deleteGadgets(m.t, m.dyn)
		m.logOp("gadgets CRD deleted (its objects with it)")
		time.Sleep(time.Duration(m.rng.IntN(1500)) * time.Millisecond)
		installGadgets(m.t, m.dyn)
		m.logOp("gadgets CRD installed again")
		for range m.rng.IntN(3) {
			m.createGadget()
		}
	case "churn":
		// Objects created and deleted while the webhook is down: every rule,
		// the deletions-only ones included, must end right when it is back.
		if m.hookUpAt.IsZero() {
			m.hooksDown()
			m.hookUpAt = time.Now().Add(time.Second)
		}
		n := 5 + m.rng.IntN(10)
		m.logOp("churn: %d objects created and deleted while the webhook is down", n)
		for range n {
			ns := modelNamespaces[m.rng.IntN(len(modelNamespaces))]
			name := modelNames[m.rng.IntN(len(modelNames))]
			if slices.Contains(m.live[ns], name) {
				continue
			}
			m.create(m.cs, ns, name, "churn")
			err := m.cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
			m.logOp("delete %s/%s (churn): %v", ns, name, err)
			if err == nil {
				m.forget(ns, name)
			}
		}
	}
}

// maybeRotate writes the rotated token to the token file when due (or now).
func (m *modelRun) maybeRotate(now bool) {
	if m.rotateAt.IsZero() || (!now && time.Now().Before(m.rotateAt)) {
		return
	}
	tmp := m.tokenPath + ".new"
	must(m.t, os.WriteFile(tmp, []byte(m.token+"\n"), 0o600))
	must(m.t, os.Rename(tmp, m.tokenPath)) // a new file, as a Secret volume swaps it
	m.rotateAt = time.Time{}
	m.logOp("token file rotated")
}

// alertRules are the configured rules that send to the alert sink.
func (m *modelRun) alertRules() []modelRule {
	var out []modelRule
	for _, r := range m.rules() {
		if r.full() && slices.Contains(modelAlertRules, r.name) {
			out = append(out, r)
		}
	}
	return out
}

// sinks are the sinks the checker reads: modelSinks, and the routed ones
// when the routed rule is configured.
func (m *modelRun) sinks() []string {
	if m.routed == nil {
		return slices.Clone(modelSinks)
	}
	return append(slices.Clone(modelSinks), modelRoutedSinks...)
}

// rulesTo are the configured rules that deliver to sink.
func (m *modelRun) rulesTo(sink string) []modelRule {
	routed := slices.Contains(modelRoutedSinks, sink)
	return slices.DeleteFunc(m.rules(), func(r modelRule) bool { return r.routed() != routed })
}

// sinkView is rule r's view in the truth as sink is to hold it: the
// routed rule's objects routed to sink.
func (m *modelRun) sinkView(tr modelTruth, r modelRule, sink string) map[string]string {
	v := tr.view(modelFamily(r.family, m.variant))
	if r.routed() {
		maps.DeleteFunc(v, func(uid, _ string) bool { return modelRoute(tr.objs[uid], tr.nsLabels, m.variant) != sink })
	}
	return v
}

// rulesOn says whether a rule of family is configured.
func (m *modelRun) rulesOn(family string) bool {
	return slices.ContainsFunc(m.rules(), func(r modelRule) bool { return r.family == family })
}

// createGadget creates a gadget in a model namespace.
func (m *modelRun) createGadget() {
	ns := modelNamespaces[m.rng.IntN(len(modelNamespaces))]
	name := fmt.Sprintf("g%d", m.gadgets)
	m.gadgets++
	g := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "missing.kubebridge.io/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"n": m.gadgets}}}
	_, err := m.dyn.Resource(gadgetGVR).Namespace(ns).Create(context.Background(), g, metav1.CreateOptions{})
	m.logOp("create gadget %s/%s: %v", ns, name, err)
}

// maybeAccept ends the webhook's refusals when their time is over (or now).
func (m *modelRun) maybeAccept(now bool) {
	if m.refuseUntil.IsZero() || (!now && time.Now().Before(m.refuseUntil)) {
		return
	}
	m.hook.setRefuse(nil)
	m.refuseUntil = time.Time{}
	m.logOp("webhook takes every object again")
}

// randomChange is one object or namespace change (while something is down).
func (m *modelRun) randomChange(cs kubernetes.Interface, i int) {
	kinds := 6
	if m.rulesOn("r") {
		kinds++ // a team relabel
	}
	switch m.rng.IntN(kinds) {
	case 0:
		m.opCreate(cs)
	case 1:
		m.opUpdate(cs, i)
	case 2:
		m.opDelete(cs)
	case 3:
		m.opRecreate(cs)
	case 4:
		m.opRelabel(cs)
	case 5:
		m.opNSFlip(cs)
	default:
		m.opNSTeam(cs)
	}
}

func (m *modelRun) randomLabels() map[string]string {
	l := map[string]string{}
	if team := []string{"red", "blue", "green", ""}[m.rng.IntN(4)]; team != "" {
		l["team"] = team
	}
	if m.rng.IntN(4) == 0 {
		l["tier"] = "skip"
	}
	return l
}

// pickLive returns an existing object, or false when there is none.
func (m *modelRun) pickLive() (string, string, bool) {
	var all [][2]string
	for _, ns := range modelNamespaces {
		for _, n := range m.live[ns] {
			all = append(all, [2]string{ns, n})
		}
	}
	if len(all) == 0 {
		return "", "", false
	}
	p := all[m.rng.IntN(len(all))]
	return p[0], p[1], true
}

func (m *modelRun) forget(ns, name string) {
	m.live[ns] = slices.DeleteFunc(m.live[ns], func(n string) bool { return n == name })
}

func (m *modelRun) opCreate(cs kubernetes.Interface) {
	ns := modelNamespaces[m.rng.IntN(len(modelNamespaces))]
	var free []string
	for _, n := range modelNames {
		if !slices.Contains(m.live[ns], n) {
			free = append(free, n)
		}
	}
	if len(free) == 0 {
		m.opUpdate(cs, len(m.opLog))
		return
	}
	m.create(cs, ns, free[m.rng.IntN(len(free))], "create")
}

func (m *modelRun) create(cs kubernetes.Interface, ns, name, what string) {
	l := m.randomLabels()
	cm, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Data: map[string]string{"v": "0"}}, metav1.CreateOptions{})
	if err != nil {
		m.logOp("%s %s/%s labels=%v: error %v", what, ns, name, l, err)
		return
	}
	m.live[ns] = append(m.live[ns], name)
	m.uids[ns+"/"+name] = string(cm.UID)
	m.logOp("%s %s/%s labels=%v -> uid=%s rv=%s", what, ns, name, l, cm.UID, cm.ResourceVersion)
}

func (m *modelRun) patch(cs kubernetes.Interface, ns, name, what, p string) {
	cm, err := cs.CoreV1().ConfigMaps(ns).Patch(context.Background(), name, types.MergePatchType, []byte(p), metav1.PatchOptions{})
	if err != nil {
		m.logOp("%s %s/%s %s: error %v", what, ns, name, p, err)
		return
	}
	m.logOp("%s %s/%s %s -> uid=%s rv=%s labels=%v", what, ns, name, p, cm.UID, cm.ResourceVersion, cm.Labels)
}

func (m *modelRun) opUpdate(cs kubernetes.Interface, i int) {
	ns, name, ok := m.pickLive()
	if !ok {
		m.opCreate(cs)
		return
	}
	m.patch(cs, ns, name, "update", fmt.Sprintf(`{"data":{"v":"%d-%d"}}`, i, m.rng.IntN(1000)))
}

func (m *modelRun) opRelabel(cs kubernetes.Interface) {
	ns, name, ok := m.pickLive()
	if !ok {
		m.opCreate(cs)
		return
	}
	var p string
	if m.rng.IntN(4) == 0 {
		p = `{"metadata":{"labels":{"tier":` + []string{`"skip"`, `null`}[m.rng.IntN(2)] + `}}}`
	} else {
		p = `{"metadata":{"labels":{"team":` + []string{`"red"`, `"blue"`, `"green"`, `null`}[m.rng.IntN(4)] + `}}}`
	}
	m.patch(cs, ns, name, "relabel", p)
}

func (m *modelRun) opDelete(cs kubernetes.Interface) {
	ns, name, ok := m.pickLive()
	if !ok {
		m.opCreate(cs)
		return
	}
	err := cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	m.forget(ns, name)
	m.logOp("delete %s/%s uid=%s: %v", ns, name, m.uids[ns+"/"+name], err)
}

func (m *modelRun) opRecreate(cs kubernetes.Interface) {
	ns, name, ok := m.pickLive()
	if !ok {
		m.opCreate(cs)
		return
	}
	err := cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	m.forget(ns, name)
	m.logOp("recreate: delete %s/%s uid=%s: %v", ns, name, m.uids[ns+"/"+name], err)
	m.create(cs, ns, name, "recreate: create")
}

// opNSTeam sets a namespace's kbteam label (or removes it): its objects
// move between the routed rule's sinks.
func (m *modelRun) opNSTeam(cs kubernetes.Interface) {
	ns := modelNamespaces[m.rng.IntN(len(modelNamespaces))]
	team := []string{"x", "y", "z", ""}[m.rng.IntN(4)]
	v := `"` + team + `"`
	if team == "" {
		v = "null"
	}
	_, err := cs.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"kbteam":`+v+`}}}`), metav1.PatchOptions{})
	if err == nil {
		m.nsTeam[ns] = team
	}
	m.logOp("namespace %s kbteam=%s: %v", ns, v, err)
}

func (m *modelRun) opNSFlip(cs kubernetes.Interface) {
	ns := modelNamespaces[m.rng.IntN(len(modelNamespaces))]
	v := "on"
	if m.nsOn[ns] {
		v = "off"
	}
	_, err := cs.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"kbmodel":"`+v+`"}}}`), metav1.PatchOptions{})
	if err == nil {
		m.nsOn[ns] = v == "on"
	}
	m.logOp("namespace %s kbmodel=%s: %v", ns, v, err)
}

// config renders the bridge config for the current variant.
func (m *modelRun) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: model
`)
	if m.shards > 0 {
		fmt.Fprintf(&b, "checkpoint: {natsKV: {sink: bus, bucket: kb-model}}\nsharding: {shards: %d}\n", m.shards)
	}
	fmt.Fprintf(&b, `sinks:
  - name: file
    file: {path: %s}
  - name: bus
    nats: {url: "%s", jetstream: true, stream: {name: MODEL, duplicateWindow: 10m}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: mirror
    nats: {url: "%s", mirror: {bucket: "model-{rule}"}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: kafka
    kafka: {brokers: ["%s"], topic: "model.{rule}", stateTopic: "model-state.{rule}", createTopics: true}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: hook
    webhook: {url: "http://%s/", timeout: 2s, batch: {maxEvents: 50, maxWait: 20ms}, bearerTokenFile: %s}
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: shaped
    webhook:
      url: "http://%s/"
      timeout: 2s
      request:
        method: PUT
        path: "'objects/' + event.subject"
        body: >-
          [{"specversion": "1.0", "id": event.id, "type": event.type, "subject": event.subject, "time": event.time,
            "kbrule": event.rule, "kbcluster": event.cluster, "kbreason": event.reason, "kbreplay": event.replay,
            "data": {"object": dyn(object)}}]
    updateWindow: 3s      # updates coalesce per object: the view must still come out exact
    retry: {initialInterval: 100ms, maxInterval: 1s}
  - name: digest
    webhook:
      url: "http://%s/"
      timeout: 2s
      request:
        digest: >-
          digest.items.map(i, {"specversion": "1.0", "id": i.id, "type": i.type, "subject": i.subject,
            "kbrule": i.rule, "kbcluster": event.cluster, "kbreason": i.reason, "kbreplay": i.replay,
            "data": {"object": i.object}})
    digest: {every: 2s, groupBy: object.metadata.namespace, max: 1000}   # one request per namespace and period
    retry: {initialInterval: 100ms, maxInterval: 1s}
`, m.filePath, m.nats.ClientURL(), m.nats.ClientURL(), m.kafka.Brokers()[0], m.hook.addr, m.tokenPath, m.shaped.addr, m.digest.addr)
	if m.am != nil {
		// endsAt is 5m ahead of each event: replayEvery keeps firing alerts
		// alive through a run longer than that (make chaos), and is long
		// enough that a short run's lost alert is not healed by a replay.
		fmt.Fprintf(&b, `  - name: alert
    webhook: {url: "%s/api/v2/alerts", timeout: 2s, preset: alertmanager}
    replayEvery: 2m
    retry: {initialInterval: 100ms, maxInterval: 1s}
`, m.am.URL)
	}
	if m.routed != nil {
		fmt.Fprintf(&b, `  - name: rt-x
    file: {path: %s}
  - name: rt-y
    webhook: {url: "http://%s/", timeout: 2s, batch: {maxEvents: 50, maxWait: 20ms}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
`, m.routedPath, m.routed.addr)
	}
	b.WriteString("rules:\n")
	for _, r := range m.rules() {
		s := modelFamily(r.family, m.variant)
		resource := "v1/configmaps"
		if s.resource == "gadgets" {
			resource = "missing.kubebridge.io/v1/gadgets"
		}
		fmt.Fprintf(&b, "  - name: %s\n    resource: %s\n", r.name, resource)
		if len(s.namespaces) > 0 {
			fmt.Fprintf(&b, "    namespaces: [%s]\n", strings.Join(s.namespaces, ", "))
		}
		if s.namespaceSelector != "" {
			fmt.Fprintf(&b, "    namespaceSelector: %q\n", s.namespaceSelector)
		}
		if s.labelSelector != "" {
			fmt.Fprintf(&b, "    labelSelector: %q\n", s.labelSelector)
		}
		sinks := modelSinks
		if m.am != nil && slices.Contains(modelAlertRules, r.name) && r.full() {
			sinks = append(slices.Clip(sinks), "alert")
		}
		if r.full() && !r.routed() { // a mirror holds a view, which takes every change
			sinks = append(slices.Clip(sinks), "mirror", "kafka")
		}
		if r.routed() {
			sinks = modelRoutedSinks
		}
		fmt.Fprintf(&b, "    events: [%s]\n    sinks: [%s]\n", strings.Join(r.events, ", "), strings.Join(sinks, ", "))
		if r.routed() {
			fmt.Fprintf(&b, "    route: {sink: %q, default: %s}\n", modelRouteExpr(m.variant), modelRoutedSinks[0])
		}
	}
	return b.String()
}

func (m *modelRun) startBridge() {
	if m.shards == 0 {
		if len(m.bridges) == 0 {
			m.bridges = []*bridgeProc{startBridge(m.t, m.cp, "", withConfigFile(m.configFor("bridge")), withCheckpointFile(m.ckptPath), withRestartFlags())}
		} else {
			m.bridges[0].start()
		}
		m.logOp("bridge started (pid %d, config variant %d)", m.bridges[0].cmd.Process.Pid, m.variant)
		return
	}
	for range 2 {
		m.addReplica()
	}
}

// addReplica starts one more replica sharing the shards (short Leases: a
// killed replica's shards move within seconds).
func (m *modelRun) addReplica() {
	name := fmt.Sprintf("replica-%d", m.replicaN)
	m.replicaN++
	b := startBridge(m.t, m.cp, "", withConfigFile(m.configFor(name)), withConfigCheckpoint(), withRestartFlags(), withShortLease(),
		withFlags("--leader-elect-namespace", "default", "--leader-elect-name", "kb-model", "--identity", name),
		withReadyLog("bridge started; sharing the shards"))
	m.bridges = append(m.bridges, b)
	m.drops = append(m.drops, time.Now()) // the others give shards back
	m.logOp("replica %s started (pid %d, config variant %d, %d replicas)", name, b.cmd.Process.Pid, m.variant, len(m.bridges))
}

// scale adds a replica (up to three) or takes one away (SIGTERM), at
// random; never below one.
func (m *modelRun) scale() {
	if m.shards == 0 {
		return
	}
	if len(m.bridges) < 3 && (len(m.bridges) == 1 || m.rng.IntN(2) == 0) {
		m.addReplica()
		return
	}
	i := m.rng.IntN(len(m.bridges))
	// As any SIGTERM: with the webhook down, the drain deadline passes and
	// the exit is 1 ("shutdown incomplete"), noted; what it did not deliver
	// is not acknowledged, and the shard's next owner sends it.
	m.terminate(m.bridges[i])
	m.bridges = slices.Delete(m.bridges, i, i+1)
	m.logOp("a replica scaled away (SIGTERM): %d replicas", len(m.bridges))
}

// checkBridgeAlive restarts a bridge that exited by itself, and says so.
func (m *modelRun) checkBridgeAlive() {
	for _, b := range m.bridges {
		if b.exited() {
			m.logOp("bridge exited by itself: %v", b.err)
			m.t.Errorf("%s: the bridge exited by itself (%v); see the operation log", m.seedLine(), b.err)
			b.start()
		}
	}
}

// restartBridge stops the bridge (SIGKILL or SIGTERM; sharded: one
// replica, the others go on), makes a few changes while it is down, and
// starts it again.
func (m *modelRun) restartBridge(kind string) {
	b := m.bridges[m.rng.IntN(len(m.bridges))]
	if kind == "kill" {
		b.kill()
		m.drops = append(m.drops, time.Now())
		m.logOp("bridge SIGKILLed")
	} else {
		m.terminate(b)
	}
	for range m.rng.IntN(4) {
		m.randomChange(m.cs, len(m.opLog))
	}
	b.start()
	m.logOp("bridge started again (pid %d, config variant %d)", b.cmd.Process.Pid, m.variant)
}

// terminate stops b with SIGTERM, as a pod deletion does.
func (m *modelRun) terminate(b *bridgeProc) {
	t0 := time.Now()
	if exited, err := b.terminate(40 * time.Second); exited {
		m.logOp("bridge SIGTERMed: exit %v after %s", err, time.Since(t0).Round(time.Millisecond))
		if err != nil || m.shards > 0 {
			m.drops = append(m.drops, time.Now())
		}
		if err != nil {
			m.notes = append(m.notes, fmt.Sprintf("SIGTERM at %s: exit %v (webhook down: %v): %s", time.Since(m.start).Round(time.Millisecond), err, !m.hookUpAt.IsZero(), lastErrorLine(b.runLog())))
		}
	} else {
		m.logOp("bridge did not stop within 40s of SIGTERM; killed")
		m.t.Errorf("%s: the bridge did not stop within 40s of SIGTERM", m.seedLine())
	}
}

// logs is every replica's log, one after the other.
func (m *modelRun) logs() string {
	var b strings.Builder
	for _, r := range m.bridges {
		b.WriteString(r.log())
	}
	return b.String()
}

// writeConfig replaces the config file atomically (as a ConfigMap volume
// does): the bridge polls it and must never read half a file.
func (m *modelRun) writeConfig() {
	tmp := m.cfgPath + ".tmp"
	must(m.t, os.WriteFile(tmp, []byte(m.config()), 0o600))
	must(m.t, os.Rename(tmp, m.cfgPath))
	m.writeLinkConfigs()
}

// reload switches the config variant and waits until every bridge applied
// it. Sharded, a replica joins meanwhile while there are fewer than three
// (shards move while the others reload: a shard given back or taken waits
// for the reload, and one taken starts on the new config). A refused
// config (the model's configs are valid) is reported, and the previous
// variant is written back so that file and bridges agree.
func (m *modelRun) reload() {
	m.variant = 1 - m.variant
	refusal := m.applyConfig(m.shards > 0 && len(m.bridges) < 3)
	if refusal == "" {
		return
	}
	m.t.Errorf("%s: a bridge refused a valid config (variant %d): %s", m.seedLine(), m.variant, refusal)
	m.variant = 1 - m.variant
	if again := m.applyConfig(false); again != "" {
		m.t.Fatalf("%s: a bridge refused the running config too: %s", m.seedLine(), again)
	}
}

// applyConfig writes the config of the current variant (then, with join,
// starts one more replica) and waits until every bridge running before
// reloaded it; it returns a refusal logged, if any.
func (m *modelRun) applyConfig(join bool) string {
	type count struct{ reloaded, refused int }
	before := map[*bridgeProc]count{}
	for _, b := range m.bridges {
		log := b.log()
		before[b] = count{strings.Count(log, "config reloaded"), strings.Count(log, "config change refused")}
	}
	waiting := slices.Clone(m.bridges)
	m.writeConfig()
	m.logOp("config rewritten: variant %d", m.variant)
	if join {
		m.addReplica()
	}
	refusal := ""
	applied := poll(30*time.Second, func() bool {
		waiting = slices.DeleteFunc(waiting, func(b *bridgeProc) bool {
			log := b.log()
			if strings.Count(log, "config reloaded") > before[b].reloaded {
				m.logOp("config reloaded (pid %d)", b.cmd.Process.Pid)
				return true
			}
			if strings.Count(log, "config change refused") > before[b].refused {
				refusal = log[strings.LastIndex(log, "config change refused"):]
				if j := strings.IndexByte(refusal, '\n'); j >= 0 {
					refusal = refusal[:j]
				}
				m.logOp("config refused (pid %d): %s", b.cmd.Process.Pid, refusal)
				return true
			}
			return false
		})
		return len(waiting) == 0
	})
	if !applied {
		m.logOp("config not reloaded within 30s by %d bridges", len(waiting))
		m.t.Errorf("%s: %d bridges did not apply the rewritten config within 30s", m.seedLine(), len(waiting))
	}
	return refusal
}

// maybeHookUp brings the webhook back when its outage is over (or now).
func (m *modelRun) maybeHookUp(now bool) {
	if m.hookUpAt.IsZero() {
		return
	}
	if !now && time.Now().Before(m.hookUpAt) {
		return
	}
	if wait := time.Until(m.hookUpAt); wait > 0 {
		time.Sleep(wait)
	}
	m.hook.up(m.t)
	if m.routed != nil {
		m.routed.up(m.t)
	}
	m.hookUpAt = time.Time{}
	m.logOp("webhook up")
}

// hooksDown takes the webhook's receiver down, and the routed webhook's.
func (m *modelRun) hooksDown() {
	m.hook.down()
	if m.routed != nil {
		m.routed.down()
	}
}

func (m *modelRun) stopBridgeAtEnd() {
	for _, b := range m.bridges {
		if !b.exited() {
			switch exited, err := b.terminate(40 * time.Second); {
			case !exited:
				m.t.Errorf("%s: the bridge did not stop within 40s of the final SIGTERM", m.seedLine())
			case err != nil:
				m.t.Errorf("%s: the bridge exited with %v on the final SIGTERM (everything was delivered)", m.seedLine(), err)
			}
		}
		if log := b.log(); strings.Contains(log, "WARNING: DATA RACE") {
			i := strings.Index(log, "WARNING: DATA RACE")
			m.t.Errorf("%s: the race detector fired in the bridge:\n%s", m.seedLine(), log[i:min(len(log), i+6000)])
		}
	}
}

// modelEvent is one received event with what the checker needs.
type modelEvent struct {
	ce
	sink     string
	seq      int // arrival order within the sink
	uid, rv  string
	ns, name string
}

// mayHaveDropped reports whether a partial rule's quiet transition for an
// object may never have reached its sink's worker, as docs/guarantees.md
// allows: the object lived under 2 s (its quiet added and its deletion
// met in the queue and cancelled out, while the full rule's events were
// taken one batch earlier), or a queue was dropped (m.drops) from its
// birth to 15 s after it was seen gone.
func (m *modelRun) mayHaveDropped(life [2]time.Time) bool {
	if life[0].IsZero() || life[1].IsZero() {
		return false
	}
	if life[1].Sub(life[0]) < 2*time.Second {
		return true
	}
	for _, d := range m.drops {
		if !d.Before(life[0].Add(-time.Second)) && !d.After(life[1].Add(15*time.Second)) {
			return true
		}
	}
	return false
}

// pending is the sum of the sinks' queue depths from every replica's
// /metrics, or -1.
func (m *modelRun) pending() int {
	total := 0
	for _, b := range m.bridges {
		p := bridgePending(b)
		if p < 0 {
			return -1
		}
		total += p
		// Sharded, a replica that has not reconciled the shards it holds
		// (starting one, or listing again) has work ahead it cannot count.
		if m.shards > 0 && !bridgeReady(b) {
			total++
		}
	}
	return total
}

// bridgeReady reports whether b's /readyz says ready.
func bridgeReady(b *bridgeProc) bool {
	admin, err := adminURLOf(b.logPath)
	if err != nil {
		return false
	}
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// bridgePending is the sum of one bridge's queue depths, or -1. A replica
// that holds no shard has no deliveries to report.
func bridgePending(b *bridgeProc) int {
	admin, err := adminURLOf(b.logPath)
	if err != nil {
		return -1
	}
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^kubebridge_sink_queue_depth\{sink="[^"]+"\} (\S+)$`)
	total, found := 0, 0
	for _, sm := range re.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.ParseFloat(sm[1], 64)
		total += int(v)
		found++
	}
	if found < len(modelSinks) && !regexp.MustCompile(`(?m)^kubebridge_shards_owned 0$`).Match(body) {
		return -1
	}
	return total
}

// received reads what each sink holds, in arrival order.
func (m *modelRun) received() (map[string][]modelEvent, []string) {
	var bad []string
	out := map[string][]modelEvent{}
	add := func(sink string, e ce) {
		me := modelEvent{ce: e, sink: sink, seq: len(out[sink])}
		if md, ok := e.Data.Object["metadata"].(map[string]any); ok {
			me.uid, _ = md["uid"].(string)
			me.rv, _ = md["resourceVersion"].(string)
			me.ns, _ = md["namespace"].(string)
			me.name, _ = md["name"].(string)
		}
		out[sink] = append(out[sink], me)
	}
	if data, err := os.ReadFile(m.filePath); err == nil {
		for i, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
			if line == "" {
				continue
			}
			var e ce
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				bad = append(bad, fmt.Sprintf("file line %d: %v: %.200q", i+1, err, line))
				continue
			}
			e.raw = []byte(line)
			add("file", e)
		}
	}
	for _, e := range m.hook.received() {
		add("hook", e)
	}
	for _, e := range m.shaped.received() {
		add("shaped", e)
	}
	for _, e := range m.digest.received() {
		add("digest", e)
	}
	if m.routed != nil {
		for _, e := range m.routed.received() {
			add("rt-y", e)
		}
		if data, err := os.ReadFile(m.routedPath); err == nil {
			for i, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
				if line == "" {
					continue
				}
				var e ce
				if err := json.Unmarshal([]byte(line), &e); err != nil {
					bad = append(bad, fmt.Sprintf("rt-x line %d: %v: %.200q", i+1, err, line))
					continue
				}
				e.raw = []byte(line)
				add("rt-x", e)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if st, err := m.js.Stream(ctx, "MODEL"); err == nil {
		if info, err := st.Info(ctx); err == nil {
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
				msg, err := st.GetMsg(ctx, seq)
				if err != nil {
					bad = append(bad, fmt.Sprintf("bus seq %d: %v", seq, err))
					continue
				}
				var e ce
				if err := json.Unmarshal(msg.Data, &e); err != nil {
					bad = append(bad, fmt.Sprintf("bus seq %d: %v", seq, err))
					continue
				}
				e.raw = msg.Data
				add("bus", e)
			}
		}
	}
	return out, bad
}

// counts is how many events each sink holds so far (cheap, for quiescence).
func (m *modelRun) counts() string {
	n := 0
	if data, err := os.ReadFile(m.filePath); err == nil {
		n = strings.Count(string(data), "\n")
	}
	busN := uint64(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := m.js.Stream(ctx, "MODEL"); err == nil {
		if info, err := st.Info(ctx); err == nil {
			busN = info.State.Msgs
		}
	}
	c := fmt.Sprintf("file=%d bus=%d hook=%d shaped=%d digest=%d", n, busN, len(m.hook.received()), len(m.shaped.received()), len(m.digest.received()))
	if m.routed != nil {
		rx := 0
		if data, err := os.ReadFile(m.routedPath); err == nil {
			rx = strings.Count(string(data), "\n")
		}
		c += fmt.Sprintf(" rt-x=%d rt-y=%d", rx, len(m.routed.received()))
	}
	if m.am != nil {
		alerts, err := m.activeAlerts()
		if err != nil {
			return c + " alert=" + err.Error()
		}
		// the set, not only its size: a ghost and a lost alert may cancel out
		c += fmt.Sprintf(" alert=%d/%s", len(alerts), alertSetDigest(alerts))
	}
	return c
}

// activeAlerts is what Alertmanager holds as firing now (not silenced, not
// inhibited: the model's Alertmanager has neither).
func (m *modelRun) activeAlerts() ([]testenv.Alert, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(m.am.URL + "/api/v2/alerts?active=true&silenced=false&inhibited=false")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET alerts: %s: %s", resp.Status, body)
	}
	var out []testenv.Alert
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("GET alerts: %w", err)
	}
	return out, nil
}

// alertSetDigest names the set of firing (alertname, uid) pairs.
func alertSetDigest(alerts []testenv.Alert) string {
	keys := make([]string, 0, len(alerts))
	for _, a := range alerts {
		keys = append(keys, a.Labels["alertname"]+"/"+a.Labels["uid"])
	}
	sort.Strings(keys)
	h := fnv.New32a()
	for _, k := range keys {
		h.Write([]byte(k + "\n"))
	}
	return fmt.Sprintf("%08x", h.Sum32())
}

// checkAlerts compares the alerts firing in Alertmanager with the truth:
// per alert rule (alertname), one alert per uid of the rule's view, with
// that object's labels; none lost, none for an object outside the view.
func (m *modelRun) checkAlerts(alerts []testenv.Alert, tr modelTruth, f *modelFailures) string {
	firing := map[string]map[string][]testenv.Alert{} // rule -> uid ->
	for _, a := range alerts {
		r, uid := a.Labels["alertname"], a.Labels["uid"]
		if firing[r] == nil {
			firing[r] = map[string][]testenv.Alert{}
		}
		firing[r][uid] = append(firing[r][uid], a)
	}
	var per []string
	for _, r := range m.alertRules() {
		view := tr.view(modelFamily(r.family, m.variant))
		got := firing[r.name]
		delete(firing, r.name)
		per = append(per, fmt.Sprintf("%s %d of %d", r.name, len(got), len(view)))
		for uid, rv := range view {
			o := tr.objs[uid]
			as, ok := got[uid]
			if !ok {
				f.add("alert-lost", uid, "alert/%s: %s/%s uid %s rv %s is in the view; no alert fires for it", r.name, o.ns, o.name, uid, rv)
				continue
			}
			if len(as) > 1 {
				f.add("alert-labels", uid, "alert/%s: %d alerts fire for %s/%s uid %s: %v", r.name, len(as), o.ns, o.name, uid, alertLabels(as))
			}
			for _, a := range as {
				if a.Labels["namespace"] != o.ns || a.Labels["name"] != o.name || a.Labels["cluster"] != "model" {
					f.add("alert-labels", uid, "alert/%s: the alert for %s/%s uid %s has labels %v", r.name, o.ns, o.name, uid, a.Labels)
				}
			}
		}
		for uid, as := range got {
			if _, ok := view[uid]; ok {
				continue
			}
			where := "deleted"
			if o, ok := tr.objs[uid]; ok {
				where = fmt.Sprintf("exists as %s/%s rv %s labels %v, namespace labels %v, outside the view", o.ns, o.name, o.rv, o.labels, tr.nsLabels[o.ns])
			}
			for _, a := range as {
				f.add("alert-ghost", uid, "alert/%s: an alert fires for uid %s (%s/%s, startsAt %s, endsAt %s); the object is %s", r.name, uid,
					a.Labels["namespace"], a.Labels["name"], a.StartsAt.Format(time.RFC3339Nano), a.EndsAt.Format(time.RFC3339Nano), where)
			}
		}
	}
	for r, byUID := range firing { // alertnames of no rule that sends to the alert sink
		for uid, as := range byUID {
			f.add("alert-ghost", uid, "alert/%s: an alert fires for uid %s under alertname %q, not a rule of the alert sink: %v", r, uid, r, alertLabels(as))
		}
	}
	return fmt.Sprintf("alert: %d firing (%s)", len(alerts), strings.Join(per, ", "))
}

func alertLabels(as []testenv.Alert) []map[string]string {
	out := make([]map[string]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.Labels)
	}
	return out
}

// quiesce waits until the sinks stop receiving for 3s with nothing pending.
func (m *modelRun) quiesce(limit time.Duration) bool {
	last, since := "", time.Now()
	quiet := testenv.Poll(limit, 300*time.Millisecond, func() bool {
		c := m.counts()
		p := m.pending()
		if p < 0 && !m.noMetrics { // no queue depth in /metrics: go by the sinks alone
			m.noMetrics = true
			m.notes = append(m.notes, "kubebridge_sink_queue_depth not readable from /metrics; quiescence judged by the sinks alone")
		}
		if c != last || p > 0 {
			last, since = c, time.Now()
			return false
		}
		return time.Since(since) >= 3*time.Second
	})
	if quiet {
		m.logOp("quiescent: %s", last)
	} else {
		m.logOp("not quiescent after %s: %s, pending %d", limit, last, m.pending())
	}
	return quiet
}

// modelTruth is the apiserver's state at the end.
type modelTruth struct {
	objs     map[string]modelObj // uid ->
	nsLabels map[string]map[string]string
}

func (m *modelRun) truth() modelTruth {
	ctx := context.Background()
	tr := modelTruth{objs: map[string]modelObj{}, nsLabels: map[string]map[string]string{}}
	nss, err := m.cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	must(m.t, err)
	for _, ns := range nss.Items {
		tr.nsLabels[ns.Name] = ns.Labels
	}
	cms, err := m.cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	must(m.t, err)
	for _, cm := range cms.Items {
		tr.objs[string(cm.UID)] = modelObj{ns: cm.Namespace, name: cm.Name, uid: string(cm.UID), rv: cm.ResourceVersion, labels: cm.Labels}
	}
	if m.rulesOn("g") {
		gs, err := m.dyn.Resource(gadgetGVR).Namespace("").List(ctx, metav1.ListOptions{})
		if err == nil { // not served (between a deletion and an install): none
			for _, g := range gs.Items {
				tr.objs[string(g.GetUID())] = modelObj{resource: "gadgets", ns: g.GetNamespace(), name: g.GetName(), uid: string(g.GetUID()), rv: g.GetResourceVersion(), labels: g.GetLabels()}
			}
		}
	}
	return tr
}

// view is a rule's view in the truth: uid -> resourceVersion.
func (tr modelTruth) view(sel modelSelectors) map[string]string {
	v := map[string]string{}
	for uid, o := range tr.objs {
		if sel.matches(o, tr.nsLabels) {
			v[uid] = o.rv
		}
	}
	return v
}

// modelFailures collects failed checks: check name -> messages, and the
// uids whose event sequences explain them.
type modelFailures struct {
	byCheck map[string][]string
	uids    map[string]bool
}

func (f *modelFailures) add(check, uid, format string, args ...any) {
	f.byCheck[check] = append(f.byCheck[check], fmt.Sprintf(format, args...))
	if uid != "" {
		f.uids[uid] = true
	}
}

func (f *modelFailures) empty() bool { return len(f.byCheck) == 0 }

// changeOf renders an event for sequences: added@rv12 (checkpoint) id=...
func (e modelEvent) String() string {
	s := e.change() + "@" + e.rv
	if e.Reason != "" {
		s += ":" + e.Reason
	}
	if e.Replay != "" {
		s += " [" + e.Replay + "]"
	}
	return s + " id=" + e.ID
}

func replayTag(r string) string {
	if r == "" {
		return ""
	}
	return ", kbreplay " + r
}

// check compares what the sinks received with the truth.
func (m *modelRun) check(recv map[string][]modelEvent, bad []string, tr modelTruth) (*modelFailures, []string) {
	f := &modelFailures{byCheck: map[string][]string{}, uids: map[string]bool{}}
	var stats []string
	for _, b := range bad {
		f.add("unreadable-event", "", "%s", b)
	}
	for _, sink := range m.sinks() {
		rules := m.rulesTo(sink)
		ruleByName := map[string]modelRule{}
		for _, r := range rules {
			ruleByName[r.name] = r
		}
		evs := recv[sink]
		byRule := map[string][]modelEvent{}
		replays := 0
		for _, e := range evs {
			if _, ok := ruleByName[e.Rule]; !ok {
				f.add("unknown-rule", e.uid, "%s: event of rule %q (not a rule of this sink): %s", sink, e.Rule, e.raw)
				continue
			}
			if e.uid == "" || (e.rv == "" && e.change() != "deleted") { // a deletion may not know the last state
				f.add("no-object-metadata", "", "%s: event without data.object.metadata uid/resourceVersion: %s", sink, e.raw)
				continue
			}
			if e.Replay != "" {
				replays++
			}
			byRule[e.Rule] = append(byRule[e.Rule], e)
		}
		sigs := map[*modelEvent]string{} // transition signature of each event
		entries := map[*modelEvent]int{} // for full rules: which entry of the uid into the view
		seenByFull := map[string]map[string]bool{}
		// lifeByFull: per family, per uid, the first and last event time
		// its full rule's consumer got (when the object was seen alive,
		// and when gone).
		lifeByFull := map[string]map[string][2]time.Time{}
		for _, r := range rules {
			es := byRule[r.name]
			view := m.sinkView(tr, r, sink)
			for i := range es {
				e := &es[i]
				if o, exists := tr.objs[e.uid]; exists && e.change() == "deleted" && e.Reason != "unmatched" {
					// the object was never deleted: it left the view (docs/guarantees.md)
					f.add("deleted-without-unmatched", e.uid, "%s/%s: %s for %s/%s uid %s, which still exists", sink, r.name, e, o.ns, o.name, e.uid)
				}
				if !slices.Contains(r.events, e.change()) {
					f.add("undeclared-type", e.uid, "%s/%s (events %v) delivered %s for %s/%s uid %s", sink, r.name, r.events, e, e.ns, e.name, e.uid)
				}
			}
			if r.full() {
				held := map[string]string{}
				entry := map[string]int{}
				seen := map[string]bool{}
				for i := range es {
					e := &es[i]
					// Seen means held: a consumer told only a conservative
					// deletion (after a crash, of an incarnation that may
					// have been sent) never held the object; see "Not
					// promised" in docs/guarantees.md.
					if c := e.change(); c == "added" || c == "updated" {
						seen[e.uid] = true
					}
					switch e.change() {
					case "added", "updated":
						if _, ok := held[e.uid]; !ok {
							entry[e.uid]++
							if e.change() == "updated" {
								stats = append(stats, fmt.Sprintf("note: %s/%s: updated for uid %s that the consumer does not hold (%s/%s)", sink, r.name, e.uid, e.ns, e.name))
							}
						}
						held[e.uid] = e.rv
					case "deleted":
						delete(held, e.uid)
					}
					sigs[e] = fmt.Sprintf("rule=%s type=%s uid=%s rv=%s reason=%q entry=%d", r.name, e.change(), e.uid, e.rv, e.Reason, entry[e.uid])
					entries[e] = entry[e.uid]
				}
				seenByFull[r.family] = seen
				life := map[string][2]time.Time{}
				for i := range es {
					at, err := time.Parse(time.RFC3339Nano, es[i].Time)
					if err != nil {
						continue
					}
					l, ok := life[es[i].uid]
					if !ok || at.Before(l[0]) {
						l[0] = at
					}
					if es[i].change() == "deleted" && (l[1].IsZero() || at.Before(l[1])) {
						l[1] = at // its first deletion: when it was seen gone
					}
					life[es[i].uid] = l
				}
				lifeByFull[r.family] = life
				for uid, rv := range view {
					o := tr.objs[uid]
					got, ok := held[uid]
					switch {
					case !ok:
						f.add("view-missing", uid, "%s/%s: %s/%s uid %s rv %s is in the view, the consumer does not hold it", sink, r.name, o.ns, o.name, uid, rv)
					case got != rv:
						f.add("view-stale", uid, "%s/%s: %s/%s uid %s is at rv %s, the consumer holds rv %s", sink, r.name, o.ns, o.name, uid, rv, got)
					}
				}
				for uid, rv := range held {
					if _, ok := view[uid]; ok {
						continue
					}
					where := "deleted"
					if o, ok := tr.objs[uid]; ok {
						where = fmt.Sprintf("exists as %s/%s rv %s labels %v, namespace labels %v, outside the view", o.ns, o.name, o.rv, o.labels, tr.nsLabels[o.ns])
					}
					f.add("view-extra", uid, "%s/%s: the consumer holds uid %s at rv %s; the object is %s", sink, r.name, uid, rv, where)
				}
			} else {
				for i := range es {
					e := &es[i]
					sigs[e] = fmt.Sprintf("rule=%s type=%s uid=%s rv=%s reason=%q", r.name, e.change(), e.uid, e.rv, e.Reason)
				}
			}
		}
		// Partial rules: every uid that left the view ends with a deletion.
		for _, r := range rules {
			if r.full() {
				continue
			}
			view := m.sinkView(tr, r, sink)
			last := map[string]modelEvent{}
			for _, e := range byRule[r.name] {
				last[e.uid] = e
			}
			uids := map[string]bool{}
			for uid := range seenByFull[r.family] {
				uids[uid] = true
			}
			for uid := range last {
				uids[uid] = true
			}
			full := ""
			for _, fr := range rules {
				if fr.family == r.family && fr.full() {
					full = fr.name
				}
			}
			for uid := range uids {
				if _, in := view[uid]; in {
					continue
				}
				l, ok := last[uid]
				switch {
				case !ok && full != "" && m.mayHaveDropped(lifeByFull[r.family][uid]):
					// The documented limits (docs/guarantees.md: a fresh
					// added cancelled with its deletion in the queue; "A
					// deletions-only rule ... its queue lost"): the rule's
					// quiet transition never reached the worker.
					stats = append(stats, fmt.Sprintf("note: %s/%s: uid %s held by %s's consumer, never learned by %s: it lived under 2 s, or a queue was dropped during its life (not promised)", sink, r.name, uid, full, r.name))
				case !ok && full != "":
					f.add("deleted-missing", uid, "%s/%s: uid %s was held by %s's consumer and left the view; %s delivered nothing for it", sink, r.name, uid, full, r.name)
				case ok && l.change() != "deleted":
					f.add("deleted-missing", uid, "%s/%s: uid %s left the view; its last event is %s", sink, r.name, uid, l)
				}
			}
		}
		// Ids: one id, one transition.
		first := map[string]*modelEvent{}
		dups := 0
		var ordered []*modelEvent
		for r := range byRule {
			for i := range byRule[r] {
				ordered = append(ordered, &byRule[r][i])
			}
		}
		sort.Slice(ordered, func(i, j int) bool { return ordered[i].seq < ordered[j].seq })
		for _, e := range ordered {
			p, ok := first[e.ID]
			if !ok {
				first[e.ID] = e
				continue
			}
			if sigs[p] == sigs[e] {
				dups++
				continue
			}
			f.uids[p.uid] = true
			check := "id-reuse"
			switch {
			case p.Rule != e.Rule:
				check = "id-reuse-across-rules" // distinct for two rules (docs/guarantees.md)
			case p.uid != e.uid || p.change() != e.change():
				check = "id-reuse-other"
			case entries[p] != entries[e]:
				check = "id-reuse-reentry" // distinct for a re-entry with the object unchanged (docs/guarantees.md)
			case p.rv != e.rv || p.Reason != e.Reason:
				check = "id-reuse-attributes" // a replay of a transition that does not carry its attributes
			}
			f.add(check, e.uid, "%s: id %s names two transitions: {%s} (%s/%s, #%d%s) and {%s} (%s/%s, #%d%s)", sink, e.ID,
				sigs[p], p.ns, p.name, p.seq, replayTag(p.Replay), sigs[e], e.ns, e.name, e.seq, replayTag(e.Replay))
		}
		stats = append(stats, fmt.Sprintf("%s: %d events (%d replays), %d duplicates", sink, len(evs), replays, dups))
	}
	return f, stats
}

// verify waits for quiescence and runs the checker (again, for up to 10s
// more, while view checks fail: a slow retry is not a loss).
func (m *modelRun) verify() {
	t := m.t
	m.quiesce(90 * time.Second)
	var f *modelFailures
	var stats []string
	var recv map[string][]modelEvent
	var tr modelTruth
	var alerts []testenv.Alert
	deadline := time.Now().Add(10 * time.Second)
	if !m.apiBackAt.IsZero() {
		// client-go's reflectors retry a refused watch with backoff that
		// doubles from 0.8 s to [30, 60) s and resets only after 2 min
		// without failure: after outages in a row, the informers may see
		// the apiserver again up to a minute after it is back (it cannot
		// be configured through a shared informer). Late, not lost.
		if late := m.apiBackAt.Add(65 * time.Second); late.After(deadline) {
			deadline = late
		}
	}
	for {
		var bad []string
		recv, bad = m.received()
		tr = m.truth()
		f, stats = m.check(recv, bad, tr)
		stats = append(stats, m.checkMirror(tr, f), m.checkKafkaState(tr, f))
		if m.am != nil {
			var err error
			if alerts, err = m.activeAlerts(); err != nil {
				f.add("alert-unreadable", "", "alert: %v", err)
			} else {
				stats = append(stats, m.checkAlerts(alerts, tr, f))
			}
		}
		healable := false
		for c := range f.byCheck { // (id checks never heal)
			if strings.HasPrefix(c, "view-") || c == "deleted-missing" || strings.HasPrefix(c, "alert-") {
				healable = true
			}
		}
		if !healable || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
		m.quiesce(20 * time.Second)
	}
	if m.shards > 0 {
		// What the replicas alive at the end did with their shards: an
		// apiserver outage shows as lapses, resumed when nobody took over.
		kinds := map[string]int{}
		for _, b := range m.bridges {
			for _, k := range []string{"acquired", "released", "lost", "lapsed", "resumed"} {
				v, _ := viewMetric(b.adminURL(), `kubebridge_shard_handovers_total{kind="`+k+`"}`)
				kinds[k] += int(v)
			}
		}
		stats = append(stats, fmt.Sprintf("shards (replicas alive at the end): %v", kinds))
	}
	t.Logf("%s: scheduled %v (%d log lines), config variant %d at the end, %d objects in the apiserver", m.seedLine(), m.kinds, len(m.opLog), m.variant, len(tr.objs))
	for _, s := range stats {
		t.Logf("  %s", s)
	}
	for _, n := range m.notes {
		t.Logf("  note: %s", n)
	}
	if f.empty() {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the sinks disagree with the model\n", m.seedLine())
	checks := make([]string, 0, len(f.byCheck))
	for c := range f.byCheck {
		checks = append(checks, c)
	}
	sort.Strings(checks)
	for _, c := range checks {
		msgs := f.byCheck[c]
		bySink := map[string]int{}
		for _, msg := range msgs {
			bySink[strings.SplitN(strings.SplitN(msg, ":", 2)[0], "/", 2)[0]]++
		}
		var per []string
		for _, sink := range append(m.sinks(), "alert") {
			if bySink[sink] > 0 {
				per = append(per, fmt.Sprintf("%s %d", sink, bySink[sink]))
			}
		}
		fmt.Fprintf(&b, "check %s failed %d times (%s):\n", c, len(msgs), strings.Join(per, ", "))
		sort.Strings(msgs)
		for _, msg := range msgs[:min(len(msgs), 25)] {
			fmt.Fprintf(&b, "  %s\n", msg)
		}
		if len(msgs) > 25 {
			fmt.Fprintf(&b, "  ... %d more\n", len(msgs)-25)
		}
	}
	uids := make([]string, 0, len(f.uids))
	for u := range f.uids {
		uids = append(uids, u)
	}
	sort.Strings(uids)
	fmt.Fprintf(&b, "event sequences of %d failing uids (first 20):\n", len(uids))
	for _, uid := range uids[:min(len(uids), 20)] {
		if o, ok := tr.objs[uid]; ok {
			fmt.Fprintf(&b, "uid %s: now %s/%s rv %s labels %v, namespace labels %v\n", uid, o.ns, o.name, o.rv, o.labels, tr.nsLabels[o.ns])
		} else {
			fmt.Fprintf(&b, "uid %s: deleted\n", uid)
		}
		for _, op := range m.opLog {
			if strings.Contains(op, uid) {
				fmt.Fprintf(&b, "    op %s\n", op)
			}
		}
		for _, sink := range m.sinks() {
			byRule := map[string][]string{}
			for _, e := range recv[sink] {
				if e.uid == uid {
					byRule[e.Rule] = append(byRule[e.Rule], e.String())
				}
			}
			for _, r := range m.rules() {
				if s := byRule[r.name]; len(s) > 0 {
					fmt.Fprintf(&b, "    %s/%s: %s\n", sink, r.name, strings.Join(s, ", "))
				}
			}
		}
		for _, a := range alerts {
			if a.Labels["uid"] == uid {
				fmt.Fprintf(&b, "    alert/%s: firing, startsAt %s, endsAt %s\n", a.Labels["alertname"],
					a.StartsAt.Format(time.RFC3339Nano), a.EndsAt.Format(time.RFC3339Nano))
			}
		}
	}
	if keep := os.Getenv("KUBEBRIDGE_MODEL_KEEP"); keep != "" {
		dir := filepath.Join(keep, strconv.FormatInt(m.seed, 10))
		if err := os.MkdirAll(dir, 0o755); err == nil {
			copyTo := func(name string, data []byte) { _ = os.WriteFile(filepath.Join(dir, name), data, 0o644) }
			copyTo("bridge.log", []byte(m.logs()))
			for _, sink := range m.sinks() {
				var lines []string
				for _, e := range recv[sink] {
					lines = append(lines, string(e.raw))
				}
				copyTo(sink+".jsonl", []byte(strings.Join(lines, "\n")+"\n"))
			}
			copyTo("oplog.txt", []byte(strings.Join(m.opLog, "\n")+"\n"))
			if data, err := json.MarshalIndent(alerts, "", "  "); err == nil && m.am != nil {
				copyTo("alerts.json", data)
			}
			copyTo("config.yaml", []byte(m.config()))
			fmt.Fprintf(&b, "bridge log, sink contents and operation log kept in %s\n", dir)
		}
	}
	t.Error(b.String())
}

// lastErrorLine is the last line of log at level ERROR, or "".
func lastErrorLine(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "level=ERROR") {
			return lines[i]
		}
	}
	return ""
}

// checkMirror compares each full rule's mirror bucket with the rule's view
// in the truth, as a consumer reading the bucket would: one key per object
// in the view, holding its current state, and no other key.
func (m *modelRun) checkMirror(tr modelTruth, f *modelFailures) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := natsgo.Connect(m.nats.ClientURL())
	if err != nil {
		f.add("view-mirror-unreadable", "", "mirror: %v", err)
		return "mirror: unreadable"
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(m.t, err)
	keys := 0
	for _, r := range m.rules() {
		if !r.full() || r.routed() {
			continue
		}
		want := tr.view(modelFamily(r.family, m.variant))
		got := map[string][2]string{} // key -> uid, resourceVersion
		kv, err := js.KeyValue(ctx, "model-"+r.name)
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound) && len(want) == 0:
			continue
		case err != nil:
			f.add("view-mirror-unreadable", "", "mirror/%s: %v", r.name, err)
			continue
		}
		w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
		if err != nil {
			f.add("view-mirror-unreadable", "", "mirror/%s: %v", r.name, err)
			continue
		}
		for e := range w.Updates() {
			if e == nil {
				break
			}
			if strings.HasPrefix(e.Key(), mirror.ReservedPrefix) {
				continue
			}
			var v struct {
				Data struct {
					Object struct {
						Metadata struct{ UID, ResourceVersion string }
					}
				}
			}
			if err := json.Unmarshal(e.Value(), &v); err != nil {
				f.add("view-mirror-unreadable", "", "mirror/%s: key %s: %v", r.name, e.Key(), err)
				continue
			}
			got[e.Key()] = [2]string{v.Data.Object.Metadata.UID, v.Data.Object.Metadata.ResourceVersion}
		}
		_ = w.Stop()
		keys += len(got)
		for uid, rv := range want {
			o := tr.objs[uid]
			key := mirror.Key(o.ns, o.name)
			g, ok := got[key]
			switch {
			case !ok:
				f.add("view-mirror-missing", uid, "mirror/%s: %s/%s (uid %s) is in the view, not in the bucket", r.name, o.ns, o.name, uid)
			case g[0] != uid:
				f.add("view-mirror-wrong-uid", uid, "mirror/%s: key %s holds uid %s, the view's object is %s", r.name, key, g[0], uid)
			case g[1] != rv:
				f.add("view-mirror-stale", uid, "mirror/%s: key %s holds resourceVersion %s, the object is at %s", r.name, key, g[1], rv)
			}
		}
		for key, g := range got {
			if _, ok := want[g[0]]; !ok {
				f.add("view-mirror-extra", g[0], "mirror/%s: key %s (uid %s) is not in the view", r.name, key, g[0])
			}
		}
	}
	return fmt.Sprintf("mirror: %d keys in the buckets", keys)
}

// The mirror checker fails on a bucket that differs from the view: an
// object missing, one at a stale resourceVersion, one under another uid,
// and a key the view lacks; it passes on the bucket that holds the view.
func TestModelMirrorCheckCanFail(t *testing.T) {
	n := testenv.StartNATS(t)
	m := &modelRun{t: t, nats: n, only: map[string]bool{"c-all": true}}
	tr := modelTruth{objs: map[string]modelObj{}, nsLabels: map[string]map[string]string{}}
	for i, name := range []string{"o1", "o2", "o3", "o4"} {
		uid := "u" + strconv.Itoa(i+1)
		tr.objs[uid] = modelObj{ns: "mdl-a", name: name, uid: uid, rv: "10"}
	}
	nc, err := natsgo.Connect(n.ClientURL())
	must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "model-c-all"})
	must(t, err)
	put := func(name, uid, rv string) {
		_, err := kv.Put(ctx, mirror.Key("mdl-a", name), []byte(fmt.Sprintf(`{"data":{"object":{"metadata":{"uid":%q,"resourceVersion":%q}}}}`, uid, rv)))
		must(t, err)
	}
	put("o1", "u1", "10")
	put("o2", "u2", "9")       // stale
	put("o3", "u-old", "10")   // another incarnation
	put("gone", "u-gone", "3") // not in the view; o4 is missing
	f := &modelFailures{byCheck: map[string][]string{}, uids: map[string]bool{}}
	m.checkMirror(tr, f)
	for _, c := range []string{"view-mirror-stale", "view-mirror-wrong-uid", "view-mirror-missing", "view-mirror-extra"} {
		if len(f.byCheck[c]) == 0 {
			t.Errorf("check %s did not fail (failures: %v)", c, f.byCheck)
		}
	}
	put("o2", "u2", "10")
	put("o3", "u3", "10")
	put("o4", "u4", "10")
	must(t, kv.Delete(ctx, mirror.Key("mdl-a", "gone")))
	f = &modelFailures{byCheck: map[string][]string{}, uids: map[string]bool{}}
	m.checkMirror(tr, f)
	if !f.empty() {
		t.Errorf("the bucket holds the view, yet: %v", f.byCheck)
	}
}

// checkKafkaState compares each full rule's Kafka state topic with the
// rule's view in the truth, as a consumer reading it from its start does:
// the last record per uid, tombstones removing it, is exactly the view at
// its current resourceVersions.
func (m *modelRun) checkKafkaState(tr modelTruth, f *modelFailures) string {
	records := 0
	for _, r := range m.rules() {
		if !r.full() || r.routed() {
			continue
		}
		want := tr.view(modelFamily(r.family, m.variant))
		recs := readKafkaTopic(m.t, m.kafka.Brokers(), "model-state."+r.name)
		records += len(recs)
		got := map[string]string{} // uid -> resourceVersion
		for _, rec := range recs {
			uid := string(rec.Key)
			if rec.Value == nil {
				delete(got, uid)
				continue
			}
			var e struct {
				Data struct {
					Object struct {
						Metadata struct{ UID, ResourceVersion string }
					}
				}
			}
			if err := json.Unmarshal(rec.Value, &e); err != nil || e.Data.Object.Metadata.UID != uid {
				f.add("view-kafka-unreadable", uid, "kafka/%s: record at offset %d of partition %d: %v (uid %q)", r.name, rec.Offset, rec.Partition, err, e.Data.Object.Metadata.UID)
				continue
			}
			got[uid] = e.Data.Object.Metadata.ResourceVersion
		}
		for uid, rv := range want {
			o := tr.objs[uid]
			switch g, ok := got[uid]; {
			case !ok:
				f.add("view-kafka-missing", uid, "kafka/%s: %s/%s (uid %s) is in the view, not in the state topic", r.name, o.ns, o.name, uid)
			case g != rv:
				f.add("view-kafka-stale", uid, "kafka/%s: uid %s held at resourceVersion %s, the object is at %s", r.name, uid, g, rv)
			}
		}
		for uid := range got {
			if _, ok := want[uid]; !ok {
				f.add("view-kafka-extra", uid, "kafka/%s: uid %s is in the state topic, not in the view", r.name, uid)
			}
		}
	}
	return fmt.Sprintf("kafka: %d state records", records)
}

// The Kafka state checker fails on a state topic that is not the view: an
// object missing, one stale, one the view lacks; it passes once the topic
// holds the view.
func TestModelKafkaCheckCanFail(t *testing.T) {
	k := testenv.StartKafka(t)
	m := &modelRun{t: t, kafka: k, only: map[string]bool{"c-all": true}}
	tr := modelTruth{objs: map[string]modelObj{}, nsLabels: map[string]map[string]string{}}
	for i, name := range []string{"o1", "o2", "o3"} {
		uid := "u" + strconv.Itoa(i+1)
		tr.objs[uid] = modelObj{ns: "mdl-a", name: name, uid: uid, rv: "10"}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	must(t, err)
	defer cl.Close()
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, nil, "model-state.c-all")
	must(t, err)
	rec := func(uid, rv string) *kgo.Record {
		if rv == "" {
			return &kgo.Record{Key: []byte(uid)} // a tombstone
		}
		return &kgo.Record{Key: []byte(uid), Value: []byte(fmt.Sprintf(`{"data":{"object":{"metadata":{"uid":%q,"resourceVersion":%q}}}}`, uid, rv))}
	}
	produceRaw(t, k.Brokers(), "model-state.c-all", rec("u1", "10"), rec("u2", "9"), rec("u-gone", "3"))
	f := &modelFailures{byCheck: map[string][]string{}, uids: map[string]bool{}}
	m.checkKafkaState(tr, f)
	for _, c := range []string{"view-kafka-stale", "view-kafka-missing", "view-kafka-extra"} {
		if len(f.byCheck[c]) == 0 {
			t.Errorf("check %s did not fail (failures: %v)", c, f.byCheck)
		}
	}
	produceRaw(t, k.Brokers(), "model-state.c-all", rec("u2", "10"), rec("u3", "10"), rec("u-gone", ""))
	f = &modelFailures{byCheck: map[string][]string{}, uids: map[string]bool{}}
	m.checkKafkaState(tr, f)
	if !f.empty() {
		t.Errorf("the state topic holds the view, yet: %v", f.byCheck)
	}
}

// The checker holds each routed sink to its own view: an object that ends
// on the other routed sink is extra there and missing here; once each
// holds the objects routed to it, nothing fails.
func TestModelRoutedCheckCanFail(t *testing.T) {
	m := &modelRun{t: t, only: map[string]bool{"r-all": true}, routed: &hookReceiver{}}
	tr := modelTruth{objs: map[string]modelObj{
		"u1": {ns: "mdl-a", name: "o1", uid: "u1", rv: "10"},
		"u2": {ns: "mdl-b", name: "o2", uid: "u2", rv: "11"},
		"u3": {ns: "mdl-c", name: "o3", uid: "u3", rv: "12"}, // team z: the default
	}, nsLabels: map[string]map[string]string{"mdl-a": {"kbteam": "x"}, "mdl-b": {"kbteam": "y"}, "mdl-c": {"kbteam": "z"}}}
	added := func(sink string, seq int, o modelObj) modelEvent {
		return modelEvent{ce: ce{ID: o.uid + "-" + sink, Type: "io.kubebridge.object.added", Rule: "r-all"}, sink: sink, seq: seq, uid: o.uid, rv: o.rv, ns: o.ns, name: o.name}
	}
	recv := map[string][]modelEvent{
		"rt-x": {added("rt-x", 0, tr.objs["u1"]), added("rt-x", 1, tr.objs["u2"])}, // u2 is y's; u3 missing
		"rt-y": nil,
	}
	f, _ := m.check(recv, nil, tr)
	if n := len(f.byCheck["view-extra"]); n != 1 {
		t.Errorf("view-extra failed %d times, want 1 (u2 on rt-x): %v", n, f.byCheck)
	}
	if n := len(f.byCheck["view-missing"]); n != 2 {
		t.Errorf("view-missing failed %d times, want 2 (u2 on rt-y, u3 on rt-x): %v", n, f.byCheck)
	}
	recv = map[string][]modelEvent{
		"rt-x": {added("rt-x", 0, tr.objs["u1"]), added("rt-x", 1, tr.objs["u3"])},
		"rt-y": {added("rt-y", 0, tr.objs["u2"])},
	}
	if f, _ := m.check(recv, nil, tr); !f.empty() {
		t.Errorf("each routed sink holds its view, yet: %v", f.byCheck)
	}
}

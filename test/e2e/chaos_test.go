package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// outage is how long the webhook stays down: 10 s in make test, 60 s under
// make chaos. 10 s is the retry's longest interval (2 s, reached after
// about 3 s) several times over, and some 2,000 changes (ten times the
// queue's capacity) come meanwhile: a longer outage tests nothing more.
func outage() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KUBEBRIDGE_TEST_OUTAGE")); err == nil {
		return d
	}
	return 10 * time.Second
}

// hookReceiver is a webhook endpoint on a fixed port that can go away.
type hookReceiver struct {
	mu   sync.Mutex
	evs  []ce
	addr string
	srv  *http.Server
	done chan struct{}
	// refuse, when set, is the status for an event (200 takes it); a
	// batch gets the most permanent of its events' statuses (a 4xx before
	// a 5xx), as a receiver that validates the whole body would.
	refuse func(e ce) int
	// token, when set, is the bearer token it takes; others get 401.
	token string
}

// setToken sets the token the receiver takes (a rotation on its side).
func (h *hookReceiver) setToken(tok string) {
	h.mu.Lock()
	h.token = tok
	h.mu.Unlock()
}

// setRefuse sets (nil: clears) the receiver's refusals.
func (h *hookReceiver) setRefuse(f func(e ce) int) {
	h.mu.Lock()
	h.refuse = f
	h.mu.Unlock()
}

func (h *hookReceiver) up(t *testing.T) {
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", h.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	must(t, err)
	h.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		want := h.token
		h.mu.Unlock()
		if want != "" && r.Header.Get("Authorization") != "Bearer "+want {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		var batch []json.RawMessage
		if err := json.Unmarshal(body, &batch); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		var evs []ce
		code := http.StatusOK
		for _, raw := range batch {
			var e ce
			if json.Unmarshal(raw, &e) == nil {
				e.raw = raw
				evs = append(evs, e)
				if h.refuse != nil {
					if c := h.refuse(e); c != http.StatusOK && (code == http.StatusOK || c < code) {
						code = c
					}
				}
			}
		}
		if code == http.StatusOK {
			h.evs = append(h.evs, evs...)
		}
		w.WriteHeader(code)
	})}
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		_ = h.srv.Serve(l)
	}()
}

func (h *hookReceiver) down() {
	_ = h.srv.Close()
	<-h.done
}

func (h *hookReceiver) received() []ce {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]ce(nil), h.evs...)
}

// The webhook sink is down for 10 s (60 s under make chaos) while changes
// keep coming; when it returns it gets every object's final state.
func TestWebhookOutageUnderLoad(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"hook-a", "hook-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	h := &hookReceiver{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort()))}
	h.up(t)
	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook: {url: "http://`+h.addr+`/", batch: {maxEvents: 100, maxWait: 20ms}}
    queue: {capacity: 200}
    retry: {initialInterval: 100ms, maxInterval: 2s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [`+strings.Join(namespaces, ", ")+`]
    sinks: [hook]
`)
	l := startLoad(t, cp, namespaces, false)
	time.Sleep(time.Second)
	h.down()
	time.Sleep(outage())
	h.up(t)
	time.Sleep(time.Second)
	l.stop()
	defer h.down()
	verifyAgainstTruth(t, cp, namespaces, l, "webhook down "+outage().String(), h.received)
}

// The NATS server restarts under load; the JetStream stream ends up with
// every object's final state.
func TestNATSRestartUnderLoad(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	namespaces := []string{"nats-a", "nats-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	srv := testenv.StartNATS(t)
	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: bus
    nats: {url: "`+srv.ClientURL()+`", jetstream: true, stream: {name: K8S, duplicateWindow: 10m}}
    retry: {initialInterval: 100ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [`+strings.Join(namespaces, ", ")+`]
    sinks: [bus]
`)
	l := startLoad(t, cp, namespaces, false)
	time.Sleep(time.Second)
	srv.Restart(t)
	time.Sleep(2 * time.Second)
	l.stop()
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	verifyAgainstTruth(t, cp, namespaces, l, "NATS restarted", func() []ce {
		var evs []ce
		st, err := js.Stream(t.Context(), "K8S")
		if err != nil {
			return nil
		}
		info, err := st.Info(t.Context())
		if err != nil {
			return nil
		}
		for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(t.Context(), seq)
			if err != nil {
				continue
			}
			var e ce
			if json.Unmarshal(m.Data, &e) == nil {
				e.raw = m.Data
				evs = append(evs, e)
			}
		}
		return evs
	})
}

// The apiserver the bridge watches goes down under load; while it is down,
// objects are changed and deleted through a second apiserver on the same
// etcd. After it returns (watches re-established or relisted), the sink
// holds every object's final state and every deletion.
func TestAPIServerRestartUnderLoad(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlane(t)
	testenv.InstallWidgetCRD(t, cp)
	namespaces := []string{"api-a", "api-b"}
	for _, ns := range namespaces {
		testenv.EnsureNamespace(t, cp, ns)
	}
	out := filepath.Join(t.TempDir(), "events.jsonl")
	startBridge(t, cp, fileConfig(out, rule("cms", "v1/configmaps", namespaces...), rule("widgets", "example.kubebridge.io/v1/widgets", namespaces...)))
	l := startLoad(t, cp, namespaces, true)
	time.Sleep(1500 * time.Millisecond)
	l.stop() // the generator talks to the apiserver that goes down
	deleted := 0
	cp.WhileAPIServerDown(t, func(alt *rest.Config) {
		cs := kubernetes.NewForConfigOrDie(alt)
		for _, ns := range namespaces {
			list, err := cs.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
			must(t, err)
			for i, cm := range list.Items {
				if !strings.HasPrefix(cm.Name, "obj-") {
					continue
				}
				if i%2 == 0 {
					must(t, cs.CoreV1().ConfigMaps(ns).Delete(context.Background(), cm.Name, metav1.DeleteOptions{}))
					deleted++
				} else {
					_, err := cs.CoreV1().ConfigMaps(ns).Patch(context.Background(), cm.Name, types.MergePatchType, []byte(`{"data":{"gap":"yes"}}`), metav1.PatchOptions{})
					must(t, err)
				}
			}
		}
	})
	l.mu.Lock()
	l.ops += deleted
	l.mu.Unlock()
	l.start() // and more changes after it is back
	time.Sleep(time.Second)
	l.stop()
	verifyAgainstTruth(t, cp, namespaces, l, fmt.Sprintf("apiserver down, %d deletions during the gap", deleted), func() []ce { return readEvents(t, out) })
}

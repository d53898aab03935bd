package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// outage is how long the webhook stays down: 30 s in make test, 60 s under make chaos.
func outage() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KUBEBRIDGE_TEST_OUTAGE")); err == nil {
		return d
	}
	return 30 * time.Second
}

// hookReceiver is a webhook endpoint on a fixed port that can go away.
type hookReceiver struct {
	mu   sync.Mutex
	evs  []ce
	addr string
	srv  *http.Server
	done chan struct{}
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
		var batch []json.RawMessage
		if err := json.Unmarshal(body, &batch); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, raw := range batch {
			var e ce
			if json.Unmarshal(raw, &e) == nil {
				e.raw = raw
				h.evs = append(h.evs, e)
			}
		}
		w.WriteHeader(http.StatusOK)
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

// The webhook sink is down for 30 s (60 s under make chaos) while changes
// keep coming; when it returns it gets every object's final state.
func TestWebhookOutageUnderLoad(t *testing.T) {
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
	l := &load{created: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go l.run(t, cp, namespaces, stop, &wg)
	time.Sleep(time.Second)
	h.down()
	time.Sleep(outage())
	h.up(t)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	defer h.down()
	verifyAgainstTruth(t, cp, namespaces, l, "webhook down "+outage().String(), h.received)
}

// The NATS server restarts under load; the JetStream stream ends up with
// every object's final state.
func TestNATSRestartUnderLoad(t *testing.T) {
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
	l := &load{created: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go l.run(t, cp, namespaces, stop, &wg)
	time.Sleep(time.Second)
	srv.Restart(t)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
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

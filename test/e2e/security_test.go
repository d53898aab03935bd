package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// RBAC objects take almost any name, control characters included. Such a
// name must neither stall a sink (Go's transport refuses a raw control
// character in a header: before, the webhook retried it forever and
// nothing after it arrived) nor split a NATS subject: it is carried
// percent-encoded, and the events after it arrive too.
func TestHostileNamesDoNotStallSinks(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "hostile")
	srv := testenv.StartNATS(t)

	var mu sync.Mutex
	var subjects []string // ce-subject as received, decoded
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s, err := url.PathUnescape(r.Header.Get("ce-subject"))
		if err != nil {
			http.Error(w, "bad ce-subject encoding", http.StatusBadRequest)
			return
		}
		mu.Lock()
		subjects = append(subjects, s)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	msgs := make(chan *natsgo.Msg, 64)
	sub, err := nc.ChanSubscribe("k8s.>", msgs)
	must(t, err)
	defer sub.Unsubscribe()

	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: hook
    webhook: {url: `+hook.URL+`}
  - name: bus
    nats: {url: `+srv.ClientURL()+`}
rules:
  - name: roles
    resource: rbac.authorization.k8s.io/v1/roles
    namespaces: [hostile]
    events: [added]
    sinks: [hook, bus]
`)
	hostile := "evil\n\x1b[31mX-Injected: 1\r"
	cs := cp.Clientset(t)
	for _, name := range []string{hostile, "after"} {
		_, err := cs.RbacV1().Roles("hostile").Create(context.Background(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating role %q: %v", name, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second) // for NATS and the webhook
	var natsSubjects []string
	for len(natsSubjects) < 2 {
		select {
		case m := <-msgs:
			natsSubjects = append(natsSubjects, m.Subject)
		case <-time.After(time.Until(deadline)):
			t.Fatalf("NATS got %q, want both roles", natsSubjects)
		}
	}
	want := []string{
		"k8s.e2e.rbac%2Eauthorization%2Ek8s%2Eio.roles.hostile." + natssink.Token(hostile) + ".added",
		"k8s.e2e.rbac%2Eauthorization%2Ek8s%2Eio.roles.hostile.after.added",
	}
	if strings.Join(natsSubjects, " ") != strings.Join(want, " ") || strings.ContainsAny(natsSubjects[0], "\n\r\x1b ") {
		t.Errorf("NATS subjects %q, want %q", natsSubjects, want)
	}
	var got []string
	eventually(t, time.Until(deadline), func() error {
		mu.Lock()
		got = append([]string(nil), subjects...)
		mu.Unlock()
		if len(got) != 2 {
			return fmt.Errorf("webhook got %q, want both roles (a hostile name stalls the sink)", got)
		}
		return nil
	})
	if got[0] != "hostile/"+hostile || got[1] != "hostile/after" {
		t.Errorf("webhook subjects %q", got)
	}
}

// allowSecretData in the config is not enough: Secret data leaves the
// cluster only when bridge run also has --allow-secret-data (set by the
// chart value), so whoever may edit the config cannot switch redaction off.
func TestAllowSecretDataNeedsTheRunFlag(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "secrets-gate")
	cs := cp.Clientset(t)
	_, err := cs.CoreV1().Secrets("secrets-gate").Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"},
		StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{})
	must(t, err)
	cfg := func(out string) string {
		return fileConfig(out, rule("secrets", "v1/secrets", "secrets-gate")+"    allowSecretData: true\n")
	}
	for _, tc := range []struct {
		flags    []string
		redacted bool
	}{{nil, true}, {[]string{"--allow-secret-data"}, false}} {
		out := filepath.Join(t.TempDir(), "events.jsonl")
		b := startBridge(t, cp, cfg(out), withFlags(tc.flags...))
		evs := waitEvents(t, out, "the secret", func(evs []ce) bool { return len(evs) == 1 })
		data, _ := evs[0].Data.Object["data"].(map[string]any)
		switch pw := data["password"]; {
		case tc.redacted && pw != "<redacted>":
			t.Errorf("without --allow-secret-data: password = %v, want <redacted>", pw)
		case !tc.redacted && pw != "aHVudGVyMg==":
			t.Errorf("with --allow-secret-data: password = %v, want the data", pw)
		}
		if tc.redacted && !strings.Contains(b.log(), "rule sets allowSecretData, but the bridge runs without --allow-secret-data") {
			t.Errorf("no warning in the log:\n%s", b.log())
		}
		b.stop()
	}
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The bridge delivers Deployments to NATS JetStream, where a downstream
// durable consumer selects one namespace by wildcard, and ConfigMaps to a
// signed webhook; what the webhook refuses lands in the dead-letter file.
func TestBridgeToNATSAndWebhook(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	for _, ns := range []string{"sinks-prod", "sinks-staging"} {
		testenv.EnsureNamespace(t, cp, ns)
	}
	srv := testenv.StartNATS(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "hmac")
	must(t, os.WriteFile(secret, []byte("e2e-secret"), 0o600))
	deadLetters := filepath.Join(dir, "dead.jsonl")

	var mu sync.Mutex
	var hooked []http.Header
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("ce-subject") == "sinks-prod/poison" {
			http.Error(w, "we do not take poison", http.StatusUnprocessableEntity)
			return
		}
		// The documented v2 recipe: HMAC-SHA256(secret, t + "\n" + the
		// sorted ce-* headers as "name:value\n" + "\n" + body).
		fields := map[string]string{}
		for _, part := range strings.Split(r.Header.Get("X-Kubebridge-Signature"), ",") {
			k, v, _ := strings.Cut(part, "=")
			fields[k] = v
		}
		var lines []string
		for name, values := range r.Header {
			if name = strings.ToLower(name); strings.HasPrefix(name, "ce-") {
				lines = append(lines, name+":"+values[0]+"\n")
			}
		}
		sort.Strings(lines)
		mac := hmac.New(sha256.New, []byte("e2e-secret"))
		mac.Write([]byte(fields["t"] + "\n" + strings.Join(lines, "") + "\n"))
		mac.Write(body)
		if got, _ := hex.DecodeString(fields["v2"]); !hmac.Equal(got, mac.Sum(nil)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		hooked = append(hooked, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()

	startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: bus
    nats:
      url: `+srv.ClientURL()+`
      jetstream: true
      stream: {name: K8S}
  - name: hook
    webhook:
      url: `+hook.URL+`
      signingSecretFile: `+secret+`
    deadLetter: {file: `+deadLetters+`}
rules:
  - name: deployments
    resource: apps/v1/deployments
    namespaces: [sinks-prod, sinks-staging]
    sinks: [bus]
  - name: configmaps
    resource: v1/configmaps
    namespaces: [sinks-prod]
    sinks: [hook]
`)
	cs := cp.Clientset(t)
	ctx := context.Background()
	for _, ns := range []string{"sinks-prod", "sinks-staging"} {
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, deployment("api"), metav1.CreateOptions{})
		must(t, err)
	}
	for _, name := range []string{"settings", "poison"} {
		_, err := cs.CoreV1().ConfigMaps("sinks-prod").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(t, err)
	}

	nc, err := natsgo.Connect(srv.ClientURL())
	must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, "K8S", jetstream.ConsumerConfig{Durable: "prod-deployments", FilterSubject: "k8s.*.apps.deployments.sinks-prod.>", AckPolicy: jetstream.AckExplicitPolicy})
	must(t, err)
	var subjects []string
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	must(t, err)
	for m := range batch.Messages() {
		subjects = append(subjects, m.Subject())
		_ = m.Ack()
	}
	time.Sleep(300 * time.Millisecond) // the staging deployment would have arrived by now
	more, err := cons.FetchNoWait(10)
	must(t, err)
	for m := range more.Messages() {
		subjects = append(subjects, m.Subject())
	}
	if len(subjects) != 1 || subjects[0] != "k8s.e2e.apps.deployments.sinks-prod.api.added" {
		t.Errorf("wildcard consumer got %v, want only the prod deployment", subjects)
	}

	eventually(t, 30*time.Second, func() error {
		mu.Lock()
		n := len(hooked)
		mu.Unlock()
		data, _ := os.ReadFile(deadLetters)
		if n < 1 || bytes.Count(data, []byte("\n")) < 1 {
			return fmt.Errorf("webhook got %d, dead-letter %q", n, data)
		}
		return nil
	})
	mu.Lock()
	if hooked[0].Get("ce-subject") != "sinks-prod/settings" || hooked[0].Get("ce-type") != "io.kubebridge.configmaps.core.added" {
		t.Errorf("webhook headers %v", hooked[0])
	}
	mu.Unlock()
	f, err := os.Open(deadLetters)
	must(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	var rec struct {
		Sink  string `json:"sink"`
		Error string `json:"error"`
		Event struct {
			Subject string `json:"subject"`
		} `json:"event"`
	}
	must(t, json.Unmarshal(sc.Bytes(), &rec))
	if rec.Sink != "hook" || rec.Event.Subject != "sinks-prod/poison" || !strings.Contains(rec.Error, "422") {
		t.Errorf("dead-letter record %s", sc.Bytes())
	}
}

func deployment(name string) *appsv1.Deployment {
	replicas := int32(1)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "nginx"}}},
			},
		},
	}
}

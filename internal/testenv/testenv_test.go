package testenv_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The control plane serves real API calls, including watches that survive
// an apiserver restart only as far as etcd keeps the data.
func TestControlPlaneServesAndRestarts(t *testing.T) {
	t.Parallel() // each of these two restarts a control plane of its own
	cp := testenv.StartControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()

	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.37.1" {
		t.Errorf("server version = %q, want v1.37.1 (set by hack/tools/build.sh)", v.GitVersion)
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added {
			t.Fatalf("first watch event = %s, want ADDED", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10s")
	}

	if err := cp.RestartAPIServer(); err != nil {
		t.Fatal(err)
	}
	// The open watch ends with the old process; the data lives on in etcd.
	deadline := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-w.ResultChan():
		case <-deadline:
			t.Fatal("watch still open 10s after the apiserver restarted")
		}
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Errorf("after restart data = %v", got.Data)
	}
}

// A ServiceAccount identity has exactly the RBAC it is granted.
func TestServiceAccountIdentityIsRBACBound(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	kubeconfig := cp.ServiceAccountKubeconfig(t, "testenv-sa", "reader")
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()

	_, err = sa.CoreV1().ConfigMaps("testenv-sa").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("before any grant: list err = %v, want Forbidden", err)
	}
	cp.Grant(t, "testenv-sa", "reader", "testenv-cm-reader", "testenv-sa",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}})
	// RBAC changes reach the authorizer through its informer: wait briefly.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = sa.CoreV1().ConfigMaps("testenv-sa").List(ctx, metav1.ListOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("after grant: %v", err)
	}
	if _, err := sa.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("other namespace: err = %v, want Forbidden", err)
	}
}

// The embedded NATS server speaks JetStream and survives a restart with its store.
func TestNATSJetStreamSurvivesRestart(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, fmt.Sprintf("k8s.test.%d", i), []byte("x"), jetstream.WithMsgID(fmt.Sprint("id-", i%2))); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart(t)
	var info *jetstream.StreamInfo
	for {
		s, err := js.Stream(ctx, "K8S")
		if err == nil {
			info, err = s.Info(ctx)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("stream not back after restart: %v (connected=%v to %s)", err, nc.IsConnected(), nc.ConnectedUrl())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages after restart, want 2 (3 published, one a duplicate id)", info.State.Msgs)
	}
}

// helm is built at its pinned version and reaches the test apiserver.
func TestHelmTalksToTheAPIServer(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	helm := testenv.Tool(t, "helm")
	out, err := exec.Command(helm, "version", "--template", "{{.Version}}").CombinedOutput()
	if err != nil || string(out) != "v4.3.1" {
		t.Fatalf("helm version = %q (%v), want v4.3.1", out, err)
	}
	kc, err := cp.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(helm, "list", "--all-namespaces", "--kubeconfig", kc, "-o", "json").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "[]" {
		t.Fatalf("helm list = %q (%v), want []", out, err)
	}
}

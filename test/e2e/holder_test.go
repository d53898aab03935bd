package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A sink whose destination holds the view (a Kafka state topic) and is
// down when the bridge starts does not hold the other sinks up: it starts
// from its checkpoint, and once the destination answers, what it holds
// besides (an object written behind the bridge's back) is reconciled away.
func TestHolderDownAtStartIsReconciledWhenItAnswers(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	const ns = "holder-late"
	testenv.EnsureNamespace(t, cp, ns)
	cs := cp.Clientset(t)
	for i := range 5 {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) { // a test run again on the shared control plane
			must(t, err)
		}
	}
	k := testenv.StartKafka(t)
	ghost := `{"specversion":"1.0","id":"uid-ghost.0.1.added","source":"kubebridge/e2e","type":"io.kubebridge.configmaps.core.added","subject":"` +
		ns + `/ghost","data":{"object":{"metadata":{"namespace":"` + ns + `","name":"ghost","uid":"uid-ghost","resourceVersion":"1"}}}}`
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	must(t, err)
	compact := "compact"
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"cleanup.policy": &compact}, "kb.late.state.cms")
	cl.Close()
	must(t, err)
	produceRaw(t, k.Brokers(), "kb.late.state.cms", &kgo.Record{Key: []byte("uid-ghost"), Value: []byte(ghost)})
	k.Stop()

	out := filepath.Join(t.TempDir(), "events.jsonl")
	b := startBridge(t, cp, `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: file
    file: {path: `+out+`}
  - name: bus
    kafka: {brokers: [`+strings.Join(k.Brokers(), ",")+`], topic: "kb.late.{rule}", stateTopic: "kb.late.state.{rule}", createTopics: true, timeout: 2s}
    retry: {initialInterval: 50ms, maxInterval: 1s}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [`+ns+`]
    sinks: [file, bus]
`, withRestartFlags(), withStartTimeout(90*time.Second))
	// The file sink delivers while Kafka is down.
	waitEvents(t, out, "the file sink's events while Kafka is down", func(evs []ce) bool { return len(evs) >= 5 })

	k.Start(t)
	truth := map[string]string{}
	list, err := cs.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
	must(t, err)
	for _, cm := range list.Items {
		truth[string(cm.UID)] = ns + "/" + cm.Name + "@" + cm.ResourceVersion
	}
	var state map[string]string
	if !poll(120*time.Second, func() bool {
		state = heldState(t, readKafkaTopic(t, k.Brokers(), "kb.late.state.cms"))
		return fmt.Sprint(state) == fmt.Sprint(truth)
	}) {
		t.Fatalf("the state topic does not hold the view once Kafka answers:\n%s\nbridge log:\n%s", diffViews(state, truth), b.runLogTail())
	}
	if !strings.Contains(b.log(), "read what the sink's destination holds, and reconciled") {
		t.Errorf("the late read is not logged:\n%s", b.runLogTail())
	}
}

package e2e

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// An object relabelled out of a rule whose labelSelector the apiserver
// applies (the only rule on its resource) leaves the consumer's mirror: a
// deletion is delivered for it, as for a real deletion.
//
// The apiserver reports an object leaving a watch's label selection as
// DELETED with its previous state (labels that still match) at the new
// resourceVersion (apiserver cacher/cache_watcher.go, etcd3/watcher.go):
// exactly what a real deletion looks like. So, unlike a selector applied
// client-side, the deletion carries no kbreason unmatched and the last
// matching labels (docs/guarantees.md says so). The test accepts either
// reason so that it keeps holding if deletions are ever confirmed against
// the apiserver.
func TestLeavingServerSideLabelSelectorIsADeletion(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	cs := cp.Clientset(t)
	ctx := context.Background()
	const ns = "kb-unmatched"
	testenv.EnsureNamespace(t, cp, ns)
	out := filepath.Join(t.TempDir(), "events.jsonl")
	startBridge(t, cp, fileConfig(out, "  - name: x\n    resource: v1/configmaps\n    namespaces: ["+ns+"]\n    labelSelector: app=x\n    sinks: [out]\n"))

	for _, name := range []string{"moved", "gone"} {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "x"}}}, metav1.CreateOptions{})
		must(t, err)
	}
	waitEvents(t, out, "both added", func(evs []ce) bool {
		return has(evs, "x", ns+"/moved", "added") && has(evs, "x", ns+"/gone", "added")
	})
	_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, "moved", types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"y"}}}`), metav1.PatchOptions{})
	must(t, err)
	must(t, cs.CoreV1().ConfigMaps(ns).Delete(ctx, "gone", metav1.DeleteOptions{}))

	evs := waitEvents(t, out, "both deleted", func(evs []ce) bool {
		return len(of(evs, "x", ns+"/moved")) >= 2 && len(of(evs, "x", ns+"/gone")) >= 2
	})
	if !has(evs, "x", ns+"/moved", "added", "deleted") && !has(evs, "x", ns+"/moved", "added", "deleted:unmatched") {
		t.Errorf("relabelled out of the selection: got %v, want [added deleted] (or deleted:unmatched)", of(evs, "x", ns+"/moved"))
	}
	if got := of(evs, "x", ns+"/gone"); !has(evs, "x", ns+"/gone", "added", "deleted") {
		t.Errorf("deleted: got %v, want [added deleted]", got)
	}
}

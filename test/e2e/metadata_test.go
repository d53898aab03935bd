package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A rule that needs only metadata gets a metadata-only cache and events
// without the object's data; changes of the data alone are not its business.
func TestMetadataOnlyRule(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	testenv.EnsureNamespace(t, cp, "e2e-meta")
	out := filepath.Join(t.TempDir(), "events.jsonl")
	b := startBridge(t, cp, fileConfig(out, rule("meta", "v1/configmaps", "e2e-meta")+
		"    include: [metadata]\n    changed: [metadata.labels]\n    where: \"object.metadata.name.startsWith('m')\"\n"))

	cms := cp.Clientset(t).CoreV1().ConfigMaps("e2e-meta")
	ctx := context.Background()
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "m1", Labels: map[string]string{"v": "1"}},
		Data: map[string]string{"secret-ish": "payload-1"}}, metav1.CreateOptions{})
	must(t, err)
	cm.Data["secret-ish"] = "payload-2" // data only: not delivered
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	must(t, err)
	cm.Labels["v"] = "2"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	must(t, err)
	must(t, cms.Delete(ctx, "m1", metav1.DeleteOptions{}))

	evs := waitEvents(t, out, "added, updated, deleted", func(evs []ce) bool { return len(of(evs, "meta", "e2e-meta/m1")) >= 3 })
	if got := strings.Join(of(evs, "meta", "e2e-meta/m1"), ","); got != "added,updated,deleted" {
		t.Errorf("events = %s, want added,updated,deleted (the data-only update filtered)", got)
	}
	for _, e := range evs {
		if strings.Contains(string(e.raw), "payload-") {
			t.Errorf("%s event carries the data: %s", e.change(), e.raw)
		}
		md, _ := e.Data.Object["metadata"].(map[string]any)
		if e.Data.Object["kind"] != "ConfigMap" || md["name"] != "m1" || md["labels"] == nil {
			t.Errorf("%s event object = %v, want kind, metadata with labels", e.change(), e.Data.Object)
		}
	}
	if !strings.Contains(b.log(), "(metadata only)") {
		t.Errorf("the informer is not metadata only; log:\n%s", b.log())
	}
}

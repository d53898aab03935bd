package filters

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// object.metadata is typed (config.CELEnv) but still read from the
// unstructured object as it is: a field the object lacks is not set.
func TestWhereTypedMetadata(t *testing.T) {
	web := cm("a", "x", "1", map[string]string{"app": "web"}, nil)
	bare := cm("a", "x", "1", nil, nil)
	deleting := cm("a", "x", "2", nil, nil)
	deleting.SetDeletionTimestamp(&metav1.Time{Time: time.Date(2024, 5, 2, 10, 0, 0, 0, time.UTC)})

	r := compile(t, "    resource: v1/configmaps\n    where: \"object.metadata.labels['app'] == 'web'\"\n", nil)
	if !r.InView(web) {
		t.Error("labels app=web: out of the view")
	}
	if r.InView(bare) || r.EvalErrors() != 1 {
		t.Errorf("no labels: in the view or not an evaluation error (%d)", r.EvalErrors())
	}

	opt := compile(t, "    resource: v1/configmaps\n    where: \"object.metadata.?labels.?app.orValue('') == 'web'\"\n", nil)
	if !opt.InView(web) || opt.InView(bare) || opt.EvalErrors() != 0 {
		t.Errorf("optional labels: wrong view or %d evaluation errors", opt.EvalErrors())
	}

	del := compile(t, "    resource: v1/configmaps\n    where: \"has(object.metadata.deletionTimestamp) && object.metadata.deletionTimestamp.startsWith('2024-05-02T')\"\n", nil)
	if !del.InView(deleting) || del.InView(bare) || del.EvalErrors() != 0 {
		t.Errorf("deletionTimestamp: wrong view or %d evaluation errors", del.EvalErrors())
	}

	// oldObject is null on adds.
	f := compile(t, "    resource: v1/configmaps\n    where: \"oldObject == null || object.metadata.?labels.orValue({}) != oldObject.metadata.?labels.orValue({})\"\n", nil)
	if !f.PassesEventFilter(web, nil, event.Added) {
		t.Error("add filtered out")
	}
	if f.PassesEventFilter(web, web, event.Updated) || !f.PassesEventFilter(web, bare, event.Updated) {
		t.Error("update: wrong label change filter")
	}
	if f.EvalErrors() != 0 {
		t.Errorf("EvalErrors = %d", f.EvalErrors())
	}
}

func BenchmarkTypedMetadataWhere(b *testing.B) {
	r := compile(b, "    resource: v1/configmaps\n    where: \"object.metadata.labels['team'] == 'pay' && object.metadata.name.startsWith('x')\"\n", nil)
	obj := cm("a", "x", "1", map[string]string{"team": "pay"}, nil)
	b.ReportAllocs()
	for b.Loop() {
		if !r.InView(obj) {
			b.Fatal("not in view")
		}
	}
}

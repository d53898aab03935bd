package filters

import (
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// object.metadata is typed (celsandbox.CELEnv) but still read from the
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

// A where cannot make the bridge allocate without bound: replace and
// lists.range build their result in one call, before the cost check, so
// they are bounded first; the evaluation fails (counted, not in the view)
// without the allocation.
func TestWhereAllocationsAreBounded(t *testing.T) {
	big := cm("a", "x", "1", nil, map[string]any{"big": strings.Repeat("a", 100_000)})
	for _, expr := range []string{
		`object.data.big.replace('a', '` + strings.Repeat("b", 5000) + `') != ''`,
		`object.data.big.replace('', '` + strings.Repeat("b", 100) + `') != ''`,
		`size(lists.range(size(object.data.big) * 1000)) > 0`,
		`lists.range(1000).map(i, object.data.big).join('') != ''`,
		`lists.range(1000).map(i, object.data.big).join(',') != ''`,
		`'%s'.format([lists.range(1000).map(i, object.data.big)]) != ''`,
		`size(lists.range(100000)) > 0`,
		`size(object.data.big.split('').sort()) > 0`,
		`size(object.data.big.split('').distinct()) > 0`,
	} {
		r := compile(t, "    resource: v1/configmaps\n    where: \""+expr+"\"\n", nil)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if r.InView(big) || r.EvalErrors() != 1 {
			t.Errorf("%.60s: in the view or not an evaluation error (%d)", expr, r.EvalErrors())
		}
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
			t.Errorf("%.60s: allocated %d MiB", expr, grew>>20)
		}
	}
	// A guarded call is still counted by the cost limit: many small
	// replaces of a large string stop at the limit.
	costly := compile(t, "    resource: v1/configmaps\n    where: \"lists.range(2000).all(i, object.data.big.replace('a', 'b') != '')\"\n", nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if costly.InView(big) || costly.EvalErrors() != 1 {
		t.Errorf("2000 replaces of 100 KB: in the view or no error (%d)", costly.EvalErrors())
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Errorf("2000 replaces of 100 KB: allocated %d MiB, the cost limit did not stop them", grew>>20)
	}
	// A chain of replaces (escaping) evaluates each argument once: its
	// cost grows with the chain, not exponentially.
	chain := "object.metadata.name"
	for range 16 {
		chain += ".replace('a', 'b')"
	}
	named := cm("a", strings.Repeat("xa", 100), "1", nil, nil)
	esc := compile(t, "    resource: v1/configmaps\n    where: \""+chain+".startsWith('xb')\"\n", nil)
	if !esc.InView(named) || esc.EvalErrors() != 0 {
		t.Errorf("16 chained replaces: not in the view (%d errors)", esc.EvalErrors())
	}
	for _, expr := range []string{"['b', 'a'].sort() == ['a', 'b']", "[1, 1, 2].distinct() == [1, 2]", "['a', 'b'].join('-') == 'a-b'", "'%s-%d'.format(['a', 1]) == 'a-1'"} {
		r := compile(t, "    resource: v1/configmaps\n    where: \""+expr+"\"\n", nil)
		if !r.InView(named) || r.EvalErrors() != 0 {
			t.Errorf("%s: false or an error (%d)", expr, r.EvalErrors())
		}
	}
	// Within the bounds, replace works as usual.
	ok := compile(t, "    resource: v1/configmaps\n    where: \"object.data.big.replace('a', 'bb', 3).startsWith('bbbbbba')\"\n", nil)
	if !ok.InView(big) || ok.EvalErrors() != 0 {
		t.Errorf("a bounded replace: not in the view (%d errors)", ok.EvalErrors())
	}
}

// A Secrets rule's filters see the Secret as its events carry it:
// redacted. A where, a field selector or an index term cannot test guesses
// against a value (the rule's name in kbrule would tell which matched), and
// an evaluation error cannot carry one into the log. A config cannot shrink
// the annotations always redacted either.
func TestSecretFiltersSeeTheRedactedSecret(t *testing.T) {
	secret := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
			"data": map[string]any{"password": "c2VjcmV0"}, "type": "Opaque"}}
		u.SetNamespace("a")
		u.SetName("db")
		u.SetAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "c2VjcmV0", "team": "pay"})
		return u
	}
	for _, guess := range []string{
		"    where: \"dyn(object).data.password.startsWith('c2Vj')\"\n",
		"    where: \"dyn(object).data.password == 'c2VjcmV0'\"\n",
		"    where: \"object.metadata.annotations['kubectl.kubernetes.io/last-applied-configuration'] == 'c2VjcmV0'\"\n",
		"    fieldSelector: data.password=c2VjcmV0\n",
		"    index: {\"annotation:kubectl.kubernetes.io/last-applied-configuration\": [c2VjcmV0]}\n",
	} {
		r := compile(t, "    resource: v1/secrets\n"+guess+"redaction: {secretAnnotations: []}\n", nil)
		if r.InView(secret()) {
			t.Errorf("%s: a guess of the value matched", guess)
		}
		if !r.PassesEventFilter(secret(), secret(), event.Updated) {
			t.Errorf("%s: the event filter refused", guess)
		}
	}
	r := compile(t, "    resource: v1/secrets\n    where: \"object.metadata.annotations['team'] == 'pay' && dyn(object).data.password == '<redacted>'\"\n", nil)
	if !r.InView(secret()) {
		t.Error("a filter on what is not redacted no longer matches")
	}
	leak := compile(t, "    resource: v1/secrets\n    where: \"dyn(object).data[dyn(object).data.password] == 'x'\"\n", nil)
	var logs strings.Builder
	leak.logger = slog.New(slog.NewTextHandler(&logs, nil))
	if leak.InView(secret()) || strings.Contains(logs.String(), "c2VjcmV0") {
		t.Errorf("the value reached the log: %s", logs.String())
	}
	allowed := compile(t, "    resource: v1/secrets\n    allowSecretData: true\n    where: \"dyn(object).data.password == 'c2VjcmV0'\"\n", nil)
	if !allowed.InView(secret()) {
		t.Error("with allowSecretData, filters do not see the data")
	}
}

// The expression, and its kin: calls whose cost the tracker does
// not know when their arguments are dyn (3,000 concatenations of a 1 MiB
// value once cost 72,014, ran 30 s and allocated 6 GB), and calls that
// build in one step. Each fails fast, as an evaluation error, within a few
// MiB: a call over the per-call bound at once, a comprehension of calls
// each under it at the evaluation's budget (celsandbox.MaxCELAllocBytes).
func TestWhereAllocationsAreBoundedWhateverTheCall(t *testing.T) {
	huge := cm("a", "x", "1", nil, map[string]any{"s": strings.Repeat("a", 1<<20), "m": strings.Repeat("a", 400<<10)})
	for _, expr := range []string{
		`lists.range(3000).map(i, dyn(object).data.s + dyn(object).data.s).size() > 0`,
		`lists.range(3000).map(i, dyn(object).data.m + dyn(object).data.m).size() > 0`, // 800 KiB each: the budget
		`lists.range(3000).map(i, object.data.m + 'x').size() > 0`,
		`lists.range(3000).map(i, dyn(object).data.m.reverse()).size() > 0`,
		`lists.range(3000).map(i, base64.encode(bytes(dyn(object).data.m))).size() > 0`,
		`lists.range(3000).map(i, strings.quote(dyn(object).data.m)).size() > 0`,
		`lists.range(3000).map(i, dyn(object).data.m.upperAscii()).size() > 0`,
		`lists.range(3000).map(i, dyn(object).data.m.substring(1)).size() > 0`,
		`lists.range(3000).map(i, dyn(object).data.m.charAt(5)).size() > 0`,
		`base64.encode(bytes(dyn(object).data.s)) != ''`,
		`strings.quote(dyn(object).data.s) != ''`,
		`bytes(dyn(object).data.s) + bytes(dyn(object).data.s) != b''`,
	} {
		r := compile(t, "    resource: v1/configmaps\n    where: \""+strings.ReplaceAll(expr, `"`, `\"`)+"\"\n", nil)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		if r.InView(huge) || r.EvalErrors() != 1 {
			t.Errorf("%.70s: in the view or not an evaluation error (%d)", expr, r.EvalErrors())
		}
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("%.70s: allocated %d MiB (%s)", expr, grew>>20, took)
		}
	}
	// Within the bounds the same calls work and give the right values.
	small := cm("a", "x", "1", nil, map[string]any{"s": "abc"})
	for _, expr := range []string{
		`dyn(object).data.s + dyn(object).data.s == 'abcabc'`,
		`object.data.s + '-' + object.metadata.name == 'abc-x'`,
		`1 + 2 == 3 && 1.5 + 1.0 == 2.5`,
		`[1, 2] + [3] == [1, 2, 3]`,
		`dyn(object).data.s.reverse() == 'cba'`,
		`[1, 2, 3].reverse() == [3, 2, 1]`,
		`base64.encode(bytes(dyn(object).data.s)) == 'YWJj'`,
		`strings.quote(dyn(object).data.s) == '"abc"'`,
		`dyn(object).data.s.upperAscii() == 'ABC'`,
		`dyn(object).data.s.substring(1) == 'bc' && dyn(object).data.s.charAt(0) == 'a'`,
		`lists.range(100).map(i, object.data.s + string(i)).size() == 100`,
	} {
		r := compile(t, "    resource: v1/configmaps\n    where: \""+strings.ReplaceAll(expr, `"`, `\"`)+"\"\n", nil)
		if !r.InView(small) || r.EvalErrors() != 0 {
			t.Errorf("%s: false or an error (%d)", expr, r.EvalErrors())
		}
	}
}

// The budget is per evaluation: one program evaluated from many
// goroutines at once (the informers share rules) charges each evaluation
// alone, so evaluations under the budget all pass, under -race.
func TestWhereBudgetIsPerEvaluation(t *testing.T) {
	obj := cm("a", "x", "1", nil, map[string]any{"m": strings.Repeat("a", 100<<10)})
	// 30 concatenations of 100 KiB, 3 MiB per evaluation (and within the
	// cost limit), under the 16 MiB budget; the 40 evaluations below
	// sharing one budget would pass it six times over.
	r := compile(t, "    resource: v1/configmaps\n    where: \"lists.range(30).map(i, dyn(object).data.m + 'x').size() == 30\"\n", nil)
	done := make(chan bool)
	for range 8 {
		go func() {
			ok := true
			for range 5 {
				ok = ok && r.InView(obj)
			}
			done <- ok
		}()
	}
	for range 8 {
		if !<-done {
			t.Error("an evaluation under the budget failed")
		}
	}
	if r.EvalErrors() != 0 {
		t.Errorf("%d evaluation errors", r.EvalErrors())
	}
}

// owners and involved, as include: [owners] resolves them: the issue's
// example (Warning Events of Pods whose Deployment has label
// team=payments) and a rule on Pods by their top controller; a
// Deployment without the label leaves the Event out. Waiting is asked for
// only by the caller that says so, and counted when still incomplete.
func TestWhereOwnersAndInvolved(t *testing.T) {
	deploy := func(team string) []event.Owner {
		d := event.Owner{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Labels: map[string]string{}}
		if team != "" {
			d.Labels["team"] = team
		}
		return []event.Owner{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-6d4", UID: "rs", Labels: map[string]string{}}, d}
	}
	var team string
	var waits []bool
	relations := func(gvr schema.GroupVersionResource, obj *unstructured.Unstructured, deadline time.Time) *event.Related {
		waits = append(waits, !deadline.IsZero())
		rel := &event.Related{Owners: deploy(team)}
		if gvr.Resource == "events" {
			rel = &event.Related{Involved: &event.Involved{APIVersion: "v1", Kind: "Pod", Namespace: "a", Name: "web-6d4-x", Owners: deploy(team), Found: true}}
		}
		rel.Incomplete = team == ""
		return rel
	}
	ev := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Event", "type": "Warning",
		"metadata": map[string]any{"name": "e", "namespace": "a"}}}
	r := compile(t, "    resource: v1/events\n    include: [owners]\n    where: \"object.type == 'Warning' && involved.owners.exists(o, o.kind == 'Deployment' && o.labels.team == 'payments')\"\n", nil)
	r.SetRelations(relations)
	for _, tc := range []struct {
		team string
		want bool
	}{{"payments", true}, {"search", false}} {
		team = tc.team
		if got := r.InView(ev); got != tc.want || r.EvalErrors() != 0 {
			t.Errorf("team %q: in view %v, %d errors", tc.team, got, r.EvalErrors())
		}
	}
	if !r.Event.IncludeObject {
		t.Error("include: [owners] alone leaves the object out")
	}

	pods := compile(t, "    resource: v1/pods\n    include: [owners]\n    where: \"size(owners) > 0 && owners[size(owners)-1].kind == 'Deployment' && owners[size(owners)-1].labels.?team.orValue('') == 'payments'\"\n", nil)
	pods.SetRelations(relations)
	pod := cm("a", "web-6d4-x", "1", nil, nil)
	team, waits = "payments", nil
	if rel := pods.Related(pod, Live); !pods.InViewSeen(pod, pod, rel) || pods.OwnersIncomplete() != 0 {
		t.Errorf("pod of team payments out of the view (incomplete %d)", pods.OwnersIncomplete())
	}
	team = ""
	if rel := pods.Related(pod, Live); pods.InViewSeen(pod, pod, rel) || pods.OwnersIncomplete() != 1 || pods.EvalErrors() != 0 {
		t.Errorf("pod without team: in the view, or incomplete %d, errors %d", pods.OwnersIncomplete(), pods.EvalErrors())
	}
	if pods.InView(pod); len(waits) != 3 || !waits[0] || !waits[1] || waits[2] {
		t.Errorf("waits asked: %v (want the stage's two, not InView's)", waits)
	}

	// ownerLabels: the rule sees those labels only (a copy: what the
	// relations returned is not changed).
	some := compile(t, "    resource: v1/pods\n    include: [owners]\n    ownerLabels: [team]\n", nil)
	shared := &event.Related{Owners: []event.Owner{{Kind: "Deployment", Name: "web", Labels: map[string]string{"team": "payments", "pod-template-hash": "x"}}}}
	some.SetRelations(func(schema.GroupVersionResource, *unstructured.Unstructured, time.Time) *event.Related { return shared })
	if rel := some.Related(pod, Reread); len(rel.Owners[0].Labels) != 1 || rel.Owners[0].Labels["team"] != "payments" || len(shared.Owners[0].Labels) != 2 {
		t.Errorf("ownerLabels [team]: %+v (shared %+v)", rel.Owners[0].Labels, shared.Owners[0].Labels)
	}
}

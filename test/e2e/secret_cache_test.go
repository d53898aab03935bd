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

// Secrets whose values no rule may deliver are cached as digests, and what
// users see does not change: events carry <redacted> for every value (in
// the object, the old object and the patch), changed: [data] still tells
// an update of one value (delivered) from a label-only update (not), and
// a rule with allowSecretData on a bridge run with --allow-secret-data
// still gets the values, here from an informer it shares with a rule that
// redacts them, while another namespace's informer caches digests.
func TestSecretsCachedAsDigests(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	for _, ns := range []string{"secret-cache", "secret-cache-shared"} {
		testenv.EnsureNamespace(t, cp, ns)
	}
	out := filepath.Join(t.TempDir(), "events.jsonl")
	const rules = "    include: [object, oldObject, patch]\n    changed: [data]\n"
	b := startBridge(t, cp, fileConfig(out,
		rule("solo", "v1/secrets", "secret-cache")+rules,
		rule("redacted", "v1/secrets", "secret-cache-shared")+rules,
		rule("allowed", "v1/secrets", "secret-cache-shared")+rules+"    allowSecretData: true\n",
	), withFlags("--allow-secret-data"))

	ctx := context.Background()
	const pw, pw2, pw3 = "hunter2", "correct-horse", "battery-staple"
	plaintexts := []string{pw, pw2, pw3, "aHVudGVy", "Y29ycmVjdC1ob3Jz", "YmF0dGVyeS1zdGFwbG", "tok-en-value", "dG9rLWVu"}
	for _, ns := range []string{"secret-cache", "secret-cache-shared"} {
		secrets := cp.Clientset(t).CoreV1().Secrets(ns)
		s, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Labels: map[string]string{"v": "1"},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"stringData":{"password":"hunter2"}}`}},
			Data: map[string][]byte{"password": []byte(pw), "copy": []byte(pw), "token": []byte("tok-en-value")}}, metav1.CreateOptions{})
		must(t, err)
		s.Data["password"] = []byte(pw2) // one value: delivered
		s, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		must(t, err)
		s.Labels["v"] = "2" // a label only: not delivered
		s, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		must(t, err)
		s.Data["copy"] = []byte(pw3) // after it in the object's order: it marks the end
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		must(t, err)
	}

	evs := waitEvents(t, out, "added and two updates for each rule", func(evs []ce) bool {
		return len(of(evs, "solo", "secret-cache/db")) >= 3 && len(of(evs, "redacted", "secret-cache-shared/db")) >= 3 &&
			len(of(evs, "allowed", "secret-cache-shared/db")) >= 3
	})
	for _, r := range []struct{ rule, subject string }{{"solo", "secret-cache/db"}, {"redacted", "secret-cache-shared/db"}, {"allowed", "secret-cache-shared/db"}} {
		if got := strings.Join(of(evs, r.rule, r.subject), ","); got != "added,updated,updated" {
			t.Errorf("%s: events %s, want added,updated,updated (the label-only update filtered by changed: [data])", r.rule, got)
		}
	}
	for _, e := range evs {
		raw := string(e.raw)
		if e.Rule == "allowed" {
			data, _ := e.Data.Object["data"].(map[string]any)
			if data["token"] != "dG9rLWVuLXZhbHVl" || (data["password"] != "Y29ycmVjdC1ob3JzZQ==" && data["password"] != "aHVudGVyMg==") {
				t.Errorf("allowed %s: data %v, want the values", e.change(), data)
			}
			continue
		}
		for _, leak := range append(plaintexts, "digest:") {
			if strings.Contains(raw, leak) {
				t.Errorf("%s %s carries %q: %s", e.Rule, e.change(), leak, raw)
			}
		}
		for _, o := range []map[string]any{e.Data.Object, e.Data.OldObject} {
			if o == nil {
				continue
			}
			data, _ := o["data"].(map[string]any)
			md, _ := o["metadata"].(map[string]any)
			ann, _ := md["annotations"].(map[string]any)
			if len(data) != 3 || data["password"] != "<redacted>" || data["copy"] != "<redacted>" || data["token"] != "<redacted>" ||
				ann["kubectl.kubernetes.io/last-applied-configuration"] != "<redacted>" {
				t.Errorf("%s %s: data %v, annotations %v; want every key, every value <redacted>", e.Rule, e.change(), data, ann)
			}
		}
		if e.change() == "updated" && (len(e.Data.Patch) == 0 || !strings.Contains(raw, `"path":"/data/`)) {
			t.Errorf("%s updated: the patch does not show the data change: %v", e.Rule, e.Data.Patch)
		}
	}
	for _, leak := range append(plaintexts, "digest:") {
		if strings.Contains(b.log(), leak) {
			t.Errorf("the bridge's log carries %q", leak)
		}
	}
}

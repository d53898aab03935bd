package event

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// Digests stand for values: equal values give equal digests, different
// values (and a string and a number that print alike) different ones, and
// every digest says it is one. The hash is keyed: it is not the plain
// SHA-256 of the value, which anyone could compute for a guess.
func TestDigest(t *testing.T) {
	long := strings.Repeat("A", 4096)
	if Digest("aHVudGVyMg==") != Digest("aHVudGVyMg==") || Digest(long) != Digest(strings.Clone(long)) {
		t.Error("equal values, different digests")
	}
	seen := map[string]any{}
	for _, v := range []any{"aHVudGVyMg==", "aHVudGVyMw==", "", long, long + "B", "1", int64(1), nil, map[string]any{"a": "b"}} {
		d := Digest(v)
		if prev, dup := seen[d]; dup {
			t.Errorf("%#v and %#v have the same digest %s", prev, v, d)
		}
		seen[d] = v
		if !strings.HasPrefix(d, DigestPrefix) || !strings.HasSuffix(d, ">") || len(d) != len(DigestPrefix)+22+1 {
			t.Errorf("Digest(%#v) = %q, want %s + 22 base64 characters + >", v, d, DigestPrefix)
		}
	}
	plain := sha256.Sum256([]byte("aHVudGVyMg=="))
	if d := Digest("aHVudGVyMg=="); strings.Contains(d, base64.RawURLEncoding.EncodeToString(plain[:16])) {
		t.Errorf("Digest is the unkeyed SHA-256 of the value: %s", d)
	}
}

// A Secret digested in a cache leaves the process exactly as a plain one
// does: every data, stringData and listed annotation value is <redacted>
// in the object, the old object and the patch, with no digest anywhere,
// and the annotations not listed keep their values.
func TestDigestedSecretEventsAreRedacted(t *testing.T) {
	ann := []string{"kubectl.kubernetes.io/last-applied-configuration", "vault.example/token"}
	old := obj("ns", "db", "1", map[string]any{"data": map[string]any{"pw": "c2VjcmV0MQ==", "user": "YWRtaW4="}})
	old.SetAnnotations(map[string]string{"vault.example/token": "hvs.OLD", "team": "pay"})
	cur := obj("ns", "db", "2", map[string]any{"data": map[string]any{"pw": "c2VjcmV0Mg==", "user": "YWRtaW4=", "new": "bmV3"},
		"stringData": map[string]any{"x": "plain"}})
	cur.SetAnnotations(map[string]string{"vault.example/token": "hvs.NEW", "team": "pay",
		"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"pw":"c2VjcmV0Mg=="}}`})
	noAnn := obj("ns", "db", "3", map[string]any{"data": map[string]any{"pw": "c2VjcmV0Mw=="}}) // annotations appear whole in the patch
	for _, o := range []map[string]any{old.Object, cur.Object, noAnn.Object} {
		DigestSecret(o, ann)
	}
	pw, _ := cur.Object["data"].(map[string]any)["pw"].(string)
	if !strings.HasPrefix(pw, DigestPrefix) || cur.GetAnnotations()["team"] != "pay" {
		t.Fatalf("DigestSecret: data.pw = %q, team annotation = %q", pw, cur.GetAnnotations()["team"])
	}
	r := &Rule{Name: "r", Cluster: "c", GVR: secrets, IncludeObject: true, IncludeOld: true, IncludePatch: true, SecretAnnotations: ann}
	for name, e := range map[string]*Event{
		"update":                    New(r, Updated, cur, old, time.Now()),
		"update adding annotations": New(r, Updated, cur, noAnn, time.Now()),
		"metadata only":             New(&Rule{Name: "m", GVR: secrets, IncludeMeta: true, SecretAnnotations: ann}, Added, cur, nil, time.Now()),
	} {
		d, err := e.Data()
		if err != nil {
			t.Fatal(err)
		}
		for _, leak := range []string{"c2VjcmV0", "YWRtaW4", "bmV3", "plain", "hvs.", "digest"} {
			if strings.Contains(string(d), leak) {
				t.Errorf("%s: %q in %s", name, leak, d)
			}
		}
		if !strings.Contains(string(d), `"team":"pay"`) || !strings.Contains(string(d), `\u003credacted\u003e`) {
			t.Errorf("%s: want the team annotation and <redacted> values in %s", name, d)
		}
	}
}

// Digesting a cached Secret again leaves it as it is: a second digest
// would make every value look changed.
func TestDigestSecretTwiceIsOnce(t *testing.T) {
	obj := map[string]any{
		"data":     map[string]any{"password": "c2VjcmV0"},
		"metadata": map[string]any{"annotations": map[string]any{"a": "v"}},
	}
	DigestSecret(obj, []string{"a"})
	once := obj["data"].(map[string]any)["password"]
	onceAnn := obj["metadata"].(map[string]any)["annotations"].(map[string]any)["a"]
	DigestSecret(obj, []string{"a"})
	if got := obj["data"].(map[string]any)["password"]; got != once {
		t.Errorf("data digested twice: %v, want %v", got, once)
	}
	if got := obj["metadata"].(map[string]any)["annotations"].(map[string]any)["a"]; got != onceAnn {
		t.Errorf("annotation digested twice: %v, want %v", got, onceAnn)
	}
}

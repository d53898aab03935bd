package event

// Secret values: the one policy. A rule's events, and what its filters
// (where, field selectors, index terms) see, carry a Secret's data,
// stringData and listed annotations as Redacted, unless the rule sets
// allowSecretData and the operator allows it too (bridge run
// --allow-secret-data: the config alone cannot switch redaction off). An
// informer whose rules all redact caches a Digest of each such value
// instead of the value. SecretPolicy says which for one rule; the informer's
// transform (CacheDigests), the rules stage (what filters see) and the
// event's data (Redact, RedactPatch) all ask it.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"slices"
	"strings"
	"sync"

	"github.com/wI2L/jsondiff"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SecretPolicy is how one rule treats Secret values (see above): its
// Rule.Secrets. The zero SecretPolicy redacts nothing.
type SecretPolicy struct {
	redacts bool
	// annotations are the annotations redacted with the data
	// (AllAnnotations: every one).
	annotations []string
}

// AllowsSecretData is whether a rule's events may carry Secret data: only
// when both the rule (allowSecretData) and the operator (bridge run
// --allow-secret-data) say so.
func AllowsSecretData(ruleAllows, operatorAllows bool) bool { return ruleAllows && operatorAllows }

// Redacts reports whether the policy hides any value: a rule of Secrets
// whose data is not allowed.
func (p SecretPolicy) Redacts() bool { return p.redacts }

// Redact returns obj as the rule may show it: obj itself, or a redacted
// shallow copy (RedactSecret). The input is not modified.
func (p SecretPolicy) Redact(obj map[string]any) map[string]any {
	if !p.redacts || obj == nil {
		return obj
	}
	return RedactSecret(obj, p.annotations)
}

// RedactPatch returns the JSON patch between two states as the rule may show
// it: values of operations on Secret values hidden.
func (p SecretPolicy) RedactPatch(patch jsondiff.Patch) jsondiff.Patch {
	if !p.redacts {
		return patch
	}
	return redactPatch(patch, p.annotations)
}

// redactsAnnotation reports whether the policy hides annotation key.
func (p SecretPolicy) redactsAnnotation(key string) bool {
	return p.redacts && (slices.Contains(p.annotations, key) || slices.Contains(p.annotations, AllAnnotations))
}

// CacheDigests says whether an informer of resource gvr whose rules have
// these policies may cache Secrets digested (DigestSecret): every rule
// redacts (none may deliver a value), and which annotations every one of
// them redacts (an annotation some rule shows keeps its value).
func CacheDigests(gvr schema.GroupVersionResource, rules []SecretPolicy) (annotations []string, ok bool) {
	if !IsSecret(gvr) || len(rules) == 0 {
		return nil, false
	}
	for _, p := range rules {
		if !p.redacts {
			return nil, false
		}
	}
	every := func(key string) bool {
		for _, p := range rules {
			if !p.redactsAnnotation(key) {
				return false
			}
		}
		return true
	}
	if every(AllAnnotations) {
		return []string{AllAnnotations}, true
	}
	for _, p := range rules {
		for _, a := range p.annotations {
			if a != AllAnnotations && !slices.Contains(annotations, a) && every(a) {
				annotations = append(annotations, a)
			}
		}
	}
	return annotations, true
}

// IsSecret reports whether gvr is the core group's Secrets, whose values
// are redacted unless a rule may deliver them.
func IsSecret(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" && gvr.Resource == "secrets"
}

// Redacted replaces every Secret value in events.
const Redacted = "<redacted>"

// secretFields hold a Secret's values.
var secretFields = []string{"data", "stringData"}

// AllAnnotations in a rule's SecretAnnotations redacts every annotation.
const AllAnnotations = "*"

// AlwaysRedactedAnnotations hold a Secret's values (kubectl's last-applied
// configuration, OpenShift's service account token): redacted whatever a
// config lists, so that editing the config cannot expose them.
var AlwaysRedactedAnnotations = []string{"kubectl.kubernetes.io/last-applied-configuration", "openshift.io/token-secret.value"}

// RedactSecret returns a shallow copy of a Secret object with every value of
// data and stringData replaced by Redacted, and so are the values of the
// annotations listed (AllAnnotations: every one); keys stay, so consumers
// see which entries exist and changed. The input is not modified.
func RedactSecret(obj map[string]any, annotations []string) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		out[k] = v
	}
	for _, f := range secretFields {
		if m, ok := obj[f].(map[string]any); ok {
			r := make(map[string]any, len(m))
			for k := range m {
				r[k] = Redacted
			}
			out[f] = r
		}
	}
	md, _ := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	var ann2 map[string]any
	for k := range ann {
		if !redactedAnnotation(k, annotations) {
			continue
		}
		if ann2 == nil {
			ann2 = make(map[string]any, len(ann))
			for k, v := range ann {
				ann2[k] = v
			}
		}
		ann2[k] = Redacted
	}
	if ann2 != nil {
		md2 := make(map[string]any, len(md))
		for k, v := range md {
			md2[k] = v
		}
		md2["annotations"] = ann2
		out["metadata"] = md2
	}
	return out
}

// DigestPrefix starts every Digest: what a cache holds in place of a Secret
// value is recognisably not the value.
const DigestPrefix = "<digest:"

// digestKey keys Digest. It is drawn once per process and never leaves it:
// digests are compared only within the process (the checkpoint holds no
// data), and without the key a digest that leaked (a heap dump, a bug)
// does not let anyone test guesses of a low-entropy value offline.
var digestKey = func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // never fails: it crashes the program instead
	return k
}()

var digesters = sync.Pool{New: func() any { return hmac.New(sha256.New, digestKey) }}

// Digest returns what informer caches hold in place of a Secret value v: a
// keyed hash (HMAC-SHA256 under a key of this process, truncated to 128
// bits), so that equal values have equal digests and different values
// different ones (changed paths and update detection keep working) while
// the cache holds nothing of the value. Events never carry digests:
// RedactSecret replaces them like any value.
func Digest(v any) string {
	h := digesters.Get().(hash.Hash)
	defer digesters.Put(h)
	h.Reset()
	if s, ok := v.(string); ok { // the apiserver's values: base64 strings
		h.Write([]byte{'s'})
		h.Write([]byte(s))
	} else { // anything else, told apart from strings; %#v prints maps sorted
		h.Write([]byte{'v'})
		fmt.Fprintf(h, "%#v", v)
	}
	var sum [sha256.Size]byte
	enc := base64.RawURLEncoding
	b := make([]byte, 0, len(DigestPrefix)+enc.EncodedLen(16)+1)
	b = append(b, DigestPrefix...)
	b = enc.AppendEncode(b, h.Sum(sum[:0])[:16])
	return string(append(b, '>'))
}

// DigestSecret replaces, in obj itself, every value of data and stringData,
// and the values of the annotations listed (AllAnnotations: every one),
// with their Digest; keys stay. It is for informer caches of Secrets whose
// values no rule delivers: they hold a digest of each value instead of the
// value (often large: Helm release Secrets), and what rules see and send of
// them (RedactSecret) is unchanged. obj must be the caller's own (a freshly
// decoded object, before it is cached).
func DigestSecret(obj map[string]any, annotations []string) {
	for _, f := range secretFields {
		if m, ok := obj[f].(map[string]any); ok {
			for k, v := range m {
				m[k] = digestOnce(v)
			}
		}
	}
	md, _ := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	for k, v := range ann {
		if redactedAnnotation(k, annotations) {
			ann[k] = digestOnce(v)
		}
	}
}

// digestOnce is Digest, except of a digest: a value digested twice would
// differ from one digested once, and changed would fire (or not) wrongly.
// Real values never start with DigestPrefix (data is base64).
func digestOnce(v any) any {
	if s, ok := v.(string); ok && strings.HasPrefix(s, DigestPrefix) {
		return v
	}
	return Digest(v)
}

func redactedAnnotation(key string, annotations []string) bool {
	for _, a := range annotations {
		if a == key || a == AllAnnotations {
			return true
		}
	}
	return false
}

// redactPatch hides the values of operations that touch Secret values.
func redactPatch(p jsondiff.Patch, annotations []string) jsondiff.Patch {
	out := make(jsondiff.Patch, len(p))
	for i, op := range p {
		if secretPath(op.Path, annotations) {
			if op.Value != nil {
				op.Value = redactValue(op.Path, op.Value, annotations)
			}
			op.OldValue = nil
		}
		out[i] = op
	}
	return out
}

func secretPath(path string, annotations []string) bool {
	for _, f := range secretFields {
		if path == "/"+f || strings.HasPrefix(path, "/"+f+"/") {
			return true
		}
	}
	if key, ok := strings.CutPrefix(path, "/metadata/annotations/"); ok {
		return redactedAnnotation(strings.NewReplacer("~1", "/", "~0", "~").Replace(key), annotations)
	}
	return path == "/metadata/annotations" || path == "/metadata"
}

// redactValue redacts a value added at path: a whole data map keeps its keys.
func redactValue(path string, v any, annotations []string) any {
	switch path {
	case "/metadata", "/metadata/annotations":
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		if path == "/metadata" {
			return RedactSecret(map[string]any{"metadata": m}, annotations)["metadata"]
		}
		return RedactSecret(map[string]any{"metadata": map[string]any{"annotations": m}}, annotations)["metadata"].(map[string]any)["annotations"]
	}
	if m, ok := v.(map[string]any); ok {
		r := make(map[string]any, len(m))
		for k := range m {
			r[k] = Redacted
		}
		return r
	}
	return Redacted
}

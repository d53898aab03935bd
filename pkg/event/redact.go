package event

import (
	"strings"

	"github.com/wI2L/jsondiff"
)

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

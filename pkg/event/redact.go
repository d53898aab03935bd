package event

import (
	"strings"

	"github.com/wI2L/jsondiff"
)

// Redacted replaces every Secret value in events.
const Redacted = "<redacted>"

// secretFields hold a Secret's values.
var secretFields = []string{"data", "stringData"}

// RedactSecret returns a shallow copy of a Secret object with every value of
// data and stringData replaced by Redacted; keys stay, so consumers see which
// entries exist and changed. The input is not modified.
func RedactSecret(obj map[string]any) map[string]any {
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
	// kubectl's last-applied annotation holds the whole Secret, values included.
	if md, ok := obj["metadata"].(map[string]any); ok {
		if ann, ok := md["annotations"].(map[string]any); ok {
			if _, has := ann[lastApplied]; has {
				md2 := make(map[string]any, len(md))
				for k, v := range md {
					md2[k] = v
				}
				ann2 := make(map[string]any, len(ann))
				for k, v := range ann {
					ann2[k] = v
				}
				ann2[lastApplied] = Redacted
				md2["annotations"] = ann2
				out["metadata"] = md2
			}
		}
	}
	return out
}

const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// lastAppliedPointer is the JSON pointer of the last-applied annotation.
var lastAppliedPointer = "/metadata/annotations/" + strings.ReplaceAll(lastApplied, "/", "~1")

// redactPatch hides the values of operations that touch Secret values.
func redactPatch(p jsondiff.Patch) jsondiff.Patch {
	out := make(jsondiff.Patch, len(p))
	for i, op := range p {
		if secretPath(op.Path) {
			if op.Value != nil {
				op.Value = redactValue(op.Path, op.Value)
			}
			op.OldValue = nil
		}
		out[i] = op
	}
	return out
}

func secretPath(path string) bool {
	for _, f := range secretFields {
		if path == "/"+f || strings.HasPrefix(path, "/"+f+"/") {
			return true
		}
	}
	return path == lastAppliedPointer || path == "/metadata/annotations" || path == "/metadata"
}

// redactValue redacts a value added at path: a whole data map keeps its keys.
func redactValue(path string, v any) any {
	switch path {
	case "/metadata", "/metadata/annotations":
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		if path == "/metadata" {
			return RedactSecret(map[string]any{"metadata": m})["metadata"]
		}
		return RedactSecret(map[string]any{"metadata": map[string]any{"annotations": m}})["metadata"].(map[string]any)["annotations"]
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

package fieldpath

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Schema is a kind's OpenAPI schema and the document its references point
// into (the apiserver's OpenAPI v3 for the kind's group and version).
type Schema struct {
	root *spec.Schema
	doc  *spec3.OpenAPI
}

// SchemaFor finds the schema of gvk in doc; ok is false when doc does not
// declare it (a CRD without a structural schema, an aggregated API).
func SchemaFor(doc *spec3.OpenAPI, gvk schema.GroupVersionKind) (Schema, bool) {
	if doc == nil || doc.Components == nil {
		return Schema{}, false
	}
	for _, s := range doc.Components.Schemas {
		if s != nil && declares(s, gvk) {
			return Schema{root: s, doc: doc}, true
		}
	}
	return Schema{}, false
}

// declares reads the x-kubernetes-group-version-kind extension.
func declares(s *spec.Schema, gvk schema.GroupVersionKind) bool {
	list, _ := s.Extensions["x-kubernetes-group-version-kind"].([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		if m["group"] == gvk.Group && m["version"] == gvk.Version && m["kind"] == gvk.Kind {
			return true
		}
	}
	return false
}

// maxRefs bounds the references one check follows (a recursive schema,
// such as a CRD's JSONSchemaProps, must not loop).
const maxRefs = 256

// Check reports why p can never select anything in an object of this
// schema: a key that walks into a list (`containers.image`), a field the
// schema does not have, a list step on what is not a list. Where the
// schema cannot tell (no schema, x-kubernetes-preserve-unknown-fields, an
// int-or-string, a free-form object), the path passes.
func (s Schema) Check(p Path) error {
	if s.root == nil {
		return nil
	}
	refs := 0
	cur := s.deref(s.root, &refs)
	for i, seg := range p.segs {
		if cur == nil || open(cur) {
			return nil
		}
		at := Format(p.segs[:i])
		switch seg.Kind {
		case Field:
			switch {
			case cur.Type.Contains("array"):
				rest := Format(p.segs[i:])
				if !strings.HasPrefix(rest, "[") {
					rest = "." + rest
				}
				return fmt.Errorf("%q selects nothing: %s is a list; write %s[*]%s (every element) or %s[name=<name>]%s (one, by its merge key)",
					p.text, at, at, rest, at, rest)
			case cur.Type.Contains("object") || len(cur.Properties) > 0:
				if next, ok := cur.Properties[seg.Key]; ok {
					cur = s.deref(&next, &refs)
					continue
				}
				if ap := cur.AdditionalProperties; ap != nil && (ap.Allows || ap.Schema != nil) {
					if ap.Schema == nil {
						return nil
					}
					cur = s.deref(ap.Schema, &refs)
					continue
				}
				return fmt.Errorf("%q: %s has no field %q", p.text, orRoot(at), seg.Key)
			case len(cur.Type) > 0:
				return fmt.Errorf("%q: %s is %s, it has no field %q", p.text, orRoot(at), a(cur.Type[0]), seg.Key)
			}
			return nil
		case Each:
			switch {
			case cur.Type.Contains("array"):
				cur = s.items(cur, &refs)
			case cur.AdditionalProperties != nil && cur.AdditionalProperties.Schema != nil:
				cur = s.deref(cur.AdditionalProperties.Schema, &refs)
			case len(cur.Type) > 0:
				return fmt.Errorf("%q: %s is %s, not a list or a map: [*] selects nothing", p.text, orRoot(at), a(cur.Type[0]))
			default:
				return nil
			}
		case Match, Index:
			if !cur.Type.Contains("array") {
				if len(cur.Type) > 0 {
					return fmt.Errorf("%q: %s is %s, not a list: %s selects nothing", p.text, orRoot(at), a(cur.Type[0]), Format([]Segment{seg}))
				}
				return nil
			}
			cur = s.items(cur, &refs)
		}
	}
	return nil
}

// a is the type with its article: "an integer", "a string".
func a(typ string) string {
	if typ == "" {
		return "a value"
	}
	if strings.ContainsAny(typ[:1], "aeiou") {
		return "an " + typ
	}
	return "a " + typ
}

func orRoot(at string) string {
	if at == "" {
		return "the object"
	}
	return at
}

// open reports whether a schema lets anything through below it.
func open(s *spec.Schema) bool {
	if v, _ := s.Extensions["x-kubernetes-preserve-unknown-fields"].(bool); v {
		return true
	}
	if v, _ := s.Extensions["x-kubernetes-int-or-string"].(bool); v {
		return true
	}
	return len(s.Type) == 0 && len(s.Properties) == 0 && s.Items == nil && s.AdditionalProperties == nil
}

func (s Schema) items(a *spec.Schema, refs *int) *spec.Schema {
	if a.Items == nil || a.Items.Schema == nil {
		return nil
	}
	return s.deref(a.Items.Schema, refs)
}

// deref follows $ref and the allOf-of-one wrapping the apiserver puts
// around a referenced field that has a default or a description.
func (s Schema) deref(x *spec.Schema, refs *int) *spec.Schema {
	for x != nil {
		if *refs++; *refs > maxRefs {
			return nil
		}
		if ref := x.Ref.String(); ref != "" {
			name, ok := strings.CutPrefix(ref, "#/components/schemas/")
			if !ok || s.doc.Components == nil {
				return nil
			}
			x = s.doc.Components.Schemas[name]
			continue
		}
		if len(x.AllOf) == 1 && len(x.Type) == 0 && len(x.Properties) == 0 {
			x = &x.AllOf[0]
			continue
		}
		return x
	}
	return nil
}

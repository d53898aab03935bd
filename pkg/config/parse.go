package config

import (
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

var (
	builtinVersion = regexp.MustCompile(`^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$`)
	kindName       = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
)

// ParseResource parses a rule's resource: group/version/resource, or
// version/resource for the core group ("v1/configmaps").
func ParseResource(s string) (schema.GroupVersionResource, error) {
	parts := strings.Split(s, "/")
	var gvr schema.GroupVersionResource
	switch len(parts) {
	case 2:
		gvr = schema.GroupVersionResource{Version: parts[0], Resource: parts[1]}
		if !builtinVersion.MatchString(gvr.Version) {
			return gvr, fmt.Errorf("%q is not group/version/resource (e.g. apps/v1/deployments) or core version/resource (e.g. v1/configmaps)", s)
		}
	case 3:
		gvr = schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}
		if msgs := validation.IsDNS1123Subdomain(gvr.Group); len(msgs) > 0 {
			return gvr, fmt.Errorf("group %q in %q: %s", gvr.Group, s, msgs[0])
		}
		if msgs := validation.IsDNS1035Label(gvr.Version); len(msgs) > 0 {
			return gvr, fmt.Errorf("version %q in %q: %s", gvr.Version, s, msgs[0])
		}
	default:
		return gvr, fmt.Errorf("%q is not group/version/resource (e.g. apps/v1/deployments) or core version/resource (e.g. v1/configmaps)", s)
	}
	if msgs := validation.IsDNS1123Label(gvr.Resource); len(msgs) > 0 {
		return gvr, fmt.Errorf("resource %q in %q must be the plural lowercase name (e.g. deployments): %s", gvr.Resource, s, msgs[0])
	}
	return gvr, nil
}

// FormatResource is the inverse of ParseResource.
func FormatResource(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Version + "/" + gvr.Resource
	}
	return gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
}

// IndexKind is what an index key indexes objects by.
type IndexKind string

// The index kinds a rule's index keys may use.
const (
	IndexNamespace  IndexKind = "namespace"
	IndexLabel      IndexKind = "label"
	IndexAnnotation IndexKind = "annotation"
	IndexOwner      IndexKind = "owner"
)

// IndexKey is a parsed rule index key: namespace, label:<key>,
// annotation:<key> or owner:<Kind>.
type IndexKey struct {
	Kind IndexKind
	Arg  string // the label or annotation key, or the owner Kind
}

// String formats k as written in a config; it is also the informer index name.
func (k IndexKey) String() string {
	if k.Kind == IndexNamespace {
		return string(k.Kind)
	}
	return string(k.Kind) + ":" + k.Arg
}

// ParseIndexKey parses a key of a rule's index.
func ParseIndexKey(s string) (IndexKey, error) {
	kind, arg, hasArg := strings.Cut(s, ":")
	k := IndexKey{Kind: IndexKind(kind), Arg: arg}
	switch k.Kind {
	case IndexNamespace:
		if hasArg {
			return k, fmt.Errorf("index key %q: namespace takes no argument", s)
		}
	case IndexLabel, IndexAnnotation:
		if msgs := validation.IsQualifiedName(arg); len(msgs) > 0 {
			return k, fmt.Errorf("index key %q: %s key %q: %s", s, kind, arg, msgs[0])
		}
	case IndexOwner:
		if !kindName.MatchString(arg) {
			return k, fmt.Errorf("index key %q: owner takes a Kind such as owner:ReplicaSet", s)
		}
	default:
		return k, fmt.Errorf("index key %q: want namespace, label:<key>, annotation:<key> or owner:<Kind>", s)
	}
	return k, nil
}

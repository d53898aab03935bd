package config

import (
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// SinkTypes tells the loader which sink types exist (pkg/components lists
// them). A sink's type block, its one key besides the settings every sink
// has, selects the type; the block is decoded strictly into a fresh config
// of that type and checked by that config's Validate methods, so a sink
// type owns its config, defaults and validation.
type SinkTypes interface {
	// NewSinkConfig returns a pointer to a fresh config of type typ with
	// its defaults set, or false when there is no such type.
	NewSinkConfig(typ string) (any, bool)
	// SinkTypeNames lists the types, sorted.
	SinkTypeNames() []string
}

// decodeSink decodes a sink: the common fields into s, the type block into
// the config its type makes.
func (d *decoder) decodeSink(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.errorf(path, n.Line, "expected a mapping, got %s", describeNode(n))
		return
	}
	s := v.Addr().Interface().(*Sink)
	var names []string
	if d.types != nil {
		names = d.types.SinkTypeNames()
	}
	fields := yamlFields(v.Type())
	d.eachPair(n, path, func(key string, keyNode, val *yaml.Node) {
		if i, ok := fields[key]; ok {
			d.decode(val, v.Field(i), JoinKey(path, key))
			return
		}
		var spec any
		ok := false
		if d.types != nil {
			spec, ok = d.types.NewSinkConfig(key)
		}
		switch {
		case !ok:
			known := make(map[string]int, len(fields)+len(names))
			for k, i := range fields {
				known[k] = i
			}
			for _, t := range names {
				known[t] = -1
			}
			d.errorf(JoinKey(path, key), keyNode.Line, "unknown field or sink type%s", suggest(key, known))
		case s.Type != "":
			d.errorf(path, keyNode.Line, "sets %s and %s; a sink has exactly one type (%s)", s.Type, key, strings.Join(names, ", "))
		default:
			s.Type, s.Spec = key, spec
			d.decode(val, reflect.ValueOf(spec).Elem(), JoinKey(path, key))
		}
	})
	if s.Type == "" && !d.failed(path) {
		d.errorf(path, n.Line, "needs a type block, one of: %s", strings.Join(names, ", "))
	}
}

// validateSpec runs the validation walk over a sink's type block.
func validateSpec(s *Sink, path string, out *[]Problem) {
	if s.Spec != nil {
		validateTree(reflect.ValueOf(s.Spec), JoinKey(path, s.Type), out)
	}
}

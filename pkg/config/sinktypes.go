package config

import (
	"fmt"
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
	// Provides reports whether sinks of type typ provide c, so that the
	// config may name them for it (see SinkRef).
	Provides(typ string, c Capability) bool
}

// Capability is what a sink type may provide besides delivering events:
// other parts of the config name one of its sinks for it (SinkRef), and the
// host asks the type's factory for it. Which types provide what is the
// registry's to say (SinkTypes.Provides), not the config's.
type Capability string

const (
	// DeadLetterSink is a dead-letter into the destination of a sink of the
	// type: sinks[].deadLetter.nats names the sink and the subject.
	DeadLetterSink Capability = "dead letters"
	// CheckpointKV is a key-value bucket, in the destination of a sink of
	// the type, that holds the checkpoint: checkpoint.natsKV names the sink
	// and the bucket.
	CheckpointKV Capability = "the checkpoint's key-value bucket"
)

// SinkRef is where the config names a sink for what its type provides
// (Needs) rather than to deliver to it.
type SinkRef struct {
	// Path is the key path of the block that names the sink, e.g.
	// checkpoint.natsKV or sinks[0].deadLetter.nats; its key sink holds
	// the name.
	Path string
	// Sink is the name of the sink.
	Sink string
	// Target is what is asked of the sink's destination: the dead-letter's
	// subject, the checkpoint's bucket.
	Target string
	// Needs is what the sink's type must provide.
	Needs Capability
}

// CheckpointKVPath is the key path of the checkpoint's key-value store.
const CheckpointKVPath = "checkpoint.natsKV"

// SinkRef returns the sink whose destination holds the checkpoint, if it
// is kept there rather than in a file.
func (c *Checkpoint) SinkRef() (SinkRef, bool) {
	if c.NATSKV == nil {
		return SinkRef{}, false
	}
	return SinkRef{Path: CheckpointKVPath, Sink: c.NATSKV.Sink, Target: c.NATSKV.Bucket, Needs: CheckpointKV}, true
}

// SinkRef returns the sink whose destination takes the dead letters, if
// they do not go to a file. Its Path is relative to the dead-letter's.
func (d *DeadLetter) SinkRef() (SinkRef, bool) {
	if d == nil || d.NATS == nil {
		return SinkRef{}, false
	}
	return SinkRef{Path: "nats", Sink: d.NATS.Sink, Target: d.NATS.Subject, Needs: DeadLetterSink}, true
}

// SinkRefs lists the sinks the config names for what their types provide,
// with full paths: the dead-letters in sink order, then the checkpoint.
func (c *Config) SinkRefs() []SinkRef {
	var out []SinkRef
	for i, s := range c.Sinks {
		if ref, ok := s.DeadLetter.SinkRef(); ok {
			ref.Path = fmt.Sprintf("sinks[%d].deadLetter.%s", i, ref.Path)
			out = append(out, ref)
		}
	}
	if ref, ok := c.Checkpoint.SinkRef(); ok {
		out = append(out, ref)
	}
	return out
}

// Providers lists the types of types that provide c, sorted.
func Providers(types SinkTypes, c Capability) []string {
	var out []string
	for _, t := range types.SinkTypeNames() {
		if types.Provides(t, c) {
			out = append(out, t)
		}
	}
	return out
}

// NotProvided says that sink name is of a type that does not provide c,
// naming the types that do: sink "hook" is not a nats sink.
func NotProvided(types SinkTypes, name string, c Capability) string {
	if have := Providers(types, c); len(have) > 0 {
		return fmt.Sprintf("sink %q is not a %s sink", name, strings.Join(have, " or "))
	}
	return fmt.Sprintf("sink %q cannot provide %s: no sink type of this build does", name, c)
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

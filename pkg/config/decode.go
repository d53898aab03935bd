package config

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxNodes bounds the work of decoding one document, so that aliases that
// expand exponentially ("billion laughs") end in an error, not in an OOM.
const maxNodes = 200_000

// Defaulter is implemented by config structs that have defaults. The decoder
// calls SetDefaults when it creates a struct, before it decodes the YAML into
// it, so that what the file sets wins and what it omits keeps the default.
type Defaulter interface{ SetDefaults() }

// scalarParser is implemented by types written as one YAML scalar (Duration).
type scalarParser interface{ parseScalar(string) error }

// shorthand is implemented by mappings that may also be written as one
// scalar, their main field (updateWindow: 30s).
type shorthand interface{ parseShorthand(string) error }

// decoder turns a yaml.Node tree into config structs strictly: unknown keys,
// duplicate keys and wrong types are problems with the key path and line, and
// decoding goes on after each so that every problem is reported at once.
type decoder struct {
	lines    map[string]int // key path -> line, for validation messages
	problems []Problem
	nodes    int
	types    SinkTypes
	failedAt map[string]bool // paths of problems, for failed
}

func newDecoder(types SinkTypes) *decoder {
	return &decoder{lines: map[string]int{}, types: types, failedAt: map[string]bool{}}
}

func (d *decoder) errorf(path string, line int, format string, args ...any) {
	d.problems = append(d.problems, Problem{Path: path, Line: line, Message: fmt.Sprintf(format, args...)})
	if path != "" {
		d.failedAt[path] = true
	}
}

// decode fills v (addressable) from n. path names v in messages.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	d.nodes++
	if d.nodes > maxNodes {
		if d.nodes == maxNodes+1 {
			d.errorf(path, n.Line, "document too large (more than %d nodes after expanding aliases)", maxNodes)
		}
		return
	}
	for n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.errorf(path, n.Line, "unresolved alias")
			return
		}
		n = n.Alias
	}
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = n.Line
	}
	if isNull(n) {
		return // an explicit null keeps the zero value or the default
	}

	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
			if df, ok := v.Interface().(Defaulter); ok {
				df.SetDefaults()
			}
		}
		v = v.Elem()
	}
	if sh, ok := v.Addr().Interface().(shorthand); ok && n.Kind == yaml.ScalarNode {
		if err := sh.parseShorthand(n.Value); err != nil {
			d.errorf(path, n.Line, "%v", err)
		}
		return
	}
	if sp, ok := v.Addr().Interface().(scalarParser); ok {
		if n.Kind != yaml.ScalarNode {
			d.errorf(path, n.Line, "expected %s, got %s", describeType(v.Type()), describeNode(n))
			return
		}
		if err := sp.parseScalar(n.Value); err != nil {
			d.errorf(path, n.Line, "%v", err)
		}
		return
	}

	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[Sink]() {
			d.decodeSink(n, v, path)
			return
		}
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(path, n.Line, "expected %s, got %s", describeType(v.Type()), describeNode(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			e := s.Index(i)
			if df, ok := e.Addr().Interface().(Defaulter); ok {
				df.SetDefaults()
			}
			d.decode(item, e, fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.errorf(path, n.Line, "expected %s, got %s", describeType(v.Type()), describeNode(n))
			return
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		d.eachPair(n, path, func(key string, keyNode, val *yaml.Node) {
			e := reflect.New(v.Type().Elem()).Elem()
			d.decode(val, e, JoinKey(path, key))
			m.SetMapIndex(reflect.ValueOf(key), e)
		})
		v.Set(m)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.errorf(path, n.Line, "expected a string, got %s", describeNode(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Int:
		var i int
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&i) != nil {
			d.errorf(path, n.Line, "expected an integer, got %s", describeNode(n))
			return
		}
		v.SetInt(int64(i))
	case reflect.Float64:
		var f float64
		tag := n.ShortTag()
		if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			d.errorf(path, n.Line, "expected a number, got %s", describeNode(n))
			return
		}
		v.SetFloat(f)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
			d.errorf(path, n.Line, "expected true or false, got %s", describeNode(n))
			return
		}
		v.SetBool(b)
	default:
		d.errorf(path, n.Line, "internal error: no decoder for %s", v.Type()) // a mistake in types.go, caught by tests
	}
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.errorf(path, n.Line, "expected %s, got %s", describeType(v.Type()), describeNode(n))
		return
	}
	fields := yamlFields(v.Type())
	d.eachPair(n, path, func(key string, keyNode, val *yaml.Node) {
		i, ok := fields[key]
		if !ok {
			d.errorf(JoinKey(path, key), keyNode.Line, "unknown field%s", suggest(key, fields))
			return
		}
		d.decode(val, v.Field(i), JoinKey(path, key))
	})
}

// eachPair calls f for each key of a mapping, reporting duplicate, non-scalar
// and merge keys instead.
func (d *decoder) eachPair(n *yaml.Node, path string, f func(key string, keyNode, val *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		for k.Kind == yaml.AliasNode && k.Alias != nil {
			k = k.Alias
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(path, k.Line, "mapping keys must be strings, got %s", describeNode(k))
			continue
		}
		if k.Tag == "!!merge" || k.Value == "<<" {
			d.errorf(path, k.Line, "merge keys (<<) are not supported")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.errorf(JoinKey(path, k.Value), k.Line, "duplicate key (first at line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		d.lines[JoinKey(path, k.Value)] = k.Line
		f(k.Value, k, val)
	}
}

// failed reports whether decoding failed at path or at one of its ancestors,
// so that validation does not pile a second message onto a value it never got.
// It looks up path and each ancestor (a.b[1].c, a.b[1], a.b, a): work in
// the depth of the path, not in the number of problems, so a config with
// many problems is not checked in quadratic time.
func (d *decoder) failed(path string) bool {
	for path != "" {
		if d.failedAt[path] {
			return true
		}
		i := strings.LastIndexAny(path, ".[")
		if i <= 0 {
			return false
		}
		path = path[:i]
	}
	return false
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// yamlFields maps the yaml tag names of t's fields to their indexes.
func yamlFields(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		if name := yamlName(t.Field(i)); name != "" {
			m[name] = i
		}
	}
	return m
}

func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// suggest names the closest known key, or lists them all.
func suggest(key string, fields map[string]int) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	best, bestDist := "", 3
	for _, k := range names {
		if dist := editDistance(strings.ToLower(key), strings.ToLower(k)); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return fmt.Sprintf(" (known: %s)", strings.Join(names, ", "))
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func describeType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[Duration]():
		return "a duration"
	case t.Kind() == reflect.Struct, t.Kind() == reflect.Map:
		return "a mapping"
	case t.Kind() == reflect.Slice:
		return "a list"
	}
	return t.Kind().String()
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		return strconv.Quote(v)
	}
	return "nothing"
}

// JoinKey appends a mapping key to a path: a.b for plain keys, a["b.c/d"] for others.
func JoinKey(path, key string) string {
	if !plainKey(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func plainKey(k string) bool {
	if k == "" {
		return false
	}
	for i, r := range k {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '_':
		case (r >= '0' && r <= '9') || r == '-':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

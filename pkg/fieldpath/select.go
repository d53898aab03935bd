package fieldpath

import (
	"reflect"
	"strconv"
)

// maxValues bounds what one path may select in one object: past it, a
// path compares the subtree where its first list starts as a whole, so a
// hostile object with a million elements costs one DeepEqual, not a map.
const maxValues = 4096

// selected is what a path picked in one object: values by the concrete
// path that reached them (lists' elements named by merge key or position).
type selected map[string]any

// collect walks obj along segs; ok is false when more than maxValues were
// selected.
func collect(obj map[string]any, segs []Segment) (out selected, ok bool) {
	out = selected{}
	at := make([]Segment, 0, len(segs))
	ok = walk(obj, segs, at, out)
	return out, ok
}

func walk(v any, segs []Segment, at []Segment, out selected) bool {
	if len(segs) == 0 {
		if len(out) >= maxValues {
			return false
		}
		out[Format(at)] = v
		return true
	}
	s := segs[0]
	switch s.Kind {
	case Field:
		m, ok := v.(map[string]any)
		if !ok {
			return true
		}
		next, found := m[s.Key]
		if !found {
			return true
		}
		return walk(next, segs[1:], append(at, s), out)
	case Index:
		l, ok := v.([]any)
		n, _ := strconv.Atoi(s.Value)
		if !ok || n >= len(l) {
			return true
		}
		return walk(l[n], segs[1:], append(at, s), out)
	case Match:
		l, ok := v.([]any)
		if !ok {
			return true
		}
		for _, e := range l {
			if m, ok := e.(map[string]any); ok && scalar(m[s.Key]) == s.Value && m[s.Key] != nil {
				if !walk(e, segs[1:], append(at, s), out) {
					return false
				}
			}
		}
		return true
	case Each:
		switch c := v.(type) {
		case []any:
			label := labels(c)
			for i, e := range c {
				if !walk(e, segs[1:], append(at, label(i)), out) {
					return false
				}
			}
		case map[string]any:
			for k, e := range c {
				if !walk(e, segs[1:], append(at, Segment{Kind: Field, Key: k}), out) {
					return false
				}
			}
		}
	}
	return true
}

// mergeKeys are the fields Kubernetes keys its lists by, most common
// first: a list whose elements all have a distinct one is keyed by it.
var mergeKeys = []string{"name", "type"}

// labels names a list's elements: by the first merge key all of them hold
// distinct, else by position.
func labels(l []any) func(i int) Segment {
	for _, k := range mergeKeys {
		seen := make(map[string]bool, len(l))
		for _, e := range l {
			m, ok := e.(map[string]any)
			if !ok {
				break
			}
			s, ok := m[k].(string)
			if !ok || seen[s] {
				break
			}
			seen[s] = true
		}
		if len(seen) == len(l) {
			return func(i int) Segment {
				return Segment{Kind: Match, Key: k, Value: l[i].(map[string]any)[k].(string)}
			}
		}
	}
	return func(i int) Segment { return Segment{Kind: Index, Value: strconv.Itoa(i)} }
}

// scalar is how a Match value compares with an element's field.
func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return ""
}

// Changed reports whether any value p selects differs between old and obj:
// one appears, disappears or changes. A path that selects nothing in both
// has not changed.
func (p Path) Changed(old, obj map[string]any) bool {
	if p.fields {
		a, foundA := p.lookup(old)
		b, foundB := p.lookup(obj)
		return foundA != foundB || !reflect.DeepEqual(a, b)
	}
	a, okA := collect(old, p.segs)
	b, okB := collect(obj, p.segs)
	if !okA || !okB {
		return !reflect.DeepEqual(p.head(old), p.head(obj))
	}
	if len(a) != len(b) {
		return true
	}
	for k, va := range a {
		vb, found := b[k]
		if !found || !reflect.DeepEqual(va, vb) {
			return true
		}
	}
	return false
}

// lookup is the value at a path of keys only.
func (p Path) lookup(obj map[string]any) (any, bool) {
	var v any = obj
	for _, s := range p.segs {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[s.Key]; !ok {
			return nil, false
		}
	}
	return v, true
}

// head is the subtree at the path's keys up to its first list.
func (p Path) head(obj map[string]any) any {
	var v any = obj
	for _, s := range p.segs {
		if s.Kind != Field {
			return v
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[s.Key]
	}
	return v
}

// Change is one value a path selects that differs between two objects.
type Change struct {
	// Path is the concrete path to it: lists' elements named by merge key
	// (containers[name=web].image) or position.
	Path string
	// Old and New are the values; HadOld and HasNew say whether there was
	// one (a field added or removed).
	Old, New       any
	HadOld, HasNew bool
}

package fieldpath

import (
	"reflect"
	"sort"
)

// MaxDiffDepth bounds how deep Leaves names a change: below it a subtree
// that differs is one change (an object with preserve-unknown-fields can
// nest as deep as its writer likes).
const MaxDiffDepth = 32

// pruneDepth is how deep an equal subtree is skipped with one DeepEqual:
// below it the walk compares as it goes, so the cost stays linear in the
// object's size whatever its depth.
const pruneDepth = 8

// Leaves appends to out what differs between old and obj below at, leaf
// by leaf: maps by key, lists by merge key (name, else type, else
// position), and values that are not both maps or both lists as a whole.
// It stops at max changes and returns how many more it found.
func Leaves(old, obj any, at []Segment, out []Change, max int) ([]Change, int) {
	return leaves(old, obj, old != nil, obj != nil, at, out, max)
}

func leaves(old, obj any, hadOld, hasNew bool, at []Segment, out []Change, max int) ([]Change, int) {
	more := 0
	var walk func(a, b any, hadA, hasB bool, at []Segment, depth int)
	walk = func(a, b any, hadA, hasB bool, at []Segment, depth int) {
		if depth < pruneDepth && hadA == hasB && reflect.DeepEqual(a, b) {
			return
		}
		if depth < MaxDiffDepth {
			ma, aMap := a.(map[string]any)
			mb, bMap := b.(map[string]any)
			// A map added or removed whole is told key by key.
			if !hadA && bMap && len(mb) > 0 {
				ma, aMap = map[string]any{}, true
			}
			if !hasB && aMap && len(ma) > 0 {
				mb, bMap = map[string]any{}, true
			}
			if aMap && bMap {
				for _, k := range unionKeys(ma, mb) {
					va, okA := ma[k]
					vb, okB := mb[k]
					walk(va, vb, okA, okB, append(at, Segment{Kind: Field, Key: k}), depth+1)
				}
				return
			}
			la, aList := a.([]any)
			lb, bList := b.([]any)
			if aList && bList {
				ea, eb := elements(la), elements(lb)
				if ea.keyed == eb.keyed || len(la) == 0 || len(lb) == 0 {
					for _, k := range unionLabels(ea, eb) {
						va, okA := ea.by[k]
						vb, okB := eb.by[k]
						walk(va, vb, okA, okB, append(at, ea.seg(k, eb)), depth+1)
					}
					return
				}
				// Keyed differently (a name became duplicate): labels mean
				// nothing across, the list changed as a whole.
			}
		}
		if hadA == hasB && reflect.DeepEqual(a, b) {
			return
		}
		leaf(a, b, hadA, hasB, at, &out, max, &more)
	}
	walk(old, obj, hadOld, hasNew, at, len(at))
	return out, more
}

// leaf records one change, or counts it past max.
func leaf(a, b any, hadA, hasB bool, at []Segment, out *[]Change, max int, more *int) {
	if len(*out) >= max {
		*more++
		return
	}
	*out = append(*out, Change{Path: Format(at), Old: a, New: b, HadOld: hadA, HasNew: hasB})
}

func unionKeys(a, b map[string]any) []string {
	keys := make([]string, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// labelled is a list's elements by label: their merge key's value, or
// their position.
type labelled struct {
	keyed string // the merge key, "" for positions
	by    map[string]any
	order []string
}

func elements(l []any) labelled {
	label := labels(l)
	out := labelled{by: make(map[string]any, len(l))}
	for i, e := range l {
		s := label(i)
		if s.Kind == Match {
			out.keyed = s.Key
		}
		out.by[s.Value] = e
		out.order = append(out.order, s.Value)
	}
	return out
}

func (l labelled) seg(v string, other labelled) Segment {
	keyed := l.keyed
	if keyed == "" {
		keyed = other.keyed
	}
	if keyed == "" {
		return Segment{Kind: Index, Value: v}
	}
	return Segment{Kind: Match, Key: keyed, Value: v}
}

// unionLabels is a's labels in a's order, then b's new ones in b's.
func unionLabels(a, b labelled) []string {
	out := append([]string(nil), a.order...)
	for _, k := range b.order {
		if _, ok := a.by[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// Changes is what differs, leaf by leaf, in what p selects in old and
// obj (Leaves under each value p selects), at most max of them, and how
// many more.
func (p Path) Changes(old, obj map[string]any, max int) ([]Change, int) {
	a, okA := collect(old, p.segs)
	b, okB := collect(obj, p.segs)
	if !okA || !okB {
		var head []Segment
		for _, s := range p.segs {
			if s.Kind != Field {
				break
			}
			head = append(head, s)
		}
		return Leaves(p.head(old), p.head(obj), head, nil, max)
	}
	var out []Change
	more := 0
	for _, k := range unionKeys(a, b) {
		at, err := Parse(k) // k was formatted by Format
		if err != nil {     // an empty map key: kept whole
			at = Path{segs: []Segment{{Kind: Field, Key: k}}}
		}
		var m int
		out, m = leaves(a[k], b[k], hasKey(a, k), hasKey(b, k), at.segs, out, max)
		more += m
	}
	return out, more
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

// Package fieldpath is the path syntax a rule's `changed` names fields with,
// and what the bridge reads through it: the values a path selects in an
// object, whether they differ between two objects, and what changed.
//
// A path is dot-separated keys; a key with dots or slashes is written in
// brackets and quotes; a list is entered with [*] (every element) or
// [field=value] (the element whose field has that value, the way
// Kubernetes merges lists keyed by name) or [n] (the element at position n):
//
//	spec.replicas
//	metadata.annotations["app.kubernetes.io/version"]
//	spec.template.spec.containers[*].image
//	spec.template.spec.containers[name=web].image
//	status.conditions[type=Ready].status
//
// A key never walks into a list: `containers.image` selects nothing,
// whatever the object holds, so the bridge refuses it where it can see the
// schema (Check). Elements selected with [*] are told apart by their merge
// key (name, else type, else their position), so reordering a keyed list
// changes nothing and a change names the element it is in.
package fieldpath

import (
	"fmt"
	"strconv"
	"strings"
)

// Bounds on what a config may write: a path is short, and it enters few
// lists (each [*] multiplies what a hostile object can make it read).
const (
	MaxSegments = 32
	MaxLists    = 4
	maxLen      = 1024
)

// Kind is what a segment selects.
type Kind uint8

const (
	// Field is a map key.
	Field Kind = iota
	// Each is [*]: every element of a list (or every value of a map).
	Each
	// Match is [field=value]: the list elements whose field equals value.
	Match
	// Index is [n]: the list element at position n (Value holds n).
	Index
)

// Segment is one step of a Path.
type Segment struct {
	Kind Kind
	// Key is the map key (Field) or the element's field (Match).
	Key string
	// Value is what Match compares the element's field with.
	Value string
}

// Path is a parsed path.
type Path struct {
	segs   []Segment
	text   string
	fields bool // keys only: no list step
}

// Segments returns the path's steps.
func (p Path) Segments() []Segment { return p.segs }

// String returns the path as it was written.
func (p Path) String() string { return p.text }

// Parse parses a path. Its errors say what to write instead.
func Parse(s string) (Path, error) {
	if s == "" {
		return Path{}, fmt.Errorf("empty path")
	}
	if len(s) > maxLen {
		return Path{}, fmt.Errorf("path of %d bytes: at most %d", len(s), maxLen)
	}
	p := Path{text: s}
	lists := 0
	rest := s
	for {
		if len(p.segs) == MaxSegments {
			return Path{}, fmt.Errorf("path %q: more than %d keys", s, MaxSegments)
		}
		var seg Segment
		var err error
		if strings.HasPrefix(rest, "[") {
			if len(p.segs) == 0 && !strings.HasPrefix(rest, `["`) {
				return Path{}, fmt.Errorf("path %q: starts with a list: name the field first", s)
			}
			seg, rest, err = bracket(s, rest)
			if err != nil {
				return Path{}, err
			}
			if seg.Kind != Field {
				if lists++; lists > MaxLists {
					return Path{}, fmt.Errorf("path %q: enters more than %d lists", s, MaxLists)
				}
			}
		} else {
			i := strings.IndexAny(rest, ".[")
			if i < 0 {
				i = len(rest)
			}
			key := rest[:i]
			if key == "" {
				return Path{}, fmt.Errorf("path %q: empty key", s)
			}
			if r, ok := badRune(key); ok {
				return Path{}, fmt.Errorf("path %q: key %q has %q; write it as [%q]", s, key, r, key)
			}
			seg, rest = Segment{Kind: Field, Key: key}, rest[i:]
		}
		p.segs = append(p.segs, seg)
		switch {
		case rest == "":
			p.fields = lists == 0
			return p, nil
		case strings.HasPrefix(rest, "."):
			rest = rest[1:]
			if rest == "" || strings.HasPrefix(rest, "[") || strings.HasPrefix(rest, ".") {
				return Path{}, fmt.Errorf("path %q: empty key", s)
			}
		case strings.HasPrefix(rest, "["):
		default:
			return Path{}, fmt.Errorf("path %q: want . or [ after a key", s)
		}
	}
}

// bracket parses one [...] at the start of rest: ["key"], [*] or
// [field=value] (value plain or quoted).
func bracket(s, rest string) (Segment, string, error) {
	if strings.HasPrefix(rest, `["`) {
		// A quoted key may hold ] itself: find the closing quote first.
		q, err := strconv.QuotedPrefix(rest[1:])
		if err != nil || !strings.HasPrefix(rest[1+len(q):], "]") {
			return Segment{}, "", fmt.Errorf("path %q: want [\"key\"] with the key quoted, at %s", s, clip(rest))
		}
		key, _ := strconv.Unquote(q)
		if key == "" {
			return Segment{}, "", fmt.Errorf("path %q: empty key in [\"\"]", s)
		}
		return Segment{Kind: Field, Key: key}, rest[1+len(q)+1:], nil
	}
	if strings.HasPrefix(rest, "[*]") {
		return Segment{Kind: Each}, rest[3:], nil
	}
	if end := strings.IndexByte(rest, ']'); end > 1 && strings.Trim(rest[1:end], "0123456789") == "" {
		n := rest[1:end]
		if len(n) > 9 || (len(n) > 1 && n[0] == '0') {
			return Segment{}, "", fmt.Errorf("path %q: %s: not a position", s, rest[:end+1])
		}
		return Segment{Kind: Index, Value: n}, rest[end+1:], nil
	}
	eq := strings.IndexByte(rest, '=')
	end := strings.IndexByte(rest, ']')
	if end < 0 {
		return Segment{}, "", fmt.Errorf("path %q: unclosed [", s)
	}
	if eq < 0 || eq > end {
		return Segment{}, "", fmt.Errorf("path %q: %s: want [*], [field=value] or [\"key\"]", s, rest[:end+1])
	}
	field := rest[1:eq]
	if field == "" {
		return Segment{}, "", fmt.Errorf("path %q: %s: empty field before =", s, rest[:end+1])
	}
	if r, ok := badRune(field); ok {
		return Segment{}, "", fmt.Errorf("path %q: %s: field %q has %q", s, rest[:end+1], field, r)
	}
	after := rest[eq+1:]
	if strings.HasPrefix(after, `"`) {
		q, err := strconv.QuotedPrefix(after)
		if err != nil || !strings.HasPrefix(after[len(q):], "]") {
			return Segment{}, "", fmt.Errorf("path %q: want [%s=\"value\"], at %s", s, field, clip(rest))
		}
		v, _ := strconv.Unquote(q)
		return Segment{Kind: Match, Key: field, Value: v}, after[len(q)+1:], nil
	}
	v := rest[eq+1 : end]
	if v == "" {
		return Segment{}, "", fmt.Errorf("path %q: %s: empty value (write [%s=\"\"] to match an empty one)", s, rest[:end+1], field)
	}
	if strings.ContainsAny(v, `"[`) {
		return Segment{}, "", fmt.Errorf("path %q: %s: quote the value: [%s=%q]", s, rest[:end+1], field, v)
	}
	return Segment{Kind: Match, Key: field, Value: v}, rest[end+1:], nil
}

func badRune(key string) (rune, bool) {
	for _, r := range key {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return r, true
		}
	}
	return 0, false
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// plain reports whether s needs no quoting as a key or a Match value.
func plain(s string) bool {
	_, bad := badRune(s)
	return s != "" && !bad
}

// Format writes segments as a path that Parse reads back.
func Format(segs []Segment) string {
	var b strings.Builder
	for i, s := range segs {
		switch s.Kind {
		case Field:
			if plain(s.Key) {
				if i > 0 {
					b.WriteByte('.')
				}
				b.WriteString(s.Key)
			} else {
				b.WriteString("[" + strconv.Quote(s.Key) + "]")
			}
		case Each:
			b.WriteString("[*]")
		case Match:
			v := s.Value
			if !plain(v) {
				v = strconv.Quote(v)
			}
			b.WriteString("[" + s.Key + "=" + v + "]")
		case Index:
			b.WriteString("[" + s.Value + "]")
		}
	}
	return b.String()
}

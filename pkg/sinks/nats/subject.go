package nats

import (
	"strings"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// Token maps a value to a NATS subject token, reversibly (see Untoken):
// the characters that are special in subjects ('.', '*', '>'), every
// control character, space and DEL (bytes below 0x21 and 0x7f: a name
// with a newline must not split a protocol line or a subject), and '%'
// itself become %XX (their hex byte value, as in URLs); an empty value
// becomes "_" (and a value "_" becomes %5F). So the group example.io is
// the token example%2Eio, and a consumer subscribes with
// k8s.*.example%2Eio.widgets.>.
func Token(v string) string {
	if v != "" && v != "_" && !needsEscape(v) {
		return v
	}
	return string(appendToken(nil, v))
}

// appendToken appends Token(v) to b.
func appendToken(b []byte, v string) []byte {
	switch v {
	case "":
		return append(b, '_')
	case "_": // a real name (RBAC objects take it): not the empty value
		return append(b, "%5F"...)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !escaped(c) {
			b = append(b, c)
			continue
		}
		const hex = "0123456789ABCDEF"
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return b
}

func needsEscape(v string) bool {
	for i := 0; i < len(v); i++ {
		if escaped(v[i]) {
			return true
		}
	}
	return false
}

// escaped says whether Token writes c as %XX.
func escaped(c byte) bool {
	return c < 0x21 || c == 0x7f || c == '.' || c == '*' || c == '>' || c == '%'
}

// Untoken reverses Token.
func Untoken(tok string) string {
	if tok == "_" {
		return ""
	}
	if !strings.Contains(tok, "%") {
		return tok
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] == '%' && i+2 < len(tok) {
			if h, ok1 := unhex(tok[i+1]); ok1 {
				if l, ok2 := unhex(tok[i+2]); ok2 {
					b.WriteByte(h<<4 | l)
					i += 2
					continue
				}
			}
		}
		b.WriteByte(tok[i])
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// subjectTemplate is a parsed subject template: literal text and placeholders.
type subjectTemplate struct {
	parts []part
}

type part struct {
	literal     string
	placeholder string
}

func parseTemplate(tmpl string) (subjectTemplate, error) {
	if err := ParseSubject(tmpl); err != nil {
		return subjectTemplate{}, err
	}
	var t subjectTemplate
	rest := tmpl
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			t.parts = append(t.parts, part{literal: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, part{literal: rest[:open]})
		}
		end := strings.IndexByte(rest, '}')
		t.parts = append(t.parts, part{placeholder: rest[open+1 : end]})
		rest = rest[end+1:]
	}
	return t, nil
}

// appendTo appends the subject of an event to b; each placeholder becomes
// one token.
func (t subjectTemplate) appendTo(b []byte, e *event.Event) []byte {
	for _, p := range t.parts {
		if p.placeholder == "" {
			b = append(b, p.literal...)
			continue
		}
		b = appendToken(b, placeholderValue(p.placeholder, e))
	}
	return b
}

// appendFilterTo appends the filter that matches every subject of e's
// object: the tokens that vary per event ({type}, {rule}) become "*".
func (t subjectTemplate) appendFilterTo(b []byte, e *event.Event) []byte {
	for _, p := range t.parts {
		switch p.placeholder {
		case "":
			b = append(b, p.literal...)
		case "type", "rule":
			b = append(b, '*')
		default:
			b = appendToken(b, placeholderValue(p.placeholder, e))
		}
	}
	return b
}

// fenceable says whether the stream can fence the template's objects
// (fence.go): it has {name}, so an object's subjects are its own, and the
// tokens that vary per event ({type}, {rule}) are whole tokens, which the
// filter of an object's subjects turns into "*" (NATS reads "*" as a
// wildcard only as a whole token: "x-*" would match no subject).
func (t subjectTemplate) fenceable() bool {
	named := false
	for i, p := range t.parts {
		switch p.placeholder {
		case "name":
			named = true
		case "type", "rule":
			before := i == 0 || (t.parts[i-1].placeholder == "" && strings.HasSuffix(t.parts[i-1].literal, "."))
			after := i == len(t.parts)-1 || (t.parts[i+1].placeholder == "" && strings.HasPrefix(t.parts[i+1].literal, "."))
			if !before || !after {
				return false
			}
		}
	}
	return named
}

func placeholderValue(name string, e *event.Event) string {
	switch name {
	case "cluster":
		return e.Cluster()
	case "group":
		if e.GVR().Group == "" {
			return "core"
		}
		return e.GVR().Group
	case "version":
		return e.GVR().Version
	case "resource":
		return e.GVR().Resource
	case "kind":
		return e.Kind()
	case "namespace":
		return e.Namespace() // cluster-scoped: "" -> "_"
	case "name":
		return e.Name()
	case "type":
		return string(e.Change)
	case "rule":
		return e.Rule()
	}
	return ""
}

// StreamSubjects is the default capture of a stream for a template: the
// literal tokens before the first placeholder, then ">".
func StreamSubjects(tmpl string) []string {
	toks := strings.Split(tmpl, ".")
	var lit []string
	for _, t := range toks {
		if strings.Contains(t, "{") {
			break
		}
		lit = append(lit, t)
	}
	if len(lit) == len(toks) {
		return []string{tmpl}
	}
	return []string{strings.Join(append(lit, ">"), ".")}
}

package kafka

import (
	"fmt"
	"sort"
	"strings"
)

// topicPlaceholders are what a change topic template may contain: values
// of the rule (and the cluster), never of an object, so that a rule's
// changes go to one topic and Kafka keeps their order per uid.
var topicPlaceholders = map[string]bool{"cluster": true, "rule": true, "group": true, "version": true, "resource": true}

// statePlaceholders are what a state topic template may contain: Held is
// asked by rule name alone, before any event names the cluster.
var statePlaceholders = map[string]bool{"rule": true}

// values are what placeholders stand for.
type values struct {
	cluster, rule, group, version, resource string
}

func (v values) get(name string) string {
	switch name {
	case "cluster":
		return v.cluster
	case "rule":
		return v.rule
	case "group":
		return v.group
	case "version":
		return v.version
	case "resource":
		return v.resource
	}
	return ""
}

// template is a parsed topic template: literal text and placeholders.
type template struct {
	parts []part
}

type part struct {
	lit         string
	placeholder string // "" for literal text
}

func (t template) has(name string) bool {
	for _, p := range t.parts {
		if p.placeholder == name {
			return true
		}
	}
	return false
}

func (t template) render(v values) string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.placeholder != "" {
			b.WriteString(v.get(p.placeholder))
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}

// maxTemplateLen bounds a template (a topic is at most 249 characters).
const maxTemplateLen = 1024

// parseTemplate parses a topic template: literal characters legal in a
// topic name and {placeholder}s among allowed.
func parseTemplate(tmpl string, allowed map[string]bool) (template, error) {
	var t template
	if tmpl == "" {
		return t, fmt.Errorf("empty topic")
	}
	if len(tmpl) > maxTemplateLen {
		return t, fmt.Errorf("%d characters, more than %d", len(tmpl), maxTemplateLen)
	}
	rest := tmpl
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		lit := rest
		if open >= 0 {
			lit = rest[:open]
		}
		for i := 0; i < len(lit); i++ {
			if !legal(lit[i]) {
				return t, fmt.Errorf("%q has %q; a topic name is letters, digits, '.', '_' and '-' (and {placeholders})", tmpl, lit[i])
			}
		}
		if lit != "" {
			t.parts = append(t.parts, part{lit: lit})
		}
		if open < 0 {
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return t, fmt.Errorf("%q: unclosed {", tmpl)
		}
		name := rest[open+1 : open+end]
		if !allowed[name] {
			return t, fmt.Errorf("%q: unknown placeholder {%s} (have: %s)", tmpl, name, list(allowed))
		}
		t.parts = append(t.parts, part{placeholder: name})
		rest = rest[open+end+1:]
	}
	return t, nil
}

func list(allowed map[string]bool) string {
	var names []string
	for n := range allowed {
		names = append(names, "{"+n+"}")
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

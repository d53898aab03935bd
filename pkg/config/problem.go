package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Problem is one thing wrong with (or, for a warning, doubtful in) a config.
type Problem struct {
	// Path is the key path, e.g. rules[1].sinks[0]; empty for the whole document.
	Path string
	// Line is the 1-based line of Path in the YAML, or 0 when unknown.
	Line int
	// Message says what is wrong and, where it helps, what was found.
	Message string
	// Warning marks a problem that does not stop the config from loading.
	Warning bool
}

// Format renders p as "file:line: path: message", leaving out what is unknown.
func (p Problem) Format(file string) string {
	var b strings.Builder
	b.WriteString(file)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	b.WriteString(": ")
	if p.Warning {
		b.WriteString("warning: ")
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Error is returned when a config cannot be used. It carries every problem
// found, errors only, in file order.
type Error struct {
	File     string
	Problems []Problem
	More     int // errors found beyond Problems, not listed (a load reports a bounded number)
}

// Count is how many errors were found.
func (e *Error) Count() int { return len(e.Problems) + e.More }

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems), len(e.Problems)+1)
	for i, p := range e.Problems {
		lines[i] = p.Format(e.File)
	}
	if e.More > 0 {
		lines = append(lines, fmt.Sprintf("%s: ... and %d more errors", e.File, e.More))
	}
	return strings.Join(lines, "\n")
}

// fieldError is an error at a path relative to the struct whose Validate
// returned it; the validation walk prefixes the struct's own path.
type fieldError struct {
	path    string
	msg     string
	warning bool
}

func (e *fieldError) Error() string { return e.path + ": " + e.msg }

// ErrorAt returns a validation error for the field at path (relative).
func ErrorAt(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

// WarningAt is ErrorAt for a doubtful setting that does not stop loading.
func WarningAt(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...), warning: true}
}

// validator is implemented by every config struct that checks itself. The
// walk calls it on each struct it reaches, so a struct only checks its own
// fields and cross-field rules; nested structs are checked by their own
// Validate (the otel-collector confmap pattern).
type validator interface{ Validate() error }

// validateTree walks v and collects the problems of every validator in it.
func validateTree(v reflect.Value, path string, out *[]Problem) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if v.CanAddr() {
		if val, ok := v.Addr().Interface().(validator); ok {
			for _, err := range flatten(val.Validate()) {
				*out = append(*out, toProblem(path, err))
			}
		}
	}
	switch v.Kind() {
	case reflect.Struct:
		if s, ok := v.Addr().Interface().(*Sink); ok {
			validateSpec(s, path, out)
		}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			if name := yamlName(t.Field(i)); name != "" {
				validateTree(v.Field(i), JoinKey(path, name), out)
			}
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			validateTree(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}

func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

func toProblem(prefix string, err error) Problem {
	var fe *fieldError
	if errors.As(err, &fe) {
		return Problem{Path: joinPath(prefix, fe.path), Message: fe.msg, Warning: fe.warning}
	}
	return Problem{Path: prefix, Message: err.Error()}
}

// joinPath joins a prefix and a relative path that may start with a key or an index.
func joinPath(prefix, rel string) string {
	switch {
	case rel == "":
		return prefix
	case prefix == "", strings.HasPrefix(rel, "["):
		return prefix + rel
	}
	return prefix + "." + rel
}

// lineOf finds the line of path, or of its closest ancestor present in the file.
func lineOf(lines map[string]int, path string) int {
	for {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i <= 0 {
			return lines[""]
		}
		path = path[:i]
	}
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Line < ps[j].Line })
}

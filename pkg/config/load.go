// Package config holds the kubebridge config (apiVersion kubebridge.io/v1alpha1):
// its types, defaults, strict decoding and validation.
//
// Loading is all-or-nothing: Load and Parse return a usable *Config only when
// it has no errors, and otherwise an *Error with every problem found (not just
// the first), each naming its key path and line:
//
//	config.yaml:14: rules[1].sinks[0]: unknown sink "bsu" (have: bus, archive)
//
// Defaults are applied before decoding, so what the file sets wins; unknown
// keys, duplicate keys and wrong types are errors; each struct's Validate is
// called by a walk over the whole tree; cross-references (rules to sinks, the
// checkpoint to its sink) are checked last. Warnings do not stop loading.
package config

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxFileSize bounds a config file; real configs are a few KiB.
const maxFileSize = 4 << 20

// maxProblems bounds what one load reports: the first ones in file order
// and how many more there are.
const maxProblems = 200

// Load reads and parses the config file at path. See Parse.
func Load(path string, types SinkTypes) (*Config, []Problem, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, &Error{File: path, Problems: []Problem{{Message: fmt.Sprintf("cannot read config: %v", unwrapPathError(err))}}}
	}
	cfg, warnings, err := Parse(path, data, types)
	if cfg != nil {
		cfg.file = path
	}
	return cfg, warnings, err
}

// File is the path the config was loaded from (Load), "" when parsed
// from memory: no output file may be it (ConfineOutputFiles).
func (c *Config) File() string { return c.file }

func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// Parse decodes, defaults and validates a config document. name is the file
// name used in messages; types are the sink types a sink may use. It
// returns the config and its warnings, or, when anything is wrong, a nil
// config and an *Error listing every problem.
func Parse(name string, data []byte, types SinkTypes) (*Config, []Problem, error) {
	fail := func(ps ...Problem) (*Config, []Problem, error) {
		return nil, nil, &Error{File: name, Problems: ps}
	}
	if len(data) > maxFileSize {
		return fail(Problem{Message: fmt.Sprintf("config is %d bytes, more than the limit of %d", len(data), maxFileSize)})
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err == io.EOF {
		return fail(Problem{Message: "empty config"})
	} else if err != nil {
		return fail(syntaxProblem(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return fail(Problem{Line: extra.Line, Message: "more than one YAML document; a config file holds exactly one"})
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || isNull(doc.Content[0]) {
		return fail(Problem{Message: "empty config"})
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fail(Problem{Line: root.Line, Message: fmt.Sprintf("expected a mapping (apiVersion, kind, cluster, sinks, rules), got %s", describeNode(root))})
	}

	d := newDecoder(types)
	d.lines[""] = root.Line
	cfg := &Config{}
	cfg.SetDefaults()
	d.decode(root, reflect.ValueOf(cfg).Elem(), "")
	cfg.applyLateDefaults()

	problems := d.problems
	var checked []Problem
	validateTree(reflect.ValueOf(cfg), "", &checked)
	for _, err := range flatten(cfg.validateProviders(types)) {
		checked = append(checked, toProblem("", err))
	}
	for _, p := range checked {
		if d.failed(p.Path) {
			continue // already reported: the value there could not be decoded
		}
		p.Line = lineOf(d.lines, p.Path)
		problems = append(problems, p)
	}
	sortProblems(problems)

	var errs, warnings []Problem
	for _, p := range problems {
		if p.Warning {
			warnings = append(warnings, p)
		} else {
			errs = append(errs, p)
		}
	}
	if len(warnings) > maxProblems {
		warnings = append(warnings[:maxProblems], Problem{Message: fmt.Sprintf("... and %d more warnings", len(warnings)-maxProblems), Warning: true})
	}
	if len(errs) > 0 {
		e := &Error{File: name, Problems: errs}
		if len(errs) > maxProblems {
			e.Problems, e.More = errs[:maxProblems], len(errs)-maxProblems
		}
		return nil, warnings, e
	}
	cfg.lines = d.lines
	return cfg, warnings, nil
}

// syntaxProblem turns a YAML parser error ("yaml: line 3: did not find
// expected key") into a Problem with its line.
func syntaxProblem(err error) Problem {
	msg, _ := strings.CutPrefix(err.Error(), "yaml: ")
	var line int
	if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil {
		_, msg, _ = strings.Cut(msg, ": ")
	}
	return Problem{Line: line, Message: "invalid YAML: " + msg}
}

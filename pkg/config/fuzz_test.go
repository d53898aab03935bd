package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	. "github.com/kubebridge/kubebridge/pkg/config"
)

// FuzzParse feeds the loader arbitrary documents, seeded with the examples
// and broken variants. No input may panic; an accepted config must be one
// the validation walk finds nothing wrong with, and a rejected one must say
// what is wrong.
func FuzzParse(f *testing.F) {
	examples, _ := filepath.Glob("../../config/*.yaml")
	for _, path := range examples {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
		f.Add([]byte(strings.ReplaceAll(string(data), "  ", " ")))
	}
	for _, s := range []string{
		base, "", "---", "[", "{a: b", "a: &x [*x]", "- - - -", "sinks: [{name: a, file: {path: -}}]",
		"rules: [{where: 'object.spec.replicas >'}]", "rules: [{resource: 'a/b/c/d'}]", "\t", "cluster: !!binary aGk=",
		"sinks: {a: b}", "rules: [{index: {'label:': []}}]", "rules: [{changed: ['[\"']}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, warnings, err := Parse("f.yaml", data, types)
		if err != nil {
			var cerr *Error
			if !errors.As(err, &cerr) || len(cerr.Problems) == 0 {
				t.Fatalf("error without problems: %T %v", err, err)
			}
			for _, p := range cerr.Problems {
				if p.Message == "" || p.Warning {
					t.Fatalf("bad problem %+v", p)
				}
			}
			if cfg != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		for _, w := range warnings {
			if !w.Warning {
				t.Fatalf("warning not marked: %+v", w)
			}
		}
		var again []Problem
		ValidateTree(reflect.ValueOf(cfg), "", &again)
		for _, p := range again {
			if !p.Warning {
				t.Fatalf("accepted config fails validation: %+v", p)
			}
		}
	})
}

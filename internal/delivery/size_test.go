package delivery

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxFields bounds the fields of a struct in the core's packages: a type
// that needs more holds more than one concern, and is split instead.
const maxFields = 16

// No struct in the core (the queue, the view, the delivery engine, the
// checkpoint) has more than maxFields fields; a, b T counts two.
func TestCoreStructsStaySmall(t *testing.T) {
	fset := token.NewFileSet()
	for _, dir := range []string{".", "../queue", "../view", "../checkpoint"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				st, ok := n.(*ast.StructType)
				if !ok {
					return true
				}
				fields := 0
				for _, f := range st.Fields.List {
					fields += max(len(f.Names), 1) // an embedded field counts one
				}
				if fields > maxFields {
					t.Errorf("%s: a struct of %d fields (at most %d: split it by concern)", fset.Position(st.Pos()), fields, maxFields)
				}
				return true
			})
		}
	}
}

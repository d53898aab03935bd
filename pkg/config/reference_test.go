package config

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the config reference in README.md")

const (
	refBegin = "<!-- config-reference:begin (generated from pkg/config by `make docs`; do not edit) -->"
	refEnd   = "<!-- config-reference:end -->"
)

// The config reference in README.md is generated from the types, their doc
// comments and their defaults, so it cannot drift: this test fails when the
// README differs from what the code says (`make docs` rewrites it).
func TestConfigReference(t *testing.T) {
	docs := fieldDocs(t)
	var b strings.Builder
	b.WriteString(refBegin + "\n\n| key | type | default | description |\n|---|---|---|---|\n")
	writeRows(&b, withDefaults(reflect.TypeFor[Config]()), "", docs)
	b.WriteString("\n" + refEnd)
	want := b.String()

	const readme = "../../README.md"
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, refBegin), strings.Index(text, refEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the config reference markers %q ... %q", refBegin, refEnd)
	}
	got := text[i : j+len(refEnd)]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(readme, []byte(text[:i]+want+text[j+len(refEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the config reference in README.md is out of date with pkg/config; run `make docs`")
}

// fieldDocs reads the doc comment of every struct field in types.go: type name -> field name -> text.
func fieldDocs(t *testing.T) map[string]map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		m := map[string]string{}
		for _, field := range st.Fields.List {
			for _, name := range field.Names {
				if field.Doc == nil {
					if name.IsExported() {
						t.Errorf("%s.%s has no doc comment", ts.Name.Name, name.Name)
					}
					continue
				}
				m[name.Name] = strings.Join(strings.Fields(field.Doc.Text()), " ")
			}
		}
		docs[ts.Name.Name] = m
		return false
	})
	return docs
}

// writeRows writes a row per field of the struct def (holding its defaults) and recurses.
func writeRows(b *strings.Builder, def reflect.Value, prefix string, docs map[string]map[string]string) {
	t := def.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		key := prefix + name
		v := def.Field(i)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
			v = withDefaults(ft)
		}
		shown := ""
		if !v.IsZero() && ft.Kind() != reflect.Struct {
			shown = fmt.Sprintf("`%v`", v.Interface())
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", key, typeName(f.Type), shown, mdEscape.Replace(docs[t.Name()][f.Name]))
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[Duration]():
			writeRows(b, v, key+".", docs)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			writeRows(b, withDefaults(ft.Elem()), key+"[].", docs)
		}
	}
}

var mdEscape = strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;")

// withDefaults returns a new t as the decoder would create it.
func withDefaults(t reflect.Type) reflect.Value {
	p := reflect.New(t)
	if d, ok := p.Interface().(Defaulter); ok {
		d.SetDefaults()
	}
	return p.Elem()
}

func typeName(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[Duration]():
		return "duration"
	case t.Kind() == reflect.Struct:
		return "object"
	case t.Kind() == reflect.Slice:
		if t.Elem().Kind() == reflect.Struct {
			return "list of objects"
		}
		return "list of " + typeName(t.Elem()) + "s"
	case t.Kind() == reflect.Map:
		return "map of " + typeName(t.Key()) + " to " + typeName(t.Elem())
	case t.Kind() == reflect.Int:
		return "integer"
	}
	return t.Kind().String()
}

package components

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/config"
)

var update = flag.Bool("update", false, "rewrite the config reference in README.md")

const (
	refBegin = "<!-- config-reference:begin (generated from pkg/config and the sink components by `make docs`; do not edit) -->"
	refEnd   = "<!-- config-reference:end -->"
)

// The config reference in README.md is generated from the config types, the
// sink components' config types (one block per type under sinks[]), their
// doc comments and their defaults, so it cannot drift: this test fails when
// the README differs from what the code says (`make docs` rewrites it).
func TestConfigReference(t *testing.T) {
	docs := fieldDocs(t)
	var b strings.Builder
	b.WriteString(refBegin + "\n\n| key | type | default | description |\n|---|---|---|---|\n")
	writeRows(&b, withDefaults(reflect.TypeFor[config.Config]()), "", docs)
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
	t.Errorf("the config reference in README.md is out of date with the code; run `make docs`")
}

// fieldDocs reads the doc comment of every struct field in the packages
// that hold config types (pkg/config and each sink component):
// "<import path>.<type>" -> field name -> text.
func fieldDocs(t *testing.T) map[string]map[string]string {
	t.Helper()
	pkgs := map[string]bool{reflect.TypeFor[config.Config]().PkgPath(): true}
	for _, f := range Sinks() {
		pkgs[reflect.TypeOf(f.NewConfig()).Elem().PkgPath()] = true
	}
	docs := map[string]map[string]string{}
	for pkg := range pkgs {
		dir := filepath.Join("..", "..", strings.TrimPrefix(pkg, module+"/"))
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			structDocs(t, f, pkg, docs)
		}
	}
	return docs
}

const module = "github.com/kubebridge/kubebridge"

func structDocs(t *testing.T, f *ast.File, pkg string, docs map[string]map[string]string) {
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok || !ts.Name.IsExported() {
			return false
		}
		m := map[string]string{}
		if gd := typeDoc(f, ts); gd != "" {
			m[""] = gd
		}
		for _, field := range st.Fields.List {
			for _, name := range field.Names {
				if field.Doc == nil {
					if name.IsExported() && hasYAMLName(field) {
						t.Errorf("%s.%s.%s has no doc comment", pkg, ts.Name.Name, name.Name)
					}
					continue
				}
				m[name.Name] = strings.Join(strings.Fields(field.Doc.Text()), " ")
			}
		}
		docs[pkg+"."+ts.Name.Name] = m
		return false
	})
}

// typeDoc is the doc comment of a type declaration (on the spec or, for a
// lone type, on its declaration).
func typeDoc(f *ast.File, ts *ast.TypeSpec) string {
	if ts.Doc != nil {
		return strings.Join(strings.Fields(ts.Doc.Text()), " ")
	}
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && len(gd.Specs) == 1 && gd.Specs[0] == ts && gd.Doc != nil {
			return strings.Join(strings.Fields(gd.Doc.Text()), " ")
		}
	}
	return ""
}

func hasYAMLName(f *ast.Field) bool {
	return f.Tag != nil && strings.Contains(f.Tag.Value, `yaml:"`) && !strings.Contains(f.Tag.Value, `yaml:"-"`)
}

// writeRows writes a row per field of the struct def (holding its defaults) and recurses.
func writeRows(b *strings.Builder, def reflect.Value, prefix string, docs map[string]map[string]string) {
	t := def.Type()
	doc := docs[t.PkgPath()+"."+t.Name()]
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
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
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", key, typeName(f.Type), shown, mdEscape.Replace(doc[f.Name]))
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[config.Duration]():
			writeRows(b, v, key+".", docs)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			writeRows(b, withDefaults(ft.Elem()), key+"[].", docs)
		}
		if ft.Kind() == reflect.Slice && ft.Elem() == reflect.TypeFor[config.Sink]() {
			writeSinkTypes(b, key+"[].", docs)
		}
	}
}

// writeSinkTypes writes a row per sink type (its type block) and its fields.
func writeSinkTypes(b *strings.Builder, prefix string, docs map[string]map[string]string) {
	for _, f := range Sinks() {
		def := reflect.ValueOf(f.NewConfig()).Elem()
		t := def.Type()
		doc := docs[t.PkgPath()+"."+t.Name()][""]
		if _, rest, ok := strings.Cut(doc, ": "); ok { // "Config is the nats sink's type block: it publishes..."
			doc = strings.ToUpper(rest[:1]) + rest[1:]
		}
		fmt.Fprintf(b, "| `%s%s` | object |  | A sink type: each sink has exactly one type block. %s |\n", prefix, f.Type, mdEscape.Replace(doc))
		writeRows(b, def, prefix+f.Type+".", docs)
	}
}

var mdEscape = strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;")

// withDefaults returns a new t as the decoder would create it.
func withDefaults(t reflect.Type) reflect.Value {
	p := reflect.New(t)
	if d, ok := p.Interface().(config.Defaulter); ok {
		d.SetDefaults()
	}
	return p.Elem()
}

func typeName(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[config.Duration]():
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

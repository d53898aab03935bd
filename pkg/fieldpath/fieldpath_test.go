package fieldpath

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	ok := map[string][]Segment{
		"spec.replicas": {{Kind: Field, Key: "spec"}, {Kind: Field, Key: "replicas"}},
		`metadata.annotations["app.kubernetes.io/version"]`: {{Kind: Field, Key: "metadata"}, {Kind: Field, Key: "annotations"}, {Kind: Field, Key: "app.kubernetes.io/version"}},
		`["a.b"].c`:                 {{Kind: Field, Key: "a.b"}, {Kind: Field, Key: "c"}},
		"spec.containers[*].image":  {{Kind: Field, Key: "spec"}, {Kind: Field, Key: "containers"}, {Kind: Each}, {Kind: Field, Key: "image"}},
		"spec.containers[name=web]": {{Kind: Field, Key: "spec"}, {Kind: Field, Key: "containers"}, {Kind: Match, Key: "name", Value: "web"}},
		`c[name="a.b]"].x`:          {{Kind: Field, Key: "c"}, {Kind: Match, Key: "name", Value: "a.b]"}, {Kind: Field, Key: "x"}},
		`m["]"]`:                    {{Kind: Field, Key: "m"}, {Kind: Field, Key: "]"}},
		"args[0]":                   {{Kind: Field, Key: "args"}, {Kind: Index, Value: "0"}},
		"a[*][*]":                   {{Kind: Field, Key: "a"}, {Kind: Each}, {Kind: Each}},
	}
	for in, want := range ok {
		p, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if !reflect.DeepEqual(p.Segments(), want) {
			t.Errorf("Parse(%q) = %+v, want %+v", in, p.Segments(), want)
		}
	}
	bad := map[string]string{
		"":                        "empty path",
		"a..b":                    "empty key",
		"a.":                      "empty key",
		"a/b":                     `write it as ["a/b"]`,
		"[*].a":                   "name the field first",
		"a[name=]":                "empty value",
		"a[=x]":                   "empty field",
		"a[name=x":                "unclosed",
		`a["x"`:                   "quoted",
		"a[01]":                   "not a position",
		"a[x]":                    "want [*], [field=value]",
		"a[*]b":                   "want . or [",
		strings.Repeat("a.", 40):  "more than 32 keys",
		"a[*][*][*][*][*]":        "more than 4 lists",
		strings.Repeat("a", 2000): "at most 1024",
		`a[name=x"y]`:             "quote the value",
		`a.["b"]`:                 "empty key",
	}
	for in, want := range bad {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%.30q) = %v, want an error with %q", in, err, want)
		}
	}
}

// FuzzParse: Parse never panics, and what it accepts formats to a path
// that parses to the same steps.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"a.b", `a["x.y"]`, "a[*].b", "a[name=web].image", `a[name="x y"]`, "a[3]", "a[", `a["`, "[", `["]"]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(Format(p.Segments()))
		if err != nil || !reflect.DeepEqual(again.Segments(), p.Segments()) {
			t.Fatalf("%q -> %q -> %+v (%v), want %+v", s, Format(p.Segments()), again.Segments(), err, p.Segments())
		}
	})
}

func obj(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func must(t testing.TB, s string) Path {
	t.Helper()
	p, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const deployV1 = `{"spec":{"template":{"spec":{"containers":[
	{"name":"web","image":"web:1","env":[{"name":"A","value":"1"}]},
	{"name":"sidecar","image":"proxy:1"}]}}}}`

func TestChanged(t *testing.T) {
	old := obj(t, deployV1)
	cases := []struct {
		path, now string
		want      bool
	}{
		{"spec.template.spec.containers[*].image", deployV1, false},
		// An env change is no image change.
		{"spec.template.spec.containers[*].image", strings.Replace(deployV1, `"value":"1"`, `"value":"2"`, 1), false},
		{"spec.template.spec.containers[*].image", strings.Replace(deployV1, "web:1", "web:2", 1), true},
		// Reordered containers, same images: keyed by name, nothing changed.
		{"spec.template.spec.containers[*].image", `{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"proxy:1"},{"name":"web","image":"web:1"}]}}}}`, false},
		// A container added.
		{"spec.template.spec.containers[*].image", strings.Replace(deployV1, `]}}}}`, `,{"name":"x","image":"x:1"}]}}}}`, 1), true},
		{"spec.template.spec.containers[name=sidecar].image", strings.Replace(deployV1, "web:1", "web:2", 1), false},
		{"spec.template.spec.containers[name=web].image", strings.Replace(deployV1, "web:1", "web:2", 1), true},
		{"spec.template.spec.containers[*].env[name=A].value", strings.Replace(deployV1, `"value":"1"`, `"value":"2"`, 1), true},
		// A key through a list selects nothing, before and after.
		{"spec.template.spec.containers.image", strings.Replace(deployV1, "web:1", "web:2", 1), false},
		{"spec.template.spec.containers[1].image", strings.Replace(deployV1, "proxy:1", "proxy:2", 1), true},
		{"spec.template", strings.Replace(deployV1, "web:1", "web:2", 1), true},
		{"spec.replicas", deployV1, false},
	}
	for _, c := range cases {
		if got := must(t, c.path).Changed(old, obj(t, c.now)); got != c.want {
			t.Errorf("%s: Changed = %v, want %v", c.path, got, c.want)
		}
	}
}

func TestChangesNameTheElement(t *testing.T) {
	old := obj(t, deployV1)
	now := obj(t, strings.Replace(strings.Replace(deployV1, "web:1", "web:2", 1), `,
	{"name":"sidecar","image":"proxy:1"}`, `,{"name":"log","image":"log:1"}`, 1))
	got, more := must(t, "spec.template.spec.containers[*].image").Changes(old, now, 10)
	want := []Change{
		{Path: "spec.template.spec.containers[name=log].image", New: "log:1", HasNew: true},
		{Path: "spec.template.spec.containers[name=sidecar].image", Old: "proxy:1", HadOld: true},
		{Path: "spec.template.spec.containers[name=web].image", Old: "web:1", New: "web:2", HadOld: true, HasNew: true},
	}
	if more != 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("Changes = %+v (+%d), want %+v", got, more, want)
	}
}

// A list of scalars, or of elements without a distinct name or type, is
// told apart by position.
func TestChangesByPosition(t *testing.T) {
	old := obj(t, `{"args":["a","b"],"ports":[{"containerPort":80},{"containerPort":81}]}`)
	now := obj(t, `{"args":["a","c"],"ports":[{"containerPort":80},{"containerPort":82}]}`)
	got, _ := must(t, "args[*]").Changes(old, now, 10)
	if len(got) != 1 || got[0].Path != "args[1]" || got[0].Old != "b" || got[0].New != "c" {
		t.Fatalf("args: %+v", got)
	}
	got, _ = must(t, "ports[*].containerPort").Changes(old, now, 10)
	if len(got) != 1 || got[0].Path != "ports[1].containerPort" {
		t.Fatalf("ports: %+v", got)
	}
}

// A hostile object's huge list costs a bounded map: past the bound the
// subtree at the path's first list is compared whole.
func TestSelectionIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range maxValues + 10 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"n%d","v":%d}`, i, i)
	}
	b.WriteString(`]}`)
	old := obj(t, b.String())
	same := obj(t, b.String())
	changed := obj(t, strings.Replace(b.String(), `"v":7}`, `"v":8}`, 1))
	p := must(t, "items[*].v")
	if p.Changed(old, same) {
		t.Error("equal huge lists reported changed")
	}
	if !p.Changed(old, changed) {
		t.Error("a changed element of a huge list not reported")
	}
	d, _ := p.Changes(old, changed, 10)
	if len(d) != 1 || d[0].Path != "items[name=n7].v" {
		t.Errorf("Changes past the bound = %d changes at %v, want one at items[name=n7].v", len(d), pathsOf(d))
	}
}

func pathsOf(cs []Change) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Path)
	}
	return out
}

func BenchmarkChangedPlain(b *testing.B) {
	old, now := obj(b, deployV1), obj(b, deployV1)
	p := must(b, "spec.template")
	for b.Loop() {
		p.Changed(old, now)
	}
}

func BenchmarkChangedList(b *testing.B) {
	old, now := obj(b, deployV1), obj(b, deployV1)
	p := must(b, "spec.template.spec.containers[*].image")
	for b.Loop() {
		p.Changed(old, now)
	}
}

func TestLeavesNameTheLeaf(t *testing.T) {
	old := obj(t, deployV1)
	now := obj(t, strings.Replace(strings.Replace(deployV1, "web:1", "web:2", 1), `"value":"1"`, `"value":"2"`, 1))
	// The rule's path selects the images only: the env change is not one.
	got, more := must(t, "spec.template.spec.containers[*].image").Changes(old, now, 10)
	if more != 0 || len(got) != 1 || got[0].Path != "spec.template.spec.containers[name=web].image" || got[0].Old != "web:1" || got[0].New != "web:2" {
		t.Fatalf("image changes %+v (+%d)", got, more)
	}
	// A path over a subtree names each leaf below it.
	got, _ = must(t, "spec.template").Changes(old, now, 10)
	if want := []string{"spec.template.spec.containers[name=web].env[name=A].value", "spec.template.spec.containers[name=web].image"}; !reflect.DeepEqual(pathsOf(got), want) {
		t.Fatalf("template changes %v, want %v", pathsOf(got), want)
	}
	// Bounded: past max, counted.
	got, more = must(t, "spec.template").Changes(old, now, 1)
	if len(got) != 1 || more != 1 {
		t.Fatalf("max 1: %v +%d", pathsOf(got), more)
	}
	// A field added and one removed.
	got, _ = Leaves(obj(t, `{"a":1,"b":{"c":2}}`), obj(t, `{"b":{},"d":null}`), nil, nil, 10)
	want := []Change{{Path: "a", Old: 1.0, HadOld: true}, {Path: "b.c", Old: 2.0, HadOld: true}, {Path: "d", HasNew: true}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Leaves = %+v, want %+v", got, want)
	}
}

// A hostile object nested thousands deep: below MaxDiffDepth a differing
// subtree is one change (and the walk compares as it goes, linear in the
// object's size).
func TestLeavesOfADeepObjectAreBounded(t *testing.T) {
	deep := func(depth int, leaf string) map[string]any {
		var v any = leaf
		for range depth {
			v = map[string]any{"a": v}
		}
		return v.(map[string]any)
	}
	got, _ := Leaves(deep(5000, "x"), deep(5000, "y"), nil, nil, 10)
	if len(got) != 1 || strings.Count(got[0].Path, "a") != MaxDiffDepth {
		t.Fatalf("%d changes, at depth %d", len(got), strings.Count(got[0].Path, "a"))
	}
}

package celsandbox

import (
	"encoding/json"
	"strings"
	"testing"
)

func templateVars() *TemplateVars {
	return &TemplateVars{
		Object: map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": "web-1", "namespace": "prod", "labels": map[string]any{"app": "web"}},
			"status":   map[string]any{"phase": "Failed", "message": "a \"quoted\" </script>\u2028 line\nbreak"}},
		Type:  "updated",
		Event: map[string]string{"id": "u.1.updated", "type": "io.kubebridge.pods.core.updated", "rule": "failed-pods", "cluster": "prod-eu"},
		Patch: []any{map[string]any{"op": "replace", "path": "/status/phase", "value": "Failed"}},
	}
}

// A body is JSON by construction: whatever an object's strings hold
// (quotes, tags, line separators), it stays one string value.
func TestJSONTemplate(t *testing.T) {
	tmpl, errs := CompileTemplate(`{
		"text": "Pod " + object.metadata.namespace + "/" + object.metadata.name + " is " + dyn(object).status.phase,
		"detail": dyn(object).status.message,
		"labels": object.metadata.labels,
		"cluster": event.cluster,
		"changed": patch.map(p, p.path),
		"n": 3, "ok": true, "none": null
	}`, "json")
	if errs != nil {
		t.Fatal(errs)
	}
	b, err := tmpl.JSON(templateVars())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if got["text"] != "Pod prod/web-1 is Failed" || got["detail"] != "a \"quoted\" </script>\u2028 line\nbreak" || got["cluster"] != "prod-eu" ||
		got["n"] != 3.0 || got["ok"] != true || got["none"] != nil {
		t.Errorf("body %s", b)
	}
	if l, _ := got["changed"].([]any); len(l) != 1 || l[0] != "/status/phase" {
		t.Errorf("changed = %v", got["changed"])
	}
	if strings.ContainsAny(string(b), "\n\t") {
		t.Errorf("not compact: %s", b)
	}
}

// Mistakes are load errors with a column; a template of the wrong type
// says what it got.
func TestTemplateLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		expr, json, want string
	}{
		{`objekt.metadata.name`, "", "undeclared reference to 'objekt' (column 1)"},
		{`object.metadata.nmae`, "", "undefined field 'nmae'"},
		{`object.metadata.generation`, "", "must be a string expression, got int"},
		{`object.metadata.name`, "json", ""},
		{`timestamp('2024-01-01T00:00:00Z')`, "json", "must be a JSON value"},
	} {
		var errs []error
		if tc.json != "" {
			_, errs = CompileTemplate(tc.expr, "json")
		} else {
			_, errs = CompileTemplate(tc.expr, "string")
		}
		switch {
		case tc.want == "" && errs != nil:
			t.Errorf("%s: %v", tc.expr, errs)
		case tc.want != "" && (errs == nil || !strings.Contains(errs[0].Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.expr, errs, tc.want)
		}
	}
}

// Templates are bounded like where: cost, and size of what they build.
func TestTemplateBounds(t *testing.T) {
	v := templateVars()
	v.Object["data"] = map[string]any{"s": strings.Repeat("a", 600<<10)}
	for _, expr := range []string{
		`{"x": dyn(object).data.s + dyn(object).data.s}`,
		`lists.range(3000).map(i, dyn(object).data.s)`,
	} {
		tmpl, errs := CompileTemplate(expr, "json")
		if errs != nil {
			t.Fatal(errs)
		}
		if _, err := tmpl.JSON(v); err == nil {
			t.Errorf("%s: no error", expr)
		}
	}
	s, errs := CompileTemplate(`dyn(object).data.s + 'x'`, "string")
	if errs != nil {
		t.Fatal(errs)
	}
	if got, err := s.String(v); err != nil || len(got) != 600<<10+1 {
		t.Errorf("a string under the bound: %d bytes, %v", len(got), err)
	}
}

// Whatever an object's string holds, the body is valid JSON holding it as
// the same value, and nothing panics.
func FuzzJSONTemplateHoldsAnyString(f *testing.F) {
	tmpl, errs := CompileTemplate(`{"v": dyn(object).data.v, "l": [dyn(object).data.v], "k": {dyn(object).data.v: 1}}`, "json")
	if errs != nil {
		f.Fatal(errs)
	}
	for _, s := range []string{"", "\"}", "\x00\x1b[2J", "\u2028</script>", "\xff\xfe", "a\"b\\c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := &TemplateVars{Object: map[string]any{"data": map[string]any{"v": s}}}
		b, err := tmpl.JSON(v)
		if err != nil {
			return // a bound, or an invalid string CEL refused: an error, not a panic
		}
		var got struct {
			V string         `json:"v"`
			L []string       `json:"l"`
			K map[string]int `json:"k"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q: body %s is not JSON: %v", s, b, err)
		}
		want := string([]rune(s)) // each invalid byte as U+FFFD, as encoding/json writes it
		if got.V != want || len(got.L) != 1 || got.L[0] != want || got.K[want] != 1 {
			t.Fatalf("%q: body %s holds another value", s, b)
		}
	})
}

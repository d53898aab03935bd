package kubejson

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"unique"
	"unsafe"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// clientGo is what client-go's unstructured decoding makes of data.
func clientGo(data []byte) (map[string]any, error) {
	m := map[string]any{}
	err := utiljson.Unmarshal(data, &m)
	return m, err
}

// objectCases are inputs Object decodes, each as client-go does.
var objectCases = []string{
	`{}`,
	` {"a":1} `,
	`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"ns","labels":{"app":"a"}},"data":{"k":"v"}}`,
	`{"n":[0,-0,1,-1,9223372036854775807,-9223372036854775808,9223372036854775808,-9223372036854775809,123456789012345678,1234567890123456789]}`,
	`{"f":[1.0,1.5,-0.0,1e3,1E-3,2e+2,0.1,123456789012345678901234567890]}`,
	`{"s":["","\"\\\/\b\f\n\r\t","\u00e9\u4e2d","\ud83d\ude00","\ud83d","\ud83dx","\ude00\ud83d\ude00","é中😀"]}`,
	"{\"bad\":\"\xff\xfe a \xc3\x28\"}",
	"{\"bad\":\"\\n\xff\"}",
	`{"a":null,"b":true,"c":false,"d":[],"e":{},"f":[[],{},[null]]}`,
	`{"dup":1,"dup":"two","obj":{"x":1},"obj":{"y":2}}`,
	" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \n",
}

func TestObjectDecodesAsClientGo(t *testing.T) {
	for _, in := range objectCases {
		want, err := clientGo([]byte(in))
		if err != nil {
			t.Fatalf("%s: client-go: %v", in, err)
		}
		got, ok := Object([]byte(in))
		if !ok {
			t.Errorf("%s: declined", in)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %#v\nwant %#v", in, got, want)
		}
		if k, ok := notCanonical(got); ok {
			t.Errorf("%s: key %q is not canonical", in, k)
		}
	}
}

// notCanonical finds a plain key of m (or of a map in it) that is not
// unique.Make's copy: keys are decoded as the informer's cache keeps them.
func notCanonical(v any) (string, bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			plain := !strings.ContainsFunc(k, func(r rune) bool { return r < ' ' || r > '~' || r == '"' || r == '\\' })
			if plain && unsafe.StringData(unique.Make(k).Value()) != unsafe.StringData(k) {
				return k, true
			}
			if k, ok := notCanonical(e); ok {
				return k, true
			}
		}
	case []any:
		for _, e := range v {
			if k, ok := notCanonical(e); ok {
				return k, true
			}
		}
	}
	return "", false
}

// What Object declines: invalid JSON, which client-go refuses too, and
// the edges it leaves to client-go.
func TestObjectDeclines(t *testing.T) {
	for _, in := range []string{
		``, ` `, `[]`, `"s"`, `1`, `null`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1}x`, `{"a":1}{}`,
		`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":+1}`, `{"a":tru}`, `{"a":nul}`,
		`{"a":"\x"}`, `{"a":"\u12"}`, `{"a":"\'"}`, "{\"a\":\"\x01\"}", `{"a":"unterminated}`, `{a:1}`, `{"a":[1 2]}`,
	} {
		if _, ok := Object([]byte(in)); ok {
			t.Errorf("%q: decoded", in)
		}
		if _, err := clientGo([]byte(in)); err == nil && strings.HasPrefix(strings.TrimSpace(in), "{") {
			t.Errorf("%q: client-go decodes it", in)
		}
	}
	// Valid JSON client-go refuses or that Object leaves to it.
	for _, in := range []string{`{"a":1e400}`, nested(maxDepth + 1)} {
		if _, ok := Object([]byte(in)); ok {
			t.Errorf("%.40q: decoded", in)
		}
	}
	if _, err := clientGo([]byte(nested(maxDepth + 1))); err == nil {
		t.Error("client-go decodes nesting past maxDepth")
	}
	if _, ok := Object([]byte(nested(maxDepth))); !ok {
		t.Error("nesting to maxDepth declined")
	}
	if _, err := clientGo([]byte(nested(maxDepth))); err != nil {
		t.Errorf("client-go refuses nesting to maxDepth: %v", err)
	}
}

// nested is an object nested depth deep.
func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth-1) + `{}` + strings.Repeat(`}`, depth-1)
}

func TestNumbersKeepClientGosTypes(t *testing.T) {
	m, ok := Object([]byte(`{"i":42,"big":9223372036854775808,"f":4.0,"e":1e2}`))
	if !ok {
		t.Fatal("declined")
	}
	if m["i"] != int64(42) || m["big"] != float64(9223372036854775808) || m["f"] != 4.0 || m["e"] != 100.0 {
		t.Errorf("got %#v", m)
	}
	if f, _ := m["big"].(float64); f != math.Pow(2, 63) {
		t.Errorf("big: %v", m["big"])
	}
}

func FuzzObject(f *testing.F) {
	for _, in := range objectCases {
		f.Add([]byte(in))
	}
	f.Add([]byte(`{"a":[1,{"b":"\u00e9"}],"c":-1.5e-7}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		want, err := clientGo(data)
		got, ok := Object(data)
		if ok {
			if err != nil {
				t.Fatalf("%q: decoded, client-go refuses it: %v", data, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q:\n got %#v\nwant %#v", data, got, want)
			}
		}
	})
}

func BenchmarkObject(b *testing.B) {
	data := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-000001","namespace":"bench-cold","uid":"6f1c1a52-7a8e-4c1e-9b0e-2d8a7f3c9e11","resourceVersion":"123456","creationTimestamp":"2026-11-27T05:00:00Z","labels":{"app":"bench","shard":"1"}},"data":{"payload":"` + strings.Repeat("00000001", 110) + `","revision":"0"}}`)
	b.Run("kubejson", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, ok := Object(data); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("client-go", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := clientGo(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

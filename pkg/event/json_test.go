package event

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// An event's data is what json.Marshal wrote before, byte for byte: the
// same key order, escapes and number formats, for every kind of value an
// object holds (and what no decoder makes: other types, deep nesting);
// values Marshal refuses are refused.
func TestDataIsMarshalsEncoding(t *testing.T) {
	values := []any{
		nil, "", "plain", `q"uo\te`, "<a href='x'>&amp;</a>", "ctl\x00\x01\b\f\n\r\t\x1f\x7f", "é ü 日本 🚀",
		"bad\xffutf8\xc3", "line\u2028para\u2029", true, false,
		int64(0), int64(-7), int64(math.MaxInt64), int64(math.MinInt64), 3,
		0.0, -0.0, 1.5, 1e20, 1e21, 1e-6, 1e-7, 123456789.125, -2.5e-9, math.MaxFloat64, math.SmallestNonzeroFloat64,
		map[string]any{}, map[string]any(nil), []any{}, []any(nil),
		map[string]any{"b": 1.0, "a": []any{"x", nil, map[string]any{"z": true, "<": "&"}}, "": "empty key", "é": "k"},
		[]string{"typed", "slice"}, map[string]string{"typed": "map"}, uint64(18446744073709551615), int32(-3), float32(0.1),
		json.Number("12.50"), []byte("bytes"),
	}
	deep := any("leaf")
	for range 600 {
		deep = []any{map[string]any{"d": deep}}
	}
	values = append(values, deep)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		values = append(values, randomValue(rng, 0))
	}
	for i, v := range values {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendJSON([]byte("prefix"), v, 0)
		if err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Errorf("value %d (%.80v): got %.200s, %v; want %.200s", i, v, got[min(6, len(got)):], err, want)
		}
	}
	for _, bad := range []any{math.NaN(), math.Inf(1), map[string]any{"x": []any{math.Inf(-1)}}, map[string]any{"f": func() {}}} {
		if _, err := appendJSON(nil, bad, 0); err == nil {
			t.Errorf("%v encoded", bad)
		}
	}

	// The whole data of events, against json.Marshal of the payload.
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	cms := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	for i := range 100 {
		old := &unstructured.Unstructured{Object: randomObject(rng)}
		cur := &unstructured.Unstructured{Object: randomObject(rng)}
		if i%10 == 0 {
			cur.Object = map[string]any{"metadata": map[string]any{"name": "bare"}}
		}
		gvr := cms
		if i%3 == 0 {
			gvr = secrets
		}
		r := &Rule{Name: "r", Cluster: "c", GVR: gvr, IncludeObject: i%4 != 1, IncludeMeta: i%4 == 1, IncludeOld: i%2 == 0, IncludePatch: i%5 != 0,
			SecretAnnotations: AlwaysRedactedAnnotations}
		e := New(r, Updated, cur, old, time.Unix(1700000000, 0))
		d, err := e.payload()
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.Data()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("event %d: data %s, %v; want %s", i, got, err, want)
		}
	}
	empty := New(&Rule{Name: "r", GVR: cms, IncludePatch: true}, Added, &unstructured.Unstructured{Object: map[string]any{}}, nil, time.Now())
	if d, err := empty.Data(); err != nil || string(d) != "{}" {
		t.Errorf("data of an event that includes nothing: %s, %v; want {}", d, err)
	}
}

func randomObject(rng *rand.Rand) map[string]any {
	obj := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": randomString(rng), "namespace": "ns", "uid": "u", "resourceVersion": "1",
			"labels": map[string]any{"app": randomString(rng)}, "annotations": map[string]any{"kubectl.kubernetes.io/last-applied-configuration": randomString(rng)}},
		"data": map[string]any{},
	}
	for range rng.IntN(6) {
		obj["data"].(map[string]any)[randomString(rng)] = randomValue(rng, 2)
	}
	return obj
}

func randomValue(rng *rand.Rand, depth int) any {
	switch n := rng.IntN(9); {
	case n == 0 && depth < 5:
		m := map[string]any{}
		for range rng.IntN(40) { // beyond the keys' stack buffer too
			m[randomString(rng)] = randomValue(rng, depth+1)
		}
		return m
	case n == 1 && depth < 5:
		s := make([]any, rng.IntN(5))
		for i := range s {
			s[i] = randomValue(rng, depth+1)
		}
		return s
	case n == 2:
		return rng.Int64() - rng.Int64()
	case n == 3:
		return math.Float64frombits(rng.Uint64()&^(0x7ff<<52) | uint64(rng.IntN(2046)+1)<<52) // finite
	case n == 4:
		return rng.IntN(2) == 0
	case n == 5:
		return nil
	}
	return randomString(rng)
}

func randomString(rng *rand.Rand) string {
	const alphabet = "ab<>&\"\\\x00\x1f\n\t é日\u2028\xff/"
	var b strings.Builder
	for range rng.IntN(12) {
		b.WriteByte(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

// FuzzAppendJSON: any JSON document, decoded as an object's values are,
// encodes to exactly json.Marshal's bytes; never a panic.
func FuzzAppendJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5,"x",null,true,{"b":"\u2028<&>"}]}`, `"bad\xff"`, `1e21`, `-0`, `[[[[[]]]]]`, `{"":{"":""}}`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var v any
		if json.Unmarshal(doc, &v) != nil {
			v = string(doc) // a hostile string value instead
		}
		want, werr := json.Marshal(v)
		got, gerr := appendJSON(nil, v, 0)
		if (werr == nil) != (gerr == nil) || (werr == nil && !bytes.Equal(got, want)) {
			t.Fatalf("%q: got %s (%v), want %s (%v)", doc, got, gerr, want, werr)
		}
	})
}

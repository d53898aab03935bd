package kubejson

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	restwatch "k8s.io/client-go/rest/watch"
)

// decoded is one event as a watch's consumer sees it.
type decoded struct {
	typ watch.EventType
	obj runtime.Object
	err string
}

// watchStream decodes a JSON watch stream as client-go's REST client does
// (rest.Request's newStreamWatcher) with the negotiated serializer ns.
func watchStream(t testing.TB, ns runtime.NegotiatedSerializer, body io.Reader) []decoded {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(ns.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok || info.StreamSerializer == nil {
		t.Fatal("no JSON stream serializer")
	}
	frames := info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(body))
	dec := restwatch.NewDecoder(streaming.NewDecoder(frames, info.StreamSerializer.Serializer),
		ns.DecoderToVersion(info.Serializer, schema.GroupVersion{Version: "v1"}))
	var out []decoded
	for {
		typ, obj, err := dec.Decode()
		if err != nil {
			// The messages differ; the kind of the end does not (the
			// StreamWatcher ends quietly at EOF and unexpected EOF, and
			// reports any other error, which makes the reflector list again).
			switch err {
			case io.EOF:
			case io.ErrUnexpectedEOF:
				out = append(out, decoded{err: "unexpected EOF"})
			default:
				out = append(out, decoded{err: "error"})
			}
			return out
		}
		out = append(out, decoded{typ: typ, obj: obj})
	}
}

func dynamicSerializer() runtime.NegotiatedSerializer {
	return dynamic.ConfigFor(&rest.Config{}).NegotiatedSerializer
}

func configMap(i int, payload string) string {
	return fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%06d","namespace":"ns","uid":"u-%d","resourceVersion":"%d","creationTimestamp":"2026-11-27T05:00:00Z","labels":{"app":"bench","shard":"%d"},"managedFields":[{"manager":"bench","operation":"Update","apiVersion":"v1","time":"2026-11-27T05:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:payload":{}}}}]},"data":{"payload":%q,"n":"%d"}}`,
		i, i, 1000+i, i%16, payload, i)
}

// streams are watch streams as the apiserver writes them (one event per
// line), and some it does not write.
var streams = map[string]string{
	"list": func() string {
		var b strings.Builder
		for i := range 50 {
			fmt.Fprintf(&b, "{\"type\":\"ADDED\",\"object\":%s}\n", configMap(i, strings.Repeat("x", i*37)))
		}
		b.WriteString(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"2000","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n")
		fmt.Fprintf(&b, "{\"type\":\"MODIFIED\",\"object\":%s}\n{\"type\":\"DELETED\",\"object\":%s}\n", configMap(3, `"quoted" {braces} [brackets] \ back`), configMap(4, "é中😀\u2028"))
		return b.String()
	}(),
	"large object": fmt.Sprintf(`{"type":"ADDED","object":%s}`, configMap(1, strings.Repeat("0123456789", 30000))),
	"error":        `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}}` + "\n",
	"no space":     `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1","n":1}}{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1","n":2.5}}`,
	"spaced":       " \n{ \"object\" : {\"apiVersion\":\"x/v1\",\"kind\":\"A\",\"s\":\"\\u00e9\\ud83d\"} , \"type\" : \"MODIFIED\" }\r\n\t",
	"odd envelope": `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1"},"extra":1}` + `{"object":{"kind":"A","apiVersion":"x/v1"},"type":"ADDED","type":"MODIFIED"}` + `{"type":"ADDED","object":null}`,
	"odd kinds":    `{"type":"ADDED","object":{"Kind":"A","apiVersion":"x/v1"}}` + `{"type":"ADDED","object":{"kind":"A","kind":"B","apiVersion":"x/v1"}}` + `{"type":"ADDED","object":{"kind":"List","apiVersion":"v1","items":[]}}`,
	"invalid":      `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1","n":01}}`,
	"no kind":      `{"type":"ADDED","object":{"apiVersion":"x/v1"}}`,
	"no version":   `{"type":"ADDED","object":{"kind":"A"}}`,
	"bad type":     `{"type":"NOPE","object":{"kind":"A","apiVersion":"x/v1"}}`,
	// kind and apiVersion as encoding/json matches them (client-go's meta
	// factory): repeated, not strings, in another case or Unicode folding.
	"kind repeated":    `{"type":"ADDED","object":{"apiVersion":"v1","kind":1,"kind":"ConfigMap","metadata":{"name":"a"}}}`,
	"version repeated": `{"type":"ADDED","object":{"apiVersion":{},"apiVersion":"v1","kind":"ConfigMap"}}`,
	"kelvin kind":      `{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"\u212aind":"Status"}}`,
	"long-s version":   `{"type":"MODIFIED","object":{"apiVersion":"x/v1","kind":"Foo","metadata":{"name":"a"},"apiVer\u017fion":"a/b/c"}}`,
	"status v2":        `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v2","message":"m"}}`,
	"deep in envelope": `{"type":"ADDED","object":{"apiVersion":"x/v1","kind":"Foo","d":` + nested(maxDepth-2) + `}}`,
	"deep, fits":       `{"type":"ADDED","object":{"apiVersion":"x/v1","kind":"Foo","d":` + nested(maxDepth-3) + `}}`,
	// How a stream ends: at EOF, cut (valid so far), or at a syntax error
	// whether or not it is cut after it.
	"syntax error then cut": `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1","a":trux`,
	"syntax error in frame": `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1"}}{"type":"ADDED","object":{"a":]`,
	"cut in a string":       `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1","a":"b\`,
	"cut":                   `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1"}}{"type":"ADDED","obj`,
	"not object":            `{"type":"ADDED","object":{"kind":"A","apiVersion":"x/v1"}} 42`,
}

// A watch stream decodes to the same events, value for value, with the
// one-pass serializer as with client-go's, however its bytes arrive.
func TestWatchStreamsDecodeAsClientGo(t *testing.T) {
	std, fast := dynamicSerializer(), Serializer(dynamicSerializer())
	for name, s := range streams {
		want := watchStream(t, std, strings.NewReader(s))
		for reader, r := range map[string]func(io.Reader) io.Reader{
			"whole": func(r io.Reader) io.Reader { return r }, "one byte": iotest.OneByteReader, "half": iotest.HalfReader,
		} {
			got := watchStream(t, fast, r(strings.NewReader(s)))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s, %s reads:\n got %v\nwant %v", name, reader, got, want)
			}
		}
	}
	if got := watchStream(t, std, strings.NewReader(streams["list"])); len(got) != 53 {
		t.Errorf("the list stream has %d events, want 53", len(got))
	}
}

// A syntax error in a frame whose brackets never balance ends the stream
// there, as json.Framer's reader does, not after reading all of it.
func TestSyntaxErrorInALargeUnfinishedFrame(t *testing.T) {
	r := &countingReader{r: io.MultiReader(strings.NewReader(`{"type":"ADDED","object":{"a":x`), strings.NewReader(strings.Repeat("[", 8<<20)))}
	got := watchStream(t, Serializer(dynamicSerializer()), r)
	if len(got) != 1 || got[0].err != "error" {
		t.Fatalf("got %v, want a syntax error", got)
	}
	if r.n > 4<<20 {
		t.Errorf("read %d bytes of a stream whose first frame is invalid at its 30th", r.n)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// typed is the dynamic client's scheme's New: the kinds it decodes into
// typed objects.
func TestTypedIsTheSchemesNew(t *testing.T) {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	gvks := []schema.GroupVersionKind{{Version: "v1", Kind: "ConfigMap"}, {Group: "apps", Version: "v1", Kind: "Status"}, {Version: "v9", Kind: "APIGroup"}, {Version: "v1", Kind: "WatchEvent"}, {Version: "v2", Kind: "WatchEvent"}, {Group: "x", Version: "v1", Kind: "List"}}
	for gvk := range s.AllKnownTypes() {
		gvks = append(gvks, gvk, schema.GroupVersionKind{Group: "other", Version: "v1", Kind: gvk.Kind})
	}
	for _, gvk := range gvks {
		_, err := s.New(gvk)
		if typed(gvk) != (err == nil) {
			t.Errorf("%v: typed %v, New: %v", gvk, typed(gvk), err)
		}
	}
}

// A frame larger than the streaming decoder's buffer arrives in parts
// (io.ErrShortBuffer), as with json.Framer's reader.
func TestLargeFrameInParts(t *testing.T) {
	s := streams["large object"]
	r := framer{}.NewFrameReader(io.NopCloser(strings.NewReader(s)))
	var got []byte
	buf := make([]byte, 1024)
	for {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err == nil {
			break
		}
		if err != io.ErrShortBuffer {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, []byte(s)) {
		t.Errorf("the frame read in parts differs from the stream (%d bytes, want %d)", len(got), len(s))
	}
	if _, err := r.Read(buf); err != io.EOF {
		t.Errorf("after the last frame: %v, want EOF", err)
	}
}

// The envelope's object serializer still decodes typed metav1 kinds
// (a watch's Status) into their types, as client-go's does.
func TestStatusStaysTyped(t *testing.T) {
	got := watchStream(t, Serializer(dynamicSerializer()), strings.NewReader(streams["error"]))
	if len(got) != 1 {
		t.Fatalf("got %v", got)
	}
	if _, ok := got[0].obj.(*metav1.Status); !ok {
		t.Errorf("the error event's object is a %T, want *metav1.Status", got[0].obj)
	}
}

func BenchmarkWatchStream(b *testing.B) {
	var s bytes.Buffer
	for i := range 2000 {
		fmt.Fprintf(&s, "{\"type\":\"ADDED\",\"object\":%s}\n", configMap(i, strings.Repeat("0", 880)))
	}
	for name, ns := range map[string]runtime.NegotiatedSerializer{"client-go": dynamicSerializer(), "kubejson": Serializer(dynamicSerializer())} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(s.Len()))
			for b.Loop() {
				if got := watchStream(b, ns, bytes.NewReader(s.Bytes())); len(got) != 2000 {
					b.Fatalf("%d events", len(got))
				}
			}
		})
	}
}

func FuzzWatchStream(f *testing.F) {
	for _, s := range streams {
		if len(s) < 10000 {
			f.Add([]byte(s))
		}
	}
	std, fast := dynamicSerializer(), Serializer(dynamicSerializer())
	f.Fuzz(func(t *testing.T, data []byte) {
		want := watchStream(t, std, bytes.NewReader(data))
		if got := watchStream(t, fast, bytes.NewReader(data)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %v\nwant %v", data, got, want)
		}
	})
}

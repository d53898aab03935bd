package kubejson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// Serializer wraps the dynamic client's negotiated serializer
// (dynamic.ConfigFor's): its JSON watch streams are framed and decoded in
// one pass each (Framer, Event, Unstructured); everything else is its own.
func Serializer(inner runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	infos := inner.SupportedMediaTypes()
	out := make([]runtime.SerializerInfo, len(infos))
	for i, info := range infos {
		out[i] = info
		if info.MediaType != runtime.ContentTypeJSON || info.StreamSerializer == nil {
			continue
		}
		out[i].Serializer = objectSerializer{info.Serializer}
		stream := *info.StreamSerializer
		stream.Serializer = eventSerializer{stream.Serializer}
		stream.Framer = framer{}
		out[i].StreamSerializer = &stream
	}
	return negotiated{inner, out}
}

type negotiated struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n negotiated) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

// typed are the kinds the dynamic client decodes into typed objects,
// left to it: its scheme's (metav1's) kinds, and its unversioned kinds
// (a Status, of whatever apiVersion, such as a watch's error), as its
// scheme's New finds them.
var typed = func() func(schema.GroupVersionKind) bool {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	known := s.AllKnownTypes()
	unversioned := map[string]bool{}
	for gvk, t := range known {
		if obj, ok := reflect.New(t).Interface().(runtime.Object); ok {
			if u, registered := s.IsUnversioned(obj); registered && u {
				unversioned[gvk.Kind] = true
			}
		}
	}
	return func(gvk schema.GroupVersionKind) bool {
		_, ok := known[gvk]
		return ok || unversioned[gvk.Kind]
	}
}()

// objectSerializer decodes an object without a target (a watch event's
// object) in one pass; the rest, and what Object declines, is inner's.
type objectSerializer struct{ runtime.Serializer }

func (s objectSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into != nil || defaults != nil {
		return s.Serializer.Decode(data, defaults, into)
	}
	// The kind as client-go reads it (its meta factory: keys matched as
	// encoding/json matches them, the data validated); kinds it decodes
	// into typed objects, and objects it refuses, are its own.
	gvk, err := kjson.DefaultMetaFactory.Interpret(data)
	if err != nil || gvk.Kind == "" || gvk.Version == "" || typed(*gvk) {
		return s.Serializer.Decode(data, defaults, into)
	}
	m, ok := Object(data)
	if kind, _ := m["kind"].(string); !ok || kind == "" { // client-go reads the unstructured object's own kind too
		return s.Serializer.Decode(data, defaults, into)
	}
	return &unstructured.Unstructured{Object: m}, gvk, nil
}

// eventSerializer decodes a watch event's envelope, {"type": ...,
// "object": {...}}, without decoding its object (restclient's watch
// Decoder decodes it next, with the objectSerializer); any other shape is
// inner's.
type eventSerializer struct{ runtime.Serializer }

func (s eventSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if ev, ok := into.(*metav1.WatchEvent); ok && defaults == nil {
		if typ, raw, ok := envelope(data); ok {
			ev.Type = typ
			ev.Object = runtime.RawExtension{Raw: raw}
			return ev, &schema.GroupVersionKind{Version: "v1", Kind: "WatchEvent"}, nil
		}
	}
	return s.Serializer.Decode(data, defaults, into)
}

// envelope reads {"type": "<string>", "object": <object or null>}, each
// key once, in either order: the type and the object's bytes (nil for
// null, as RawExtension decodes it), not copied: restclient's watch
// Decoder, the one reader of a stream's envelopes, decodes them before it
// reads the next frame into the same buffer. The object is delimited, not
// validated: the object serializer decodes it (or client-go refuses it).
func envelope(data []byte) (typ string, raw []byte, ok bool) {
	p := parser{data: data}
	p.space()
	if !p.next('{') {
		return "", nil, false
	}
	var seenType, seenObject bool
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return "", nil, false
		}
		k, ok := p.string()
		if !ok {
			return "", nil, false
		}
		p.space()
		if !p.next(':') {
			return "", nil, false
		}
		p.space()
		switch {
		case k == "type" && !seenType:
			seenType = true
			if p.i >= len(p.data) || p.data[p.i] != '"' {
				return "", nil, false
			}
			if typ, ok = p.string(); !ok {
				return "", nil, false
			}
		case k == "object" && !seenObject:
			seenObject = true
			switch {
			case p.literal("null"):
			case p.i < len(p.data) && p.data[p.i] == '{':
				start := p.i
				end, depth, ok := skipObject(p.data, p.i)
				if !ok || 1+depth > maxDepth { // client-go decodes the object inside the envelope: one level more
					return "", nil, false
				}
				p.i = end
				raw = p.data[start:end:end]
			default:
				return "", nil, false
			}
		default:
			return "", nil, false
		}
		p.space()
		if p.next('}') {
			break
		}
		if !p.next(',') {
			return "", nil, false
		}
	}
	p.space()
	return typ, raw, seenType && seenObject && p.i == len(p.data)
}

func (p *parser) next(c byte) bool {
	if p.i < len(p.data) && p.data[p.i] == c {
		p.i++
		return true
	}
	return false
}

// skipObject returns the end of the object or array opening at data[i]
// (the index past its closing bracket, brackets in strings and escaped
// quotes aside) and how deep it nests; ok is false when data ends first.
// It does not validate.
func skipObject(data []byte, i int) (end, deepest int, ok bool) {
	depth := 0
	for ; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, deepest, true
			}
		case '"':
			for i++; ; i += 2 { // past the escape and the byte it escapes
				j := bytes.IndexAny(data[i:], `"\`)
				if j < 0 || i+j+1 >= len(data) {
					return 0, 0, false // the object cannot end before data does
				}
				i += j
				if data[i] == '"' {
					break
				}
			}
		}
	}
	return 0, 0, false
}

// framer splits a JSON stream into its top-level objects, as
// json.Framer does, without validating them (the serializers do).
type framer struct{}

func (framer) NewFrameReader(r io.ReadCloser) io.ReadCloser {
	return &frameReader{r: r, buf: make([]byte, 0, 64<<10)}
}

func (framer) NewFrameWriter(w io.Writer) io.Writer { return w }

// frameReader reads one frame per Read, as json.Framer's reader does: a
// frame larger than Read's buffer is returned in parts, each but the
// last with io.ErrShortBuffer.
type frameReader struct {
	r         io.ReadCloser
	buf       []byte // read from r: buf[off:] is not framed yet
	off       int
	scan      scan   // how far buf[off:] was scanned for the frame's end
	checkAt   int    // the size of an unfinished frame at which it is checked next (checkLarge)
	remaining []byte // the rest of a frame Read's buffer did not hold
	err       error  // r's, once it failed
}

// checkLarge is the size of an unfinished frame at which it is first
// checked for a syntax error, then again at each doubling: json.Framer's
// decoder fails at the first invalid byte, where bracket counting alone
// would read on until the brackets balance.
const checkLarge = 1 << 20

// scan is where the search for a frame's end stopped (buf[off+at:] is
// not scanned yet), so that a frame arriving in many reads is scanned
// once.
type scan struct {
	at       int
	depth    int
	inString bool
	escaped  bool
}

// errNotObject ends a stream whose next value is not an object or array:
// the apiserver writes none, and json.Framer's reader would hand it to a
// decoder that refuses it.
var errNotObject = errors.New("watch stream: a value that is not a JSON object")

func (f *frameReader) Read(data []byte) (int, error) {
	if n := len(f.remaining); n > 0 {
		if n <= len(data) {
			copy(data, f.remaining)
			f.remaining = nil
			return n, nil
		}
		n = copy(data, f.remaining)
		f.remaining = f.remaining[n:]
		return n, io.ErrShortBuffer
	}
	for {
		if f.scan.at == 0 { // whitespace between frames
			for f.off < len(f.buf) && isSpace(f.buf[f.off]) {
				f.off++
			}
			if f.off < len(f.buf) {
				if c := f.buf[f.off]; c != '{' && c != '[' {
					if more, err := f.notObject(); !more {
						return 0, err
					}
					f.fill()
					continue
				}
			}
		}
		if end, ok := f.end(); ok {
			frame := f.buf[f.off:end]
			f.off, f.scan, f.checkAt = end, scan{}, 0
			n := copy(data, frame)
			if n < len(frame) {
				f.remaining = append([]byte(nil), frame[n:]...)
				return n, io.ErrShortBuffer
			}
			return n, nil
		}
		partial := f.buf[f.off:]
		if f.err != nil {
			if len(partial) > 0 && f.err == io.EOF {
				return 0, cut(partial)
			}
			return 0, f.err
		}
		if len(partial) >= max(f.checkAt, checkLarge) {
			f.checkAt = 2 * len(partial)
			if err := cut(partial); err != io.ErrUnexpectedEOF {
				return 0, err
			}
		}
		f.fill()
	}
}

// end scans on for the end of the frame at buf[off:]: the index past its
// closing bracket, brackets in strings and escaped quotes aside. It does
// not validate.
func (f *frameReader) end() (int, bool) {
	s := &f.scan
	b := f.buf[f.off:]
	for i := s.at; i < len(b); i++ {
		c := b[i]
		if s.inString {
			switch {
			case s.escaped:
				s.escaped = false
			case c == '\\':
				s.escaped = true
			case c == '"':
				s.inString = false
			}
			continue
		}
		switch c {
		case '"':
			s.inString = true
		case '{', '[':
			s.depth++
		case '}', ']':
			s.depth--
			if s.depth == 0 {
				return f.off + i + 1, true
			}
		}
	}
	s.at = len(b)
	return 0, false
}

// notObject is the error of a stream whose next value is not an object
// or an array, as json.Framer's reader and the decoder after it end it: a
// syntax error in it, io.ErrUnexpectedEOF when the stream ends inside it,
// else errNotObject (a decoder refuses it). more: the value goes on past
// what was read.
func (f *frameReader) notObject() (more bool, err error) {
	var raw json.RawMessage
	err = json.NewDecoder(bytes.NewReader(f.buf[f.off:])).Decode(&raw)
	switch {
	case err == nil:
		return false, errNotObject
	case err != io.ErrUnexpectedEOF:
		return false, err
	case f.err != nil:
		if f.err == io.EOF {
			return false, io.ErrUnexpectedEOF
		}
		return false, f.err
	case len(f.buf)-f.off >= checkLarge:
		return false, errNotObject
	}
	return true, nil
}

// cut is the error of a stream that ends inside a frame, as json.Framer's
// reader (an encoding/json.Decoder) gives it: io.ErrUnexpectedEOF when
// what came of the frame is valid so far, else the syntax error in it.
func cut(partial []byte) error {
	var raw json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(partial)).Decode(&raw); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF // not reached: the brackets of partial do not balance
}

// fill reads more of the stream, after what is not framed yet.
func (f *frameReader) fill() {
	if f.off > 0 {
		n := copy(f.buf, f.buf[f.off:])
		f.buf, f.off = f.buf[:n], 0
	}
	if len(f.buf) == cap(f.buf) {
		f.buf = append(f.buf, make([]byte, cap(f.buf))...)[:len(f.buf)]
	}
	n, err := f.r.Read(f.buf[len(f.buf):cap(f.buf)])
	f.buf = f.buf[:len(f.buf)+n]
	if err != nil {
		f.err = err
	}
}

func (f *frameReader) Close() error { return f.r.Close() }

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

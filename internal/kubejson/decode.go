// Package kubejson decodes the apiserver's JSON watch streams into
// unstructured objects with two reads of each event, where client-go's
// dynamic client reads every event five times (the framer's
// encoding/json.Decoder, the envelope's kind sniffing and decoding, the
// object's kind sniffing, validation and decoding). The result is the
// same, value for value, and so are the errors that end a stream: the
// frames are delimited by counting brackets (a frame cut short, or too
// large to be counted on, is checked as json.Framer's decoder checks it),
// the envelope is read without decoding its object, the object's kind is
// read by client-go's own meta factory (which validates it), and its
// values by one pass of this package's parser, fuzzed against client-go's
// decoder. What the parser does not decode exactly as client-go does
// (nesting past encoding/json's limit, a number out of float64's range),
// the kinds client-go decodes into typed objects, and envelopes written
// another way go to client-go's decoder, which decodes them or fails as
// before.
package kubejson

import (
	"strconv"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
	"unique"
)

// maxDepth is encoding/json's nesting limit: deeper input is handed to it,
// which refuses it.
const maxDepth = 10000

// Object decodes data, one JSON object with nothing after it but
// whitespace, as k8s.io/apimachinery's utiljson.Unmarshal into a
// map[string]any does: numbers without a '.' that fit an int64 as int64,
// other numbers as float64, strings with invalid UTF-8 coerced to
// U+FFFD, a repeated key's last value. ok is false when it cannot
// decode data exactly so; then data is not valid JSON, or is an edge
// (nesting past maxDepth, a number past float64's range) that the caller
// hands to client-go's decoder.
func Object(data []byte) (m map[string]any, ok bool) {
	p := parser{data: data}
	p.space()
	if p.i >= len(p.data) || p.data[p.i] != '{' {
		return nil, false
	}
	m, ok = p.object(1)
	if !ok {
		return nil, false
	}
	p.space()
	return m, p.i == len(p.data)
}

type parser struct {
	data []byte
	i    int
}

func (p *parser) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value decodes the value at p.i (whitespace skipped already).
func (p *parser) value(depth int) (any, bool) {
	if p.i >= len(p.data) {
		return nil, false
	}
	switch c := p.data[p.i]; {
	case c == '{':
		m, ok := p.object(depth + 1)
		return m, ok // not a nil map in an interface
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		return p.string()
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	}
	return nil, false
}

func (p *parser) literal(lit string) bool {
	if len(p.data)-p.i < len(lit) || string(p.data[p.i:p.i+len(lit)]) != lit {
		return false
	}
	p.i += len(lit)
	return true
}

// object decodes the object at p.i, its '{' not consumed yet.
func (p *parser) object(depth int) (map[string]any, bool) {
	if depth > maxDepth {
		return nil, false
	}
	p.i++ // '{'
	m := make(map[string]any)
	p.space()
	if p.i < len(p.data) && p.data[p.i] == '}' {
		p.i++
		return m, true
	}
	for {
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return nil, false
		}
		k, ok := p.key()
		if !ok {
			return nil, false
		}
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != ':' {
			return nil, false
		}
		p.i++
		p.space()
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		m[k] = v
		p.space()
		if p.i >= len(p.data) {
			return nil, false
		}
		switch p.data[p.i] {
		case ',':
			p.i++
			p.space()
		case '}':
			p.i++
			return m, true
		default:
			return nil, false
		}
	}
}

// array decodes the array at p.i, its '[' not consumed yet.
func (p *parser) array(depth int) (any, bool) {
	if depth > maxDepth {
		return nil, false
	}
	p.i++ // '['
	a := []any{}
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		p.i++
		return a, true
	}
	for {
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		p.space()
		if p.i >= len(p.data) {
			return nil, false
		}
		switch p.data[p.i] {
		case ',':
			p.i++
			p.space()
		case ']':
			p.i++
			return a, true
		default:
			return nil, false
		}
	}
}

// key decodes the object key at p.i: its canonical copy (unique.Make), as
// the informer's cache keeps keys (pkg/informer interns them): the keys of
// a resource's objects repeat, and a decoded key that is canonical already
// is neither allocated nor replaced there.
func (p *parser) key() (string, bool) {
	start := p.i + 1
	end := start
	for end < len(p.data) && p.data[end] != '"' && p.data[end] != '\\' && p.data[end] >= ' ' && p.data[end] < utf8.RuneSelf {
		end++
	}
	if end >= len(p.data) || p.data[end] != '"' || end-start > maxKeyLen {
		return p.string() // escaped, not ASCII, unterminated or long: rare in keys
	}
	p.i = end + 1
	return keys.canonical(p.data[start:end]), true
}

// maxKeyLen bounds the keys keys caches (longer ones are decoded as strings).
const maxKeyLen = 64

// keys caches canonical keys by their bytes, so that finding one
// allocates nothing; it holds at most maxKeys (then it only looks up). It
// keeps their handles: unique drops a value nobody holds a handle of, and
// its next copy would be another one.
var keys = keyCache{m: make(map[string]unique.Handle[string])}

const maxKeys = 4096

type keyCache struct {
	mu sync.Mutex
	m  map[string]unique.Handle[string]
}

func (c *keyCache) canonical(b []byte) string {
	c.mu.Lock()
	h, ok := c.m[string(b)] // no allocation: the compiler looks the bytes up
	c.mu.Unlock()
	if ok {
		return h.Value()
	}
	h = unique.Make(string(b))
	c.mu.Lock()
	if len(c.m) < maxKeys {
		c.m[h.Value()] = h
	}
	c.mu.Unlock()
	return h.Value()
}

// string decodes the string at p.i, its opening quote not consumed yet.
func (p *parser) string() (string, bool) {
	p.i++ // '"'
	start := p.i
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			s := string(p.data[start:p.i])
			p.i++
			return s, true
		case c == '\\' || c < ' ':
			return p.unquote(start)
		case c < utf8.RuneSelf:
			p.i++
		default:
			r, size := utf8.DecodeRune(p.data[p.i:])
			if r == utf8.RuneError && size == 1 {
				return p.unquote(start)
			}
			p.i += size
		}
	}
	return "", false
}

// unquote decodes the string from start (just past its opening quote)
// that holds escapes or invalid UTF-8, as encoding/json's unquote does;
// p.i is where the plain prefix ends.
func (p *parser) unquote(start int) (string, bool) {
	b := make([]byte, 0, p.i-start+16)
	b = append(b, p.data[start:p.i]...)
	s := p.data
	for p.i < len(s) {
		switch c := s[p.i]; {
		case c == '"':
			p.i++
			return string(b), true
		case c < ' ':
			return "", false
		case c == '\\':
			if p.i+1 >= len(s) {
				return "", false
			}
			switch s[p.i+1] {
			case '"', '\\', '/':
				b = append(b, s[p.i+1])
				p.i += 2
			case 'b':
				b = append(b, '\b')
				p.i += 2
			case 'f':
				b = append(b, '\f')
				p.i += 2
			case 'n':
				b = append(b, '\n')
				p.i += 2
			case 'r':
				b = append(b, '\r')
				p.i += 2
			case 't':
				b = append(b, '\t')
				p.i += 2
			case 'u':
				r := getu4(s[p.i:])
				if r < 0 {
					return "", false
				}
				p.i += 6
				if utf16.IsSurrogate(r) {
					r1 := getu4(s[p.i:])
					if dec := utf16.DecodeRune(r, r1); dec != unicode.ReplacementChar {
						p.i += 6
						b = utf8.AppendRune(b, dec)
						break
					}
					r = unicode.ReplacementChar // the next escape is read on its own
				}
				b = utf8.AppendRune(b, r)
			default:
				return "", false
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			p.i++
		default:
			r, size := utf8.DecodeRune(s[p.i:])
			p.i += size
			b = utf8.AppendRune(b, r) // invalid UTF-8: U+FFFD
		}
	}
	return "", false
}

// getu4 decodes \uXXXX from the beginning of s, returning the hex value,
// or it returns -1 (encoding/json's).
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c = c - '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// number decodes the number at p.i: an int64 when it has no '.' and fits
// one (sigs.k8s.io/json's PreserveInts, as client-go decodes), else a
// float64.
func (p *parser) number() (any, bool) {
	s := p.data
	start := p.i
	if s[p.i] == '-' {
		p.i++
	}
	if p.i >= len(s) {
		return nil, false
	}
	switch {
	case s[p.i] == '0':
		p.i++
	case '1' <= s[p.i] && s[p.i] <= '9':
		for p.i < len(s) && '0' <= s[p.i] && s[p.i] <= '9' {
			p.i++
		}
	default:
		return nil, false
	}
	dot, exp := false, false
	if p.i < len(s) && s[p.i] == '.' {
		dot = true
		p.i++
		if !p.digits() {
			return nil, false
		}
	}
	if p.i < len(s) && (s[p.i] == 'e' || s[p.i] == 'E') {
		exp = true
		p.i++
		if p.i < len(s) && (s[p.i] == '+' || s[p.i] == '-') {
			p.i++
		}
		if !p.digits() {
			return nil, false
		}
	}
	lit := s[start:p.i]
	if !dot && !exp && len(lit) <= 18 { // fits an int64 whatever the digits
		var n int64
		neg := lit[0] == '-'
		digits := lit
		if neg {
			digits = lit[1:]
		}
		for _, c := range digits {
			n = n*10 + int64(c-'0')
		}
		if neg {
			n = -n
		}
		return n, true
	}
	if !dot {
		if n, err := strconv.ParseInt(string(lit), 10, 64); err == nil {
			return n, true
		}
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		return nil, false // out of range: client-go's decoder refuses it
	}
	return f, true
}

// digits consumes one or more decimal digits.
func (p *parser) digits() bool {
	start := p.i
	for p.i < len(p.data) && '0' <= p.data[p.i] && p.data[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}

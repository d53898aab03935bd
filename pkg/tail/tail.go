// Package tail prints kubebridge events from NATS, for the developers of
// downstream consumers: `bridge tail --nats URL --subject 'k8s.>'`.
package tail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/config"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

// Options say what to read and how to print it.
type Options struct {
	// Connection is the server (URL) and how to authenticate (credentials
	// file, nkey seed, token, user/password, TLS), as a nats sink's.
	Connection natssink.Config
	// Subject is what to read; it may hold wildcards. Default k8s.> (the
	// nats sink's default layout); with Stream, default: every subject the
	// stream captures, whatever its layout.
	Subject string
	// Stream, when set, reads the JetStream stream from its first message
	// (an ordered consumer) instead of only what is published from now on;
	// Subject then filters the stream's messages.
	Stream string
	JSON   bool // print each event's raw JSON
	Count  int  // stop after this many events; 0: until ctx ends
}

// Run prints events until ctx ends or Count events were printed.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if o.Subject == "" && o.Stream == "" {
		o.Subject = "k8s.>"
	}
	opts, err := natssink.Options("tail", &o.Connection, nil)
	if err != nil {
		return err
	}
	nc, err := natsgo.Connect(o.Connection.URL, opts...)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", config.RedactURL(o.Connection.URL), err)
	}
	defer nc.Close()
	msgs := make(chan *natsgo.Msg, 1024)
	if o.Stream == "" {
		sub, err := nc.ChanSubscribe(o.Subject, msgs)
		if err != nil {
			return err
		}
		defer sub.Unsubscribe()
	} else {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		// Without a subject, no filter: the stream's own subjects, whatever
		// its layout (a stream of custom subjects is read whole).
		var cfg jetstream.OrderedConsumerConfig
		if o.Subject != "" {
			cfg.FilterSubjects = []string{o.Subject}
		}
		var cons jetstream.Consumer
		for { // the stream may not exist yet when tail starts first
			cons, err = js.OrderedConsumer(ctx, o.Stream, cfg)
			if err == nil || ctx.Err() != nil || !errors.Is(err, jetstream.ErrStreamNotFound) {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		if err != nil {
			return fmt.Errorf("reading stream %s: %w", o.Stream, err)
		}
		if err := checkFilter(ctx, js, o.Stream, o.Subject); err != nil {
			return err
		}
		done := make(chan struct{})
		defer close(done) // after cc.Stop (defers run last-in first-out): releases a callback blocked on msgs
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case msgs <- &natsgo.Msg{Subject: m.Subject(), Data: m.Data(), Header: m.Headers()}:
			case <-done:
			}
		})
		if err != nil {
			return err
		}
		defer cc.Stop()
	}
	n := 0
	for {
		select {
		case <-ctx.Done():
			if o.Count > 0 {
				return fmt.Errorf("got %d of %d events: %w", n, o.Count, ctx.Err())
			}
			return nil
		case m := <-msgs:
			if o.JSON {
				fmt.Fprintf(out, "%s\n", SafeJSON(m.Data))
			} else {
				fmt.Fprint(out, Format(m.Subject, m.Data))
			}
			n++
			if o.Count > 0 && n >= o.Count {
				return nil
			}
		}
	}
}

// checkFilter refuses a subject that none of the stream's subjects can
// match, which would print nothing forever. A stream without subjects of
// its own (a mirror, or sourced) is not checked.
func checkFilter(ctx context.Context, js jetstream.JetStream, stream, subject string) error {
	if subject == "" {
		return nil
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("reading stream %s: %w", stream, err)
	}
	subjects := st.CachedInfo().Config.Subjects
	if len(subjects) == 0 {
		return nil
	}
	for _, s := range subjects {
		if collide(s, subject) {
			return nil
		}
	}
	return fmt.Errorf("stream %s captures %s; subject %s matches none of its messages (leave --subject out to read the whole stream)",
		stream, strings.Join(subjects, ", "), subject)
}

// collide reports whether some subject matches both NATS subject patterns
// a and b ('*' one token, '>' the rest).
func collide(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(at) && i < len(bt); i++ {
		switch {
		case at[i] == ">" || bt[i] == ">":
			return true
		case at[i] != "*" && bt[i] != "*" && at[i] != bt[i]:
			return false
		}
	}
	return len(at) == len(bt)
}

type ce struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
	Time    string `json:"time"`
	Rule    string `json:"kbrule"`
	Replay  string `json:"kbreplay"`
	Reason  string `json:"kbreason"`
	Change  string `json:"kbchange"`
	Data    struct {
		Patch []struct {
			Op    string `json:"op"`
			Path  string `json:"path"`
			Value any    `json:"value"`
		} `json:"patch"`
	} `json:"data"`
}

// Format renders one event readably: time, change, resource, object, rule,
// and for updates the patch, one operation a line.
func Format(natsSubject string, body []byte) string {
	var e ce
	if err := json.Unmarshal(body, &e); err != nil || e.Type == "" {
		return fmt.Sprintf("?? %s: not a kubebridge event (%d bytes)\n", Printable(natsSubject), len(body))
	}
	// io.kubebridge.<resource>.<group>.<change>; the change is also
	// kbchange (events of bridges before it lack it).
	t := strings.TrimPrefix(e.Type, "io.kubebridge.")
	change := t[strings.LastIndex(t, ".")+1:]
	resource := strings.TrimSuffix(t, "."+change)
	resource = strings.TrimSuffix(resource, ".core")
	if e.Change != "" {
		change = e.Change
	}
	ts := e.Time
	if parsed, err := time.Parse(time.RFC3339Nano, e.Time); err == nil {
		ts = parsed.Local().Format("15:04:05.000")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-8s %-28s %s", Printable(ts), Printable(change), Printable(resource), Printable(e.Subject))
	var notes []string
	if e.Reason != "" {
		notes = append(notes, Printable(e.Reason))
	}
	if e.Replay != "" {
		notes = append(notes, "replay: "+Printable(e.Replay))
	}
	notes = append(notes, "rule "+Printable(e.Rule))
	fmt.Fprintf(&b, "  (%s)\n", strings.Join(notes, ", "))
	for _, op := range e.Data.Patch {
		if op.Path == "/metadata/resourceVersion" || op.Path == "/metadata/generation" {
			continue
		}
		if op.Op == "remove" {
			fmt.Fprintf(&b, "    - %s\n", Printable(op.Path))
			continue
		}
		v, _ := json.Marshal(op.Value)
		if len(v) > 80 {
			v = append(v[:77], "..."...)
		}
		fmt.Fprintf(&b, "    %s %s: %s\n", map[string]string{"add": "+", "replace": "~"}[op.Op], Printable(op.Path), Printable(string(v)))
	}
	return b.String()
}

// SafeJSON is data as one line that cannot drive a terminal: valid JSON
// is compacted (JSON has raw control characters only as white space
// between tokens) and its DEL, C1 controls and line separators, which
// JSON allows raw in strings, escaped as \uXXXX, as are bytes that are not
// UTF-8 (a raw 0x9b is the 8-bit CSI), as \ufffd: the same JSON value.
// Anything else (whoever may publish on the subject can send it) is
// printed quoted, as a JSON string.
func SafeJSON(data []byte) []byte {
	if !json.Valid(data) {
		q, _ := json.Marshal(string(bytes.ToValidUTF8(data, []byte("\uFFFD"))))
		return escapeControls(q)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return []byte(strconv.Quote(string(data)))
	}
	return escapeControls(b.Bytes())
}

// escapeControls replaces what JSON strings may hold raw but a terminal
// acts on: DEL, C1 controls (U+0080 to U+009F), line separators and, as
// \ufffd (the value a JSON decoder reads), bytes that are not UTF-8, such as
// a raw 0x9b, the 8-bit CSI.
func escapeControls(data []byte) []byte {
	var out []byte // nil while data needs no change
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if !terminalControl(r) && (r != utf8.RuneError || n > 1) {
			if out != nil {
				out = append(out, data[i:i+n]...)
			}
			i += n
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(data)+16), data[:i]...)
		}
		out = fmt.Appendf(out, "\\u%04x", r)
		i += n
	}
	if out == nil {
		return data
	}
	return out
}

// terminalControl reports whether a terminal may act on r.
func terminalControl(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029
}

// Printable returns s as is when every rune of it is printable, and
// otherwise quoted with Go escapes: a name or path from the cluster (RBAC
// objects are barely validated) must not move the cursor, recolour or
// retitle the terminal of whoever tails the events.
func Printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

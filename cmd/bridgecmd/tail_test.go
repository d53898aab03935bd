package bridgecmd

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// rawControl returns the first rune in s, but the line end, that a
// terminal may act on: C0, DEL, C1, U+2028/2029, or a byte that is not
// UTF-8 (as utf8.RuneError: a raw 0x9b is the 8-bit CSI).
func rawControl(s string) (rune, bool) {
	if !utf8.ValidString(s) {
		return utf8.RuneError, true
	}
	for _, r := range s {
		if r != '\n' && (r < 0x20 || (r >= 0x7f && r < 0xa0) || r == 0x2028 || r == 0x2029) {
			return r, true
		}
	}
	return 0, false
}

// tailOnce runs `bridge tail --count 1` with args against srv, publishing
// data until it has printed it, and returns what it printed.
func tailOnce(t *testing.T, srv *testenv.NATS, data string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := newTailCommand()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"--nats", srv.ClientURL(), "--subject", "k8s.>", "--count", "1"}, args...))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for { // publish until tail, subscribing concurrently, has seen one
		_ = nc.Publish("k8s.ns.cm.updated", []byte(data))
		select {
		case err = <-done:
		case <-tick.C:
			continue
		}
		break
	}
	if err != nil {
		t.Fatalf("tail: %v\n%s", err, out.String())
	}
	return out.String()
}

// An object's labels and annotations can hold escape sequences: whatever
// an event carries, `bridge tail` prints no raw ESC, BEL or other control
// character, and -o json prints JSON of the same value, one line an event.
func TestTailPrintsNoControlCharacters(t *testing.T) {
	srv := testenv.StartNATS(t)
	// As the sinks send it: C0 escaped; DEL, C1 and U+2028, which JSON
	// allows raw, raw.
	ev := "{\"specversion\":\"1.0\",\"id\":\"u.1.updated\",\"type\":\"io.kubebridge.configmaps.core.updated\",\"subject\":\"ns/cm\\u001b[2J\\u0007\",\"time\":\"2026-11-21T20:00:00Z\",\"kbrule\":\"r\"," +
		"\"data\":{\"object\":{\"metadata\":{\"labels\":{\"l\":\"\\u001b[2J\"},\"annotations\":{\"a\":\"ding\\u0007\",\"b\":\"\x7f\u009b31m\u2028\"}}}}}"
	var want any
	if err := json.Unmarshal([]byte(ev), &want); err != nil {
		t.Fatal(err)
	}

	got := tailOnce(t, srv, ev, "-o", "json")
	if r, ok := rawControl(got); ok {
		t.Fatalf("-o json printed a raw %U: %q", r, got)
	}
	var v any
	if err := json.Unmarshal([]byte(got), &v); err != nil || strings.Count(got, "\n") != 1 {
		t.Fatalf("-o json printed %q, not one line of JSON: %v", got, err)
	}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("-o json decodes to %#v, want %#v", v, want)
	}

	// From anything else that can publish on the subject: raw ESC and BEL
	// (not JSON any more); it is printed as a JSON string of its text.
	raw := strings.NewReplacer(`\u001b`, "\x1b", `\u0007`, "\x07").Replace(ev)
	got = tailOnce(t, srv, raw, "-o", "json")
	if r, ok := rawControl(got); ok {
		t.Fatalf("-o json printed a raw %U: %q", r, got)
	}
	var s string
	if err := json.Unmarshal([]byte(got), &s); err != nil || s != raw {
		t.Errorf("-o json of what is not JSON: %q (%v), want the text as a JSON string", got, err)
	}

	// A raw 0x9b byte (not UTF-8: an 8-bit terminal's CSI) in JSON that
	// is otherwise clean; JSON decoders read it as U+FFFD.
	csi := `{"specversion":"1.0","id":"u.1.updated","type":"io.kubebridge.configmaps.core.updated","subject":"ns/cm` + "\x9b" + `2J","time":"2026-11-21T20:00:00Z","kbrule":"r"}`
	for _, o := range []string{"json", "text"} {
		got = tailOnce(t, srv, csi, "-o", o)
		if r, ok := rawControl(got); ok {
			t.Fatalf("-o %s printed a raw %U: %q", o, r, got)
		}
		var e struct{ Subject string }
		if err := json.Unmarshal([]byte(got), &e); o == "json" && (err != nil || e.Subject != "ns/cm\uFFFD2J") {
			t.Errorf("-o json of %q printed %q (%v), want the subject as a JSON decoder reads it", csi, got, err)
		}
	}

	got = tailOnce(t, srv, ev, "-o", "text")
	if r, ok := rawControl(got); ok {
		t.Fatalf("-o text printed a raw %U: %q", r, got)
	}
	if !strings.Contains(got, `"ns/cm\x1b[2J\a"`) {
		t.Errorf("-o text does not show the subject escaped: %q", got)
	}
}

// `bridge tail --jetstream STREAM` reads the stream's own subjects, not
// only the default layout's k8s.>: a stream of custom subjects is printed.
func TestTailJetStreamFollowsTheStreamsSubjects(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MIRROR", Subjects: []string{"mirror.configmaps.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	ev := `{"specversion":"1.0","id":"u.1.deleted","type":"io.kubebridge.configmaps.core.deleted","subject":"ns/cm","time":"2026-11-21T20:00:00Z","kbrule":"r","kbchange":"deleted"}`
	if _, err := js.Publish(ctx, "mirror.configmaps.ns.cm", []byte(ev)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := newTailCommand()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--nats", srv.ClientURL(), "--jetstream", "MIRROR", "--count", "1", "--timeout", "10s"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("tail: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "deleted  configmaps") || !strings.Contains(out.String(), "ns/cm") {
		t.Errorf("printed %q, want the deletion of ns/cm", out.String())
	}
}

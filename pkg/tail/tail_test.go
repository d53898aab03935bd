package tail

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/internal/testenv"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
)

const updated = `{"specversion":"1.0","id":"u.7.updated","source":"kubebridge/demo","type":"io.kubebridge.deployments.apps.updated","subject":"demo/web","time":"2026-11-21T20:00:00.5Z","kbrule":"deps","kbcluster":"demo","data":{"object":{},"patch":[{"op":"replace","path":"/metadata/resourceVersion","value":"7"},{"op":"replace","path":"/spec/replicas","value":3},{"op":"remove","path":"/metadata/labels/x"}]}}`

// A hostile name or patch path (RBAC objects take almost any name) is
// printed quoted and escaped: it cannot send escape codes to the terminal.
func TestFormatEscapesHostileNames(t *testing.T) {
	ev := `{"specversion":"1.0","id":"u.1.updated","source":"kubebridge/demo","type":"io.kubebridge.roles.rbac%2Eauthorization%2Ek8s%2Eio.updated","subject":"ns/evil\u001b]0;pwned\u0007\u001b[2J` + "\x9b" + `2J","time":"2026-11-21T20:00:00Z","kbrule":"r","kbcluster":"demo","data":{"patch":[{"op":"add","path":"/metadata/labels/x\u009b31m","value":"\u007f"}]}}`
	got := Format("k8s.\x1b[31m", []byte(ev))
	if !utf8.ValidString(got) {
		t.Fatalf("bytes that are not UTF-8 printed: %q", got)
	}
	for _, r := range got {
		if r != '\n' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)) {
			t.Fatalf("control character %U printed: %q", r, got)
		}
	}
	if !strings.Contains(got, `"ns/evil\x1b]0;pwned\a\x1b[2J`+"\uFFFD"+`2J"`) || !strings.Contains(got, `"/metadata/labels/x\u009b31m"`) {
		t.Errorf("names not shown escaped: %q", got)
	}
	if got := Format("k8s.\x1b[31m", []byte("nope")); strings.ContainsRune(got, 0x1b) {
		t.Errorf("subject printed raw: %q", got)
	}
}

func TestFormat(t *testing.T) {
	got := Format("k8s.demo.apps.deployments.demo.web.updated", []byte(updated))
	ts := time.Date(2026, 11, 21, 20, 0, 0, 5e8, time.UTC).Local().Format("15:04:05.000")
	want := ts + " updated  deployments.apps             demo/web  (rule deps)\n    ~ /spec/replicas: 3\n    - /metadata/labels/x\n"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if got := Format("x", []byte("nope")); got != "?? x: not a kubebridge event (4 bytes)\n" {
		t.Errorf("junk: %q", got)
	}
}

func TestRunCountsCoreMessages(t *testing.T) {
	srv := testenv.StartNATS(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		done <- Run(ctx, Options{Connection: natssink.Config{URL: srv.ClientURL()}, Subject: "k8s.>", Count: 2}, &out)
	}()
	defer func() { cancel(); <-exited }() // Run ends with ctx, also when the test fails before it returned
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.After(5 * time.Second)
	for sent := 0; ; sent++ { // publish until tail, subscribing concurrently, has seen two
		_ = nc.Publish("k8s.demo.apps.deployments.demo.web.updated", []byte(updated))
		_ = nc.Publish("other.subject", []byte(updated))
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(out.Bytes(), []byte("demo/web")); n != 2 {
				t.Errorf("printed %d events:\n%s", n, out.String())
			}
			return
		case <-deadline:
			t.Fatal("tail did not stop after --count 2")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail authenticates as a nats sink does: against a server that requires
// a token, it reads with --token-file.
func TestRunWithToken(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Authorization: "s3cret", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Connection: natssink.Config{URL: srv.ClientURL(), TokenFile: tokenFile}, Subject: "k8s.>", Count: 1}, &out)
	}()
	nc, err := natsgo.Connect(srv.ClientURL(), natsgo.Token("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for {
		if err := nc.Publish("k8s.demo.apps.deployments.demo.web.updated", []byte(updated)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil || !strings.Contains(out.String(), "demo/web") {
				t.Fatalf("Run = %v, printed %q", err, out.String())
			}
			return
		case <-time.After(100 * time.Millisecond): // until tail has subscribed
		}
	}
}

// -o json never prints a byte that drives a terminal, whatever is
// published on the subject, and valid JSON stays the same JSON value.
func TestSafeJSON(t *testing.T) {
	for _, in := range []string{
		`{"a":"x\u001b[2Jy","b":"bel\u0007"}`,
		"{\"del\":\"x\x7fy\",\"c1\":\"\u0085\u009b\",\"ls\":\"\u2028\"}",
		"{\n\t\"spaced\": true\r\n}",
		"not json \x1b[2J \x07 \xff",
		"{\"csi8\":\"x\x9b2Jy\",\"\x9b\":\"\xc2\"}", // raw bytes, not UTF-8, that an 8-bit terminal reads as CSI
		"not json \x9b2J",
		`{"plain":"ok"}`,
	} {
		out := SafeJSON([]byte(in))
		if !utf8.Valid(out) {
			t.Errorf("SafeJSON(%q) = %q holds bytes that are not UTF-8", in, out)
		}
		for _, r := range string(out) {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029 {
				t.Errorf("SafeJSON(%q) = %q holds %U", in, out, r)
			}
		}
		if !json.Valid(out) {
			t.Errorf("SafeJSON(%q) = %q is not JSON", in, out)
			continue
		}
		var want, got any
		if json.Unmarshal([]byte(in), &want) == nil {
			if err := json.Unmarshal(out, &got); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("SafeJSON(%q) = %q: another value", in, out)
			}
		}
	}
	if got := SafeJSON([]byte(`{"plain":"ok"}`)); string(got) != `{"plain":"ok"}` {
		t.Errorf("clean JSON changed: %s", got)
	}
}

// With --jetstream and no subject, tail reads the stream whatever subjects
// it captures (not only the default layout's k8s.>); a subject given
// filters the stream's messages.
func TestRunReadsAStreamOfCustomSubjects(t *testing.T) {
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
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CMS", Subjects: []string{"cms.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"cms.demo.web.updated", "cms.demo.db.updated"} {
		body := strings.Replace(updated, `"subject":"demo/web"`, `"subject":"demo/`+strings.Split(subject, ".")[2]+`"`, 1)
		if _, err := js.Publish(ctx, subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		subject string
		count   int
		want    []string
	}{
		{"", 2, []string{"demo/web", "demo/db"}},      // the stream's own subjects
		{"cms.*.db.>", 1, []string{"demo/db"}},        // a filter given
		{"cms.>", 2, []string{"demo/web", "demo/db"}}, // the stream's subjects, spelled out
		{"k8s.>", 0, nil},                             // none of the stream's: refused
	} {
		var out bytes.Buffer
		runCtx, stop := context.WithTimeout(ctx, 10*time.Second)
		err := Run(runCtx, Options{Connection: natssink.Config{URL: srv.ClientURL()}, Stream: "CMS", Subject: tc.subject, Count: tc.count}, &out)
		stop()
		if tc.count == 0 {
			if want := "stream CMS captures cms.>; subject k8s.> matches none of its messages (leave --subject out to read the whole stream)"; err == nil || err.Error() != want {
				t.Errorf("subject %q: %v, want %s", tc.subject, err, want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("subject %q: %v (printed %q)", tc.subject, err, out.String())
		}
		var lines []string // an event's first line; its patch follows, indented
		for _, l := range strings.Split(out.String(), "\n") {
			if l != "" && !strings.HasPrefix(l, " ") {
				lines = append(lines, l)
			}
		}
		if len(lines) != len(tc.want) {
			t.Fatalf("subject %q: printed %q, want %v", tc.subject, out.String(), tc.want)
		}
		for i, w := range tc.want {
			if !strings.Contains(lines[i], " "+w+" ") {
				t.Errorf("subject %q: line %d is %q, want %s", tc.subject, i, lines[i], w)
			}
		}
	}
}

func TestCollide(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"k8s.>", "k8s.*.apps.deployments.prod.>", true},
		{"cms.>", "k8s.>", false},
		{"a.*.c", "a.b.*", true},
		{"a.*", "a.b.c", false},
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{">", "x", true},
		{"a.*.c", "a.>", true},
		{"a", "a.b", false},
	} {
		if got := collide(tc.a, tc.b); got != tc.want {
			t.Errorf("collide(%s, %s) = %v", tc.a, tc.b, got)
		}
		if got := collide(tc.b, tc.a); got != tc.want {
			t.Errorf("collide(%s, %s) = %v", tc.b, tc.a, got)
		}
	}
}

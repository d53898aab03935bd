package nats

import (
	"strings"
	"testing"
)

// FuzzSubject: the subject template check never panics, and what it
// accepts the renderer parses too.
func FuzzSubject(f *testing.F) {
	for _, s := range []string{DefaultSubject, "a.{", "{}", "a.}b", "k8s.{name}x{type}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ParseSubject(s) != nil {
			return
		}
		if _, err := parseTemplate(s); err != nil {
			t.Fatalf("ParseSubject accepts %q, parseTemplate refuses it: %v", s, err)
		}
	})
}

// Connection errors name the servers without their credentials or queries.
func TestRedactURLs(t *testing.T) {
	got := redact("nats://user:pw@a:4222, tls://tok@b:4443?x=secret,nats://c:4222")
	if strings.Contains(got, "pw") || strings.Contains(got, "tok") || strings.Contains(got, "secret") || !strings.Contains(got, "nats://c:4222") {
		t.Errorf("redact = %q", got)
	}
}

// A subject template with a control character would fail every event:
// refused at load.
func TestSubjectTemplateRefusesControlCharacters(t *testing.T) {
	for _, tmpl := range []string{"k8s.{name}\n", "k8s.a\rb.{name}", "k8s.\x7f.{name}", "k8s. .{name}"} {
		if ParseSubject(tmpl) == nil {
			t.Errorf("ParseSubject(%q) accepted", tmpl)
		}
	}
}

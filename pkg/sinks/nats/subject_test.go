package nats

import "testing"

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

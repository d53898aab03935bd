package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// What may be a secret in a URL never reaches a log or a message.
func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://receiver:8080/events", "http://receiver:8080/events"},
		{"https://hooks.slack.com/services/T0A1B2C3D/B0E4F5G6H/abcDEF123ghiJKL456mnoPQR", "https://hooks.slack.com/services/T0A1B2C3D/B0E4F5G6H/redacted"},
		{"https://discord.com/api/webhooks/123456789012345678/AbCdEf-GhIjKl_MnOpQr123StUvWxYz", "https://discord.com/api/webhooks/123456789012345678/redacted"},
		{"https://user:s3cret@example.com/hook?token=abc#frag", "https://redacted@example.com/hook?redacted"},
		{"https://example.com/api/v1/kubernetes-events-receiver", "https://example.com/api/v1/kubernetes-events-receiver"},
		{"http://[::1:bad/tok3n5ecret0123456789", "(unparsable URL)"},
		{"https://x.example/a%2Fb/tok3n5ecret0123456789ab?x=1", "https://x.example/a%2Fb/redacted?redacted"},
		// A Slack-style webhook's secret, whatever it looks like: short,
		// or without a digit (as about one Slack URL in 70 is).
		{"https://hooks.slack.com/services/T000/B000/XXXXXXXX", "https://hooks.slack.com/services/T000/B000/redacted"},
		{"https://hooks.slack.com/services/T0A1B2C3D/B0E4F5G6H/abcDEFghiJKLmnoPQRstuVWX", "https://hooks.slack.com/services/T0A1B2C3D/B0E4F5G6H/redacted"},
		{"https://chat.example.com/hooks/services/TEAM1/B2/s3cr3t?x=1", "https://chat.example.com/hooks/services/TEAM1/B2/redacted?redacted"},
		{"https://hooks.slack.com/services/T0A1B2C3D/B0E4F5G6H7I8J9K0L1M2N3/XXXXXXXX", "https://hooks.slack.com/services/T0A1B2C3D/redacted/redacted"}, // an id that looks like a token too
		{"https://api.example.com/services/users/list", "https://api.example.com/services/users/list"},                                                 // not Slack's shape
		{"https://api.example.com/services/T1/B2", "https://api.example.com/services/T1/B2"},
		// With userinfo.
		{"nats://tok3n@nats:4222", "nats://redacted@nats:4222"},
		{"https://u:p@hooks.slack.com/services/T000/B000/XXXXXXXX", "https://redacted@hooks.slack.com/services/T000/B000/redacted"},
		// Unparsable, holding a token: none of the text.
		{"https://hooks.example.com:xoxb1234secretsecret/x", UnparsableURL},
		{"https://example.com/%zzxoxb1234secretsecret", UnparsableURL},
		{"https://example.com/\x1b]0;xoxb1234secretsecret\x07", UnparsableURL},
		{"127.0.0.1:4222/xoxb1234secretsecret", UnparsableURL},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// ParseURL's errors say why a URL does not parse without any of its text,
// also unwrapped: url.Parse's quote the URL, and the error they wrap the
// piece that failed (a port, an escape), where a token may be.
func TestParseURLErrorsShowNoneOfTheURL(t *testing.T) {
	const secret = "xoxb1234secret"
	for _, tc := range []struct{ in, why string }{
		{"https://hooks.example.com:" + secret + "/x", "unparsable URL: invalid port after host"},
		{"http://[::1/" + secret, "unparsable URL: missing ']' in host"},
		{"https://example.com/%zz" + secret, "unparsable URL: invalid URL escape"},
		{"https://exa mple" + secret + ".com/", "unparsable URL: invalid character in host name"},
		{"https://example.com/\x1b" + secret, "unparsable URL: invalid control character in URL"},
		{"127.0.0.1:4222/" + secret, "unparsable URL: first path segment in URL cannot contain colon"},
		{":" + secret, "unparsable URL: missing protocol scheme"},
	} {
		u, err := ParseURL(tc.in)
		if err == nil {
			t.Errorf("ParseURL(%q) = %v, want an error", tc.in, u)
			continue
		}
		if err.Error() != tc.why || !errors.Is(err, ErrUnparsableURL) {
			t.Errorf("ParseURL(%q): %q, want %q", tc.in, err, tc.why)
		}
		for e := err; e != nil; e = errors.Unwrap(e) {
			if s := fmt.Sprintf("%v %+v %#v", e, e, e); strings.Contains(s, secret) {
				t.Errorf("ParseURL(%q): the error shows the URL: %s", tc.in, s)
			}
		}
	}
	if u, err := ParseURL("http://receiver:8080/events"); err != nil || u.Host != "receiver:8080" || u.Path != "/events" {
		t.Errorf("ParseURL: %v, %v", u, err)
	}
}

package config

import "testing"

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
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

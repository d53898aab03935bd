package bridgecmd

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Profiles show internals and cost CPU: they are served on loopback only,
// never on the admin address the cluster can reach.
func TestProfilingListensOnLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:0", "[::]:0", "example.com:0"} {
		if ln, err := listenLoopback(addr); err == nil {
			ln.Close()
			t.Errorf("listenLoopback(%q) accepted", addr)
		}
	}
	ln, err := listenLoopback("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serve(ln, profilingHandler())
	defer stop()
	resp, err := http.Get("http://" + ln.Addr().String() + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(body) == 0 {
		t.Errorf("pprof: %d %q", resp.StatusCode, body)
	}
}

// bridge tail as the README shows it (no TLS flags): it runs, and with no
// server it gives up at --timeout with exit status 1, not a crash.
func TestTailWithoutTLSFlags(t *testing.T) {
	r := runBridge(t, "tail", "--nats", "nats://127.0.0.1:1", "--timeout", "1s", "--count", "1")
	if r.code != 1 || strings.Contains(r.stderr, "panic") || !strings.Contains(r.stderr, "got 0 of 1 events") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// bridge replay sends its token in clear only to loopback.
func TestReplayKeepsTheTokenOffPlainHTTP(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBridge(t, "replay", "--admin", "http://192.0.2.1:8080", "--sink", "s", "--token-file", tok)
	if r.code != 2 || !strings.Contains(r.stderr, "a token is not sent over plain http beyond loopback") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

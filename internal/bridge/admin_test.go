package bridge

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// The admin endpoints answer before the bridge started: alive, not ready,
// metrics say it does not deliver, and /replay refuses what it cannot do.
func TestAdminEndpointsBeforeStart(t *testing.T) {
	b := New(Options{Config: &config.Config{}, Logger: discard})
	srv := httptest.NewServer(b.AdminHandler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
		body         string
	}{
		{"GET", "/healthz", 200, "ok"},
		{"GET", "/readyz", 503, "not ready"},
		{"GET", "/metrics", 200, "kubebridge_leader 0"},
		{"GET", "/replay?sink=a", 405, "POST only"},
		{"POST", "/replay?sink=a", 401, "a bearer token is required"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.body) {
			t.Errorf("%s %s = %d %q, want %d with %q", tc.method, tc.path, resp.StatusCode, body, tc.code, tc.body)
		}
	}
}

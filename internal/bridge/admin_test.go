package bridge

import (
	"fmt"
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

// Every token that is not in the cache costs the apiserver a TokenReview
// and a SubjectAccessReview: a flood of made-up tokens is cut off before
// them (429), whatever the apiserver would answer.
func TestReplayReviewsAreRateLimited(t *testing.T) {
	b := New(Options{Config: &config.Config{}, Logger: discard})
	srv := httptest.NewServer(b.AdminHandler())
	defer srv.Close()
	codes := map[int]int{}
	for i := range 40 {
		req, _ := http.NewRequest("POST", srv.URL+"/replay?sink=a", nil)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer junk-%d", i))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[http.StatusTooManyRequests] < 15 || codes[http.StatusServiceUnavailable] > 25 {
		t.Errorf("answers %v: want most of a burst of 40 refused with 429 before any review", codes)
	}
}

// One client's flood of made-up tokens is cut off by its own limit (five
// at once) and leaves the shared budget of reviews to another client,
// whose first attempts still reach the review (503 here: no cluster).
func TestReplayReviewsAreLimitedPerClient(t *testing.T) {
	b := New(Options{Config: &config.Config{}, Logger: discard})
	h := b.AdminHandler()
	try := func(addr string, i int) int {
		req := httptest.NewRequest("POST", "/replay?sink=a", nil)
		req.RemoteAddr = addr
		req.Header.Set("Authorization", fmt.Sprintf("Bearer junk-%s-%d", addr, i))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	flood := map[int]int{}
	for i := range 100 {
		flood[try("10.0.0.1:1234", i)]++
	}
	if flood[http.StatusServiceUnavailable] > 6 || flood[http.StatusTooManyRequests] < 94 {
		t.Errorf("the flooding client got %v: want all but its first five refused with 429", flood)
	}
	for i := range 3 {
		if code := try("10.0.0.2:999", i); code != http.StatusServiceUnavailable {
			t.Errorf("another client's attempt %d = %d, want 503 (reviewed, no cluster to ask)", i, code)
		}
	}
}

package admin

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Every token that is not in the cache costs the apiserver a TokenReview
// and a SubjectAccessReview: a flood of made-up tokens is cut off before
// them (429), whatever the apiserver would answer.
func TestReplayReviewsAreRateLimited(t *testing.T) {
	srv := httptest.NewServer(New(Options{Target: notStarted{}, Metrics: http.NotFoundHandler()}).Handler())
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
	h := New(Options{Target: notStarted{}, Metrics: http.NotFoundHandler()}).Handler()
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

// notStarted is a bridge that has not started: not ready, no sink.
type notStarted struct{}

func (notStarted) Checks() []Check {
	return []Check{{Name: "informers", Err: errors.New("not ready")}}
}

func (notStarted) ReplayRules(sink, _ string) ([]string, error) {
	return nil, errors.New("no running sink " + sink)
}

func (notStarted) Replay(string, string) int { return 0 }

package testenv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Alertmanager is a real alertmanager process on loopback (built by
// hack/tools/build.sh), stopped when the test ends.
type Alertmanager struct {
	// URL is its base URL, e.g. http://127.0.0.1:29093.
	URL string
	p   *process
}

// StartAlertmanager starts alertmanager with a config that routes every
// alert to a receiver that sends nothing, and waits until it is ready.
func StartAlertmanager(t testing.TB) *Alertmanager {
	t.Helper()
	bin := Tool(t, "alertmanager")
	if _, err := os.Stat(bin); err != nil {
		SkipOrFail(t, fmt.Errorf("alertmanager not built: run `make tools`: %w", err))
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte("route:\n  receiver: none\nreceivers:\n  - name: none\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := FreePort()
	p, err := startProcess("alertmanager", bin, []string{
		"--config.file=" + cfg, "--storage.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:" + strconv.Itoa(port), "--cluster.listen-address=",
	}, filepath.Join(dir, "alertmanager.log"))
	if err != nil {
		t.Fatal(err)
	}
	am := &Alertmanager{URL: "http://127.0.0.1:" + strconv.Itoa(port), p: p}
	t.Cleanup(func() { _ = p.stop(10 * time.Second) })
	ready := Poll(30*time.Second, 100*time.Millisecond, func() bool {
		resp, err := http.Get(am.URL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ready {
		t.Fatalf("alertmanager not ready after 30s:\n%s", p.logTail())
	}
	return am
}

// Alert is an alert as alertmanager's API v2 returns it.
type Alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
	Status      struct {
		State string `json:"state"`
	} `json:"status"`
}

// Active returns the alerts alertmanager holds as active now.
func (am *Alertmanager) Active(t testing.TB) []Alert {
	t.Helper()
	resp, err := http.Get(am.URL + "/api/v2/alerts?active=true&silenced=false&inhibited=false")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []Alert
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

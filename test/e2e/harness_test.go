// Package e2e runs the bridge binary as a subprocess against the real
// control plane of internal/testenv and checks what its sinks receive.
// startBridge (launch_test.go) runs `bridge run`, with options for what a
// test needs otherwise; eventually and poll wait for what it delivers.
//
// A test whose namespaces, Leases, streams, buckets and ports are its own,
// or that starts a control plane of its own, calls t.Parallel. One that
// sets the environment (t.Setenv), measures the shared control plane
// (its watch counts) or changes what is cluster-wide there (CRDs, the
// chart's RBAC when installed) does not: go test runs those first, one
// at a time. The chart tests that only render (helm template) are parallel.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

var bridgeBin string

// The bridge is built with the race detector: the e2e runs double as a race
// test of the whole pipeline. The bridges inherit the environment, and
// client-go's own CBOR switch must not decide for them (TestKubeCBOR says
// --kube-cbor where it matters): it is unset for the whole package, before
// any test runs, rather than by a test (t.Setenv keeps a test serial).
func TestMain(m *testing.M) {
	if err := os.Unsetenv("KUBE_FEATURE_ClientsAllowCBOR"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testenv.MainWithBridge(m, true, &bridgeBin)
}

// ce is one delivered CloudEvent as a consumer sees it.
type ce struct {
	SpecVersion string `json:"specversion"`
	ID          string `json:"id"`
	Source      string `json:"source"`
	Type        string `json:"type"`
	Subject     string `json:"subject"`
	Time        string `json:"time"`
	Rule        string `json:"kbrule"`
	Cluster     string `json:"kbcluster"`
	Replay      string `json:"kbreplay"`
	Reason      string `json:"kbreason"`
	Change      string `json:"kbchange"`
	Data        ceData `json:"data"`
	raw         []byte
}

type ceData struct {
	Object    map[string]any   `json:"object"`
	OldObject map[string]any   `json:"oldObject"`
	Patch     []map[string]any `json:"patch"`
}

// change is the last token of the type: added, updated or deleted.
func (e ce) change() string { return e.Type[strings.LastIndex(e.Type, ".")+1:] }

// readEvents parses the JSON-lines file at path (missing: none yet). A
// last line without its newline is a write still in progress (a reader
// can see a large write to a regular file half done): it is left for the
// next read, as any tailing consumer does.
func readEvents(t *testing.T, path string) []ce {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []ce
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		var e ce
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("%s: bad line %q: %v", path, line, err)
		}
		e.raw = line
		out = append(out, e)
	}
	return out
}

// waitEvents polls path until cond holds for the events so far.
func waitEvents(t *testing.T, path string, what string, cond func([]ce) bool) []ce {
	t.Helper()
	var evs []ce
	eventually(t, 30*time.Second, func() error {
		if evs = readEvents(t, path); cond(evs) {
			return nil
		}
		var lines []string
		for _, e := range evs {
			lines = append(lines, fmt.Sprintf("%s %s %s %s", e.Rule, e.change(), e.Subject, e.Reason))
		}
		return fmt.Errorf("waiting for %s; have:\n  %s", what, strings.Join(lines, "\n  "))
	})
	return evs
}

// of returns the changes rule delivered for subject, in order, as
// "added", "updated", "deleted" or "deleted:unmatched".
func of(evs []ce, rule, subject string) []string {
	var out []string
	for _, e := range evs {
		if e.Rule == rule && e.Subject == subject {
			c := e.change()
			if e.Reason != "" {
				c += ":" + e.Reason
			}
			out = append(out, c)
		}
	}
	return out
}

func has(evs []ce, rule, subject string, changes ...string) bool {
	got := of(evs, rule, subject)
	if len(got) != len(changes) {
		return false
	}
	for i := range got {
		if got[i] != changes[i] {
			return false
		}
	}
	return true
}

// eventually calls check every 50ms until it returns nil; once timeout
// has passed, it fails t with check's last error, which says what was
// missing. (testenv.Await polls at another interval.)
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	testenv.Await(t, timeout, 50*time.Millisecond, check)
}

// poll calls cond every 50ms until it holds or timeout has passed, and
// reports whether it held. For a caller that asserts on its own
// afterwards, so that a timeout shows what was received.
func poll(timeout time.Duration, cond func() bool) bool {
	return testenv.Poll(timeout, 50*time.Millisecond, cond)
}

// mustRead is the content of the file at path.
func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	must(t, err)
	return string(data)
}

// fileConfig is a config whose one sink, "out", appends to path, with rules.
func fileConfig(path string, rules ...string) string {
	return "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: e2e\nsinks:\n  - name: out\n    file: {path: " + path + "}\nrules:\n" + strings.Join(rules, "")
}

// rule is a rule on resource in namespaces that delivers to "out".
func rule(name, resource string, namespaces ...string) string {
	return "  - name: " + name + "\n    resource: " + resource + "\n    namespaces: [" + strings.Join(namespaces, ", ") + "]\n    sinks: [out]\n"
}

// Package e2e runs the bridge binary as a subprocess against the real
// control plane of internal/testenv and checks what its sinks receive.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

var bridgeBin string

// The bridge is built with the race detector: the e2e runs double as a race
// test of the whole pipeline.
func TestMain(m *testing.M) { testenv.MainWithBridge(m, true, &bridgeBin) }

// bridgeProc is a running `bridge run`.
type bridgeProc struct {
	cmd        *exec.Cmd
	configPath string
	logPath    string
	done       chan struct{}
	err        error
}

// startBridge runs the bridge with config against cp and waits until it
// has synced its caches. It is stopped (SIGTERM, clean exit required) when
// the test ends.
func startBridge(t *testing.T, cp *testenv.ControlPlane, config string) *bridgeProc {
	t.Helper()
	return startBridgeArgs(t, cp, config)
}

// startBridgeArgs is startBridge with more flags for bridge run.
func startBridgeArgs(t *testing.T, cp *testenv.ControlPlane, config string, extra ...string) *bridgeProc {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := cp.Kubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := &bridgeProc{logPath: filepath.Join(dir, "bridge.log"), done: make(chan struct{}), configPath: cfgPath}
	logFile, err := os.Create(b.logPath)
	if err != nil {
		t.Fatal(err)
	}
	b.cmd = exec.Command(bridgeBin, append([]string{"run", "--config", cfgPath, "--kubeconfig", kc, "--log-format", "text", "--log-level", "debug",
		"--checkpoint-file", filepath.Join(dir, "state.db"), "--admin-addr", "127.0.0.1:0", "--admin-addr-file", adminAddrFile(b.logPath),
		"--credential-dirs", os.TempDir()}, extra...)...) // the tests' secrets are in their temp dirs
	b.cmd.Stdout, b.cmd.Stderr = logFile, logFile
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		b.err = b.cmd.Wait()
		logFile.Close()
		close(b.done)
	}()
	t.Cleanup(func() { b.stop(t) })
	deadline := time.After(60 * time.Second)
	for !strings.Contains(b.log(), "bridge started") {
		select {
		case <-b.done:
			t.Fatalf("bridge exited before it started (%v):\n%s", b.err, b.log())
		case <-deadline:
			t.Fatalf("bridge not started after 60s:\n%s", b.log())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return b
}

func (b *bridgeProc) log() string {
	data, _ := os.ReadFile(b.logPath)
	return string(data)
}

// stop sends SIGTERM and requires a clean exit within 30s.
func (b *bridgeProc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
		if b.err != nil {
			t.Errorf("bridge exited with %v:\n%s", b.err, b.log())
		}
		if strings.Contains(b.log(), "WARNING: DATA RACE") {
			t.Errorf("the race detector fired:\n%s", b.log())
		}
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
		t.Errorf("bridge did not stop within 30s of SIGTERM:\n%s", b.log())
	}
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

// readEvents parses the JSON-lines file at path (missing: none yet).
func readEvents(t *testing.T, path string) []ce {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := readEvents(t, path)
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, e := range evs {
				lines = append(lines, fmt.Sprintf("%s %s %s %s", e.Rule, e.change(), e.Subject, e.Reason))
			}
			t.Fatalf("timed out waiting for %s; have:\n  %s", what, strings.Join(lines, "\n  "))
		}
		time.Sleep(50 * time.Millisecond)
	}
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

// adminURL is the bridge's admin endpoint.
func (b *bridgeProc) adminURL(t *testing.T) string {
	t.Helper()
	u, err := adminURLOf(b.logPath)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.log())
	}
	return u
}

// adminAddrFile is where a bridge logging to logPath writes its admin
// address (bridge run --admin-addr-file); each start rewrites it.
func adminAddrFile(logPath string) string { return logPath + ".admin" }

// adminURLOf is the admin endpoint of the bridge logging to logPath, as it
// wrote it (the latest start's).
func adminURLOf(logPath string) (string, error) {
	data, err := os.ReadFile(adminAddrFile(logPath))
	if err != nil {
		return "", fmt.Errorf("no admin address: %w", err)
	}
	return "http://" + strings.TrimSpace(string(data)), nil
}

// fileConfig is a config whose one sink, "out", appends to path, with rules.
func fileConfig(path string, rules ...string) string {
	return "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: e2e\nsinks:\n  - name: out\n    file: {path: " + path + "}\nrules:\n" + strings.Join(rules, "")
}

// rule is a rule on resource in namespaces that delivers to "out".
func rule(name, resource string, namespaces ...string) string {
	return "  - name: " + name + "\n    resource: " + resource + "\n    namespaces: [" + strings.Join(namespaces, ", ") + "]\n    sinks: [out]\n"
}

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// TestExecPlugins runs the bridge with an exec sink for each example plugin
// (examples/plugins: Python and Go) over ConfigMaps: every event reaches
// the plugin's audit file, one labelled retry-once after its retry, one
// labelled permanent lands in the dead-letter, one labelled crash once
// restarts the plugin, and a plugin killed mid-stream is restarted with no
// event lost.
func TestExecPlugins(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	root, err := testenv.RepoRoot()
	must(t, err)
	for _, tc := range []struct {
		name    string
		command func(t *testing.T) []string
	}{
		{"python", func(t *testing.T) []string {
			if _, err := exec.LookPath("python3"); err != nil {
				testenv.SkipOrFail(t, fmt.Errorf("python3 not found: %w", err))
			}
			return []string{"python3", filepath.Join(root, "examples/plugins/python/audit.py")}
		}},
		{"go", func(t *testing.T) []string {
			bin := filepath.Join(t.TempDir(), "audit")
			build := exec.Command("go", "build", "-o", bin, "./examples/plugins/go")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("building the Go example plugin: %v\n%s", err, out)
			}
			return []string{bin}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testExecPlugin(t, cp, "plugins-"+tc.name, tc.command(t)) })
	}
}

func testExecPlugin(t *testing.T, cp *testenv.ControlPlane, ns string, command []string) {
	testenv.EnsureNamespace(t, cp, ns)
	dir := t.TempDir()
	auditFile, deadLetters := filepath.Join(dir, "audit.log"), filepath.Join(dir, "dead.jsonl")
	quoted := make([]string, len(command))
	for i, arg := range command {
		quoted[i] = strconv.Quote(arg)
	}
	cfg := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: e2e
sinks:
  - name: audit
    exec:
      command: [` + strings.Join(quoted, ", ") + `]
      env: {AUDIT_FILE: ` + strconv.Quote(auditFile) + `}
    retry: {initialInterval: 50ms, maxInterval: 1s}
    deadLetter: {file: ` + deadLetters + `}
rules:
  - name: cms
    resource: v1/configmaps
    namespaces: [` + ns + `]
    sinks: [audit]
`
	// exec sinks run programs as the bridge: refused unless bridge run
	// allows them (chart value allowExecPlugins).
	refused := filepath.Join(dir, "refused.yaml")
	must(t, os.WriteFile(refused, []byte(cfg), 0o600))
	kc, err := cp.Kubeconfig(dir)
	must(t, err)
	out, code := runBridgeCommand(t, "run", "--config", refused, "--kubeconfig", kc, "--admin-addr", "", "--checkpoint-file", filepath.Join(dir, "refused.db"))
	if code != 2 || !strings.Contains(out, "sinks[0].exec: exec plugins run programs named in the config, as the bridge: start the bridge with --allow-exec-plugins") {
		t.Errorf("without --allow-exec-plugins: exit %d\n%s", code, out)
	}
	b := startBridge(t, cp, cfg, withFlags("--allow-exec-plugins"))
	cs := cp.Clientset(t)
	create := func(name string, labels map[string]string) {
		t.Helper()
		_, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		must(t, err)
	}

	// The knobs: a retry, a refusal, a crash.
	create("plain", nil)
	create("retry", map[string]string{"audit.kubebridge.io/fail": "retry-once"})
	create("poison", map[string]string{"audit.kubebridge.io/fail": "permanent"})
	create("boom", map[string]string{"audit.kubebridge.io/crash": "once"})
	audit := waitAudit(t, auditFile, "plain, retry and boom", func(a map[string]auditLine) bool {
		return a[ns+"/plain"].ID != "" && a[ns+"/retry"].ID != "" && a[ns+"/boom"].ID != ""
	})
	if l := audit[ns+"/plain"]; l.Type != "io.kubebridge.configmaps.core.added" {
		t.Errorf("audit line %+v", l)
	}
	if _, ok := audit[ns+"/poison"]; ok {
		t.Errorf("the refused event reached the audit file")
	}
	seen := mustRead(t, auditFile+".seen")
	for _, k := range []string{"retry " + audit[ns+"/retry"].ID, "crash " + audit[ns+"/boom"].ID} {
		if !strings.Contains(seen, k+"\n") {
			t.Errorf("the plugin's seen file lacks %q (the event arrived without the failure first):\n%s", k, seen)
		}
	}
	dead := waitDeadLetter(t, deadLetters, ns+"/poison")
	if dead.Sink != "audit" || !strings.Contains(dead.Error, "labelled audit.kubebridge.io/fail=permanent") {
		t.Errorf("dead-letter record %+v", dead)
	}
	if log := b.log(); !strings.Contains(log, "plugin stopped; restarting it") || !strings.Contains(log, "exit status 3") {
		t.Errorf("the crash and restart are not in the bridge's log:\n%s", log)
	}

	// A kill mid-stream: the plugin restarts, nothing is lost.
	const total = 40
	for i := range total {
		create(fmt.Sprintf("m-%d", i), nil)
		if i == total/4 {
			waitAudit(t, auditFile, "the stream under way", func(a map[string]auditLine) bool { return a[ns+"/m-0"].ID != "" })
			pid := pluginPid(t, b, command)
			must(t, syscall.Kill(pid, syscall.SIGKILL))
			testenv.Eventually(t, 30*time.Second, "a new plugin process", func() bool {
				p, ok := findPluginPid(b, command)
				return ok && p != pid
			})
		}
	}
	waitAudit(t, auditFile, fmt.Sprintf("all %d streamed configmaps", total), func(a map[string]auditLine) bool {
		for i := range total {
			if a[fmt.Sprintf("%s/m-%d", ns, i)].ID == "" {
				return false
			}
		}
		return true
	})
	if n := strings.Count(b.log(), `msg="plugin started"`); n != 3 {
		t.Errorf("the plugin started %d times, want 3 (at start, after the crash, after the kill):\n%s", n, b.log())
	}
}

// auditLine is one line of the example plugins' audit file.
type auditLine struct{ ID, Type, Subject string }

// waitAudit polls the audit file (by subject, the last line wins) until cond holds.
func waitAudit(t *testing.T, path, what string, cond func(map[string]auditLine) bool) map[string]auditLine {
	t.Helper()
	var got map[string]auditLine
	testenv.Eventually(t, 60*time.Second, what+" in the audit file", func() bool {
		got = map[string]auditLine{}
		data, _ := os.ReadFile(path)
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Split(l, "\t"); len(f) == 3 {
				got[f[2]] = auditLine{ID: f[0], Type: f[1], Subject: f[2]}
			}
		}
		return cond(got)
	})
	return got
}

type deadLetterRecord struct {
	Sink  string `json:"sink"`
	Error string `json:"error"`
	Event ce     `json:"event"`
}

// waitDeadLetter waits for the dead-letter record of subject.
func waitDeadLetter(t *testing.T, path, subject string) deadLetterRecord {
	t.Helper()
	var rec deadLetterRecord
	testenv.Eventually(t, 60*time.Second, subject+" in the dead-letter", func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r deadLetterRecord
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.Event.Subject == subject {
				rec = r
				return true
			}
		}
		return false
	})
	return rec
}

// pluginPid returns the pid of the bridge's plugin process.
func pluginPid(t *testing.T, b *bridgeProc, command []string) int {
	t.Helper()
	var pid int
	testenv.Eventually(t, 30*time.Second, "the plugin process", func() bool {
		var ok bool
		pid, ok = findPluginPid(b, command)
		return ok
	})
	return pid
}

// findPluginPid finds a live child of the bridge whose command line holds
// the plugin's last argument (its script or binary).
func findPluginPid(b *bridgeProc, command []string) (int, bool) {
	parent := strconv.Itoa(b.cmd.Process.Pid)
	marker := command[len(command)-1]
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[0] == "Z" || fields[1] != parent {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmdline), marker) {
			return pid, true
		}
	}
	return 0, false
}

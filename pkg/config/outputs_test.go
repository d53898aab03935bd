package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	. "github.com/kubebridge/kubebridge/pkg/config"
)

// outputsConfig is a config with a file sink and two dead-letters, each
// path given; its key paths are sinks[0].file.path, sinks[1].deadLetter.file
// and sinks[2].deadLetter.file.
func outputsConfig(t *testing.T, sink, dl1, dl2 string) *Config {
	t.Helper()
	return mustParse(t, fmt.Sprintf(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
checkpoint: {file: /var/lib/kubebridge/state.db}
sinks:
  - name: archive
    file: {path: %q, maxBackups: 3}
  - name: hook
    webhook: {url: "https://hooks.example.com/k8s"}
    deadLetter: {file: %q}
  - name: alerts
    webhook: {url: "https://hooks.example.com/alerts", bearerTokenFile: /etc/kubebridge/hook/token}
    deadLetter: {file: %q, maxBackups: 2}
rules:
  - {name: r, resource: v1/configmaps, sinks: [archive, hook, alerts]}
`, sink, dl1, dl2))
}

var protected = Protected{ConfigFile: "/etc/kubebridge/config/config.yaml", CheckpointFile: "/var/lib/kubebridge/state.db"}

// An output file (a file sink, a file dead-letter), or one of its rotated
// copies, can never be the checkpoint, the config, another output, a
// credential or a special file; each refusal names its key.
func TestOutputFilesAreConfined(t *testing.T) {
	const ok1, ok2, ok3 = "/var/log/kubebridge/events.jsonl", "/var/lib/kubebridge/dead/hook.jsonl", "/var/lib/kubebridge/dead/alerts.jsonl"
	if got := ConfineOutputFiles(outputsConfig(t, ok1, ok2, ok3), protected, false); len(got) != 0 {
		t.Fatalf("a config with outputs apart: %v", got)
	}
	if got := ConfineOutputFiles(outputsConfig(t, "-", ok2, ok3), protected, false); len(got) != 0 {
		t.Fatalf("stdout: %v", got)
	}
	for _, tc := range []struct {
		name          string
		sink, d1, d2  string
		path, message string
	}{
		{"dead-letter is the checkpoint", ok1, ok2, "/var/lib/kubebridge/state.db", "sinks[2].deadLetter.file", "/var/lib/kubebridge/state.db is the checkpoint file"},
		{"not clean", ok1, ok2, "/var/lib/kubebridge/dead/../state.db", "sinks[2].deadLetter.file", "/var/lib/kubebridge/dead/../state.db is the checkpoint file (/var/lib/kubebridge/state.db)"},
		{"a rotated copy is the checkpoint", ok1, "/var/lib/kubebridge/state", ok3, "sinks[1].deadLetter.file", "/var/lib/kubebridge/state would replace the checkpoint file (/var/lib/kubebridge/state.1) when it rotates"},
		{"sink is the config", "/etc/kubebridge/config/config.yaml", ok2, ok3, "sinks[0].file.path", "/etc/kubebridge/config/config.yaml is the config file"},
		{"two outputs share a file", ok1, ok2, ok2, "sinks[2].deadLetter.file", "/var/lib/kubebridge/dead/hook.jsonl is sinks[1].deadLetter.file's file or one of its rotated copies"},
		{"a dead-letter is a sink's rotated copy", ok1, ok1 + ".3", ok3, "sinks[1].deadLetter.file", "/var/log/kubebridge/events.jsonl.3 is sinks[0].file.path's file or one of its rotated copies"},
		{"a credential file", ok1, "/etc/kubebridge/hook/token", ok3, "sinks[1].deadLetter.file", "/etc/kubebridge/hook/token is the credential file of sinks[2].webhook.bearerTokenFile"},
		{"service-account directory", ok1, ok2, "/var/run/secrets/kubernetes.io/serviceaccount/token", "sinks[2].deadLetter.file", "/var/run/secrets/kubernetes.io/serviceaccount/token is in the pod's service-account directory (/var/run/secrets)"},
		{"a device", "/dev/full", ok2, ok3, "sinks[0].file.path", `/dev/full is in /dev, which holds special files, not files to append to ("-" writes to stdout)`},
		{"relative", "events.jsonl", ok2, ok3, "sinks[0].file.path", "events.jsonl is not an absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := protected
			if tc.name == "a rotated copy is the checkpoint" {
				p.CheckpointFile = "/var/lib/kubebridge/state.1"
			}
			got := ConfineOutputFiles(outputsConfig(t, tc.sink, tc.d1, tc.d2), p, false)
			if len(got) != 1 || got[0].Path != tc.path || !matchMessage(got[0].Message, tc.message) {
				t.Errorf("got %v\nwant %s: %s", got, tc.path, tc.message)
			}
			if len(got) == 1 && !strings.HasPrefix(got[0].Format("c.yaml"), fmt.Sprintf("c.yaml:%d: %s: ", got[0].Line, tc.path)) {
				t.Errorf("formatted without its line and key: %s", got[0].Format("c.yaml"))
			}
		})
	}
}

// matchMessage matches a message exactly, or by prefix when want ends in "…".
func matchMessage(got, want string) bool {
	if p, ok := strings.CutSuffix(want, "…"); ok {
		return strings.HasPrefix(got, p)
	}
	return got == want
}

// With links resolved (bridge run), an output reached through a link to
// the checkpoint, a link at the output, a second hard link or a FIFO are
// refused too.
func TestOutputFilesResolved(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state", "state.db")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Dir(state), 0o700))
	must(os.WriteFile(state, []byte("checkpoint"), 0o600))
	must(os.Symlink(filepath.Join(dir, "state"), filepath.Join(dir, "logs"))) // logs -> state
	must(os.Symlink(state, filepath.Join(dir, "link.jsonl")))
	must(os.WriteFile(filepath.Join(dir, "token"), []byte("secret"), 0o600))
	must(os.Link(filepath.Join(dir, "token"), filepath.Join(dir, "hard.jsonl")))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo.jsonl"), 0o600))
	p := Protected{CheckpointFile: state}
	fine := filepath.Join(dir, "out.jsonl")
	for _, tc := range []struct{ file, message string }{
		{filepath.Join(dir, "logs", "state.db"), "is the checkpoint file (" + state + ")"},
		{filepath.Join(dir, "link.jsonl"), "is a symbolic link: the bridge writes only regular files, never through a link"},
		{filepath.Join(dir, "hard.jsonl"), "has 2 hard links: the bridge writes only files no other name reaches"},
		{filepath.Join(dir, "fifo.jsonl"), "is a named pipe (FIFO), not a regular file: the bridge writes only regular files"},
	} {
		got := ConfineOutputFiles(outputsConfig(t, fine, tc.file, filepath.Join(dir, "other.jsonl")), p, true)
		if len(got) != 1 || got[0].Path != "sinks[1].deadLetter.file" || got[0].Message != tc.file+" "+tc.message {
			t.Errorf("%s: got %v, want sinks[1].deadLetter.file: %s %s", tc.file, got, tc.file, tc.message)
		}
	}
}

// Each rotation renames every rotated copy: their number is bounded, for
// a file sink and a file dead-letter alike.
func TestMaxBackupsIsBounded(t *testing.T) {
	doc := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
sinks:
  - name: archive
    file: {path: /var/log/kb/events.jsonl, maxBackups: 101}
  - name: hook
    webhook: {url: "https://hooks.example.com/k8s"}
    deadLetter: {file: /var/log/kb/dead.jsonl, maxBackups: 1000000000}
rules:
  - {name: r, resource: v1/configmaps, sinks: [archive, hook]}
`
	_, _, err := Parse("c.yaml", []byte(doc), types)
	for _, want := range []string{
		"c.yaml:6: sinks[0].file.maxBackups: must be at most 100 (each rotation renames every copy), got 101",
		"c.yaml:9: sinks[1].deadLetter.maxBackups: must be at most 100 (each rotation renames every copy), got 1000000000",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v\nwant %s", err, want)
		}
	}
}

// Command demo runs kubebridge on a self-contained local setup: a real etcd
// and kube-apiserver (built by `make tools`), the bridge with config/demo.yaml
// and its embedded NATS server, and `bridge tail` printing the events that
// sample objects cause. `make demo` runs it; with --ci it exits once the
// sample events arrived (non-zero if they did not).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
	natssink "github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/tail"
)

// sampleEvents is what the sample steps cause: settings added, updated and
// deleted; web added and scaled.
const sampleEvents = 5

func main() {
	ci := flag.Bool("ci", false, "non-interactive: exit once the sample events arrived")
	flag.Parse()
	if err := run(*ci); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ci bool) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	tools, err := testenv.ToolsDir()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kubebridge-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	say("starting etcd and kube-apiserver on 127.0.0.1")
	cp, err := testenv.NewControlPlane(tools, dir)
	if err != nil {
		return err
	}
	defer cp.Stop()
	kc, err := cp.Kubeconfig(dir)
	if err != nil {
		return err
	}
	say("kube-apiserver ready at %s (kubeconfig: %s)", cp.Host, kc)

	bridgeBin := filepath.Join(dir, "bridge")
	if out, err := exec.Command("go", "build", "-o", bridgeBin, filepath.Join(root, "cmd", "bridge")).CombinedOutput(); err != nil {
		return fmt.Errorf("building bridge: %v\n%s", err, out)
	}
	logPath := filepath.Join(dir, "bridge.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	bridge := exec.Command(bridgeBin, "run", "--config", filepath.Join(root, "config", "demo.yaml"), "--kubeconfig", kc, "--log-format", "text",
		"--checkpoint-file", filepath.Join(dir, "state.db"), "--admin-addr", "127.0.0.1:0")
	bridge.Env = append(os.Environ(), "KUBEBRIDGE_DATA_DIR="+dir)
	bridge.Stdout, bridge.Stderr = logFile, logFile
	bridge.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	say("starting: bridge run --config config/demo.yaml (log: %s)", logPath)
	if err := bridge.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- bridge.Wait() }()
	defer func() {
		_ = bridge.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = bridge.Process.Kill()
		}
	}()
	if err := waitForLog(logPath, "bridge started", exited, 60*time.Second); err != nil {
		return err
	}
	say("bridge running; tailing NATS subject k8s.> from stream K8S:")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tailCtx, cancelTail := context.WithCancel(ctx)
	defer cancelTail()
	opts := tail.Options{Connection: natssink.Config{URL: "nats://127.0.0.1:4222"}, Subject: "k8s.>", Stream: "K8S"}
	if ci {
		opts.Count = sampleEvents
		var cancel context.CancelFunc
		tailCtx, cancel = context.WithTimeout(tailCtx, 90*time.Second)
		defer cancel()
	}
	tailDone := make(chan error, 1)
	go func() { tailDone <- tail.Run(tailCtx, opts, prefixed{}) }()

	kubectl := func(args ...string) error {
		fmt.Printf("    $ kubectl %s\n", strings.Join(args, " "))
		cmd := exec.Command(filepath.Join(tools, "kubectl"), append([]string{"--kubeconfig", kc}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	say("applying sample objects")
	steps := [][]string{
		{"apply", "-f", filepath.Join(root, "hack", "demo", "sample.yaml")},
		{"-n", "demo", "patch", "configmap", "settings", "--type", "merge", "-p", `{"data":{"greeting":"hello, kubebridge"}}`},
		{"-n", "demo", "scale", "deployment", "web", "--replicas", "3"},
		{"-n", "demo", "delete", "configmap", "settings"},
	}
	for _, s := range steps {
		if err := kubectl(s...); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
	}
	if ci {
		if err := <-tailDone; err != nil {
			return fmt.Errorf("tail: %w (bridge log: %s)", err, logPath)
		}
		say("all %d sample events arrived", sampleEvents)
		return nil
	}
	say("try it: kubectl --kubeconfig %s -n demo create configmap hello --from-literal=a=b", kc)
	say("Ctrl-C to stop")
	<-ctx.Done()
	return nil
}

// prefixed indents tail's lines under the demo's own.
type prefixed struct{}

func (prefixed) Write(p []byte) (int, error) {
	s := strings.ReplaceAll(strings.TrimRight(string(p), "\n"), "\n", "\n    ")
	fmt.Printf("    %s\n", s)
	return len(p), nil
}

func waitForLog(path, want string, exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		data, _ := os.ReadFile(path)
		if strings.Contains(string(data), want) {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("bridge exited (%v):\n%s", err, data)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bridge not started after %s:\n%s", timeout, data)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

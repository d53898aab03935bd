package e2e

import (
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

// How the tests run the bridge: startBridge for `bridge run` (options say
// what differs from the usual run), runBridgeCommand for a command that
// runs to its end (replay, or a run that must fail at once).

// bridgeProc is a `bridge run` that a test started, and started again
// after stopping it: one config file, checkpoint and log for all its runs.
type bridgeProc struct {
	t          *testing.T
	o          bridgeOptions
	args       []string // bridge run's arguments, the same for every run
	configPath string   // the config file: the bridge reloads it when the test rewrites it
	logPath    string   // the output of every run, each after a "===== start" line

	cmd  *exec.Cmd     // the current (or last) run
	done chan struct{} // closed once it has exited
	err  error         // its exit status, set before done closes
}

// bridgeOption is one way in which a test runs the bridge otherwise than
// startBridge does by default.
type bridgeOption func(*bridgeOptions)

type bridgeOptions struct {
	binary           string
	configFile       string
	kubeconfig       string
	checkpointFile   string
	configCheckpoint bool
	logLevel         string
	flags            []string
	env              []string
	ready            []string
	startTimeout     time.Duration
	killAtEnd        bool
}

// withBinary runs another bridge binary than the one built for the tests
// (a distribution of one's own, examples/custom-bridge).
func withBinary(path string) bridgeOption { return func(o *bridgeOptions) { o.binary = path } }

// withConfigFile runs the bridge on a config file the test writes itself
// (startBridge's config is then ""). By default startBridge writes the
// config into a file of the bridge's own, bridgeProc.configPath.
func withConfigFile(path string) bridgeOption { return func(o *bridgeOptions) { o.configFile = path } }

// withKubeconfig runs the bridge as another identity than the control
// plane's admin (e.g. a ServiceAccount's kubeconfig) or through a proxy.
func withKubeconfig(path string) bridgeOption { return func(o *bridgeOptions) { o.kubeconfig = path } }

// withCheckpointFile is the checkpoint file of the test's choosing, e.g.
// for a second bridge that takes over the first's. By default the bridge
// has one of its own, kept across its runs.
func withCheckpointFile(path string) bridgeOption {
	return func(o *bridgeOptions) { o.checkpointFile = path }
}

// withConfigCheckpoint passes no --checkpoint-file: the bridge keeps the
// checkpoint its config names (a file or NATS KV).
func withConfigCheckpoint() bridgeOption { return func(o *bridgeOptions) { o.configCheckpoint = true } }

// withLogLevel sets --log-level (by default debug).
func withLogLevel(level string) bridgeOption { return func(o *bridgeOptions) { o.logLevel = level } }

// withFlags adds flags to bridge run, after those startBridge passes: of
// a flag given twice, the last counts.
func withFlags(flags ...string) bridgeOption {
	return func(o *bridgeOptions) { o.flags = append(o.flags, flags...) }
}

// withRestartFlags is how the tests that restart a bridge again and again
// run it: at info level (their logs are long) and asking every 300ms
// whether each rule's resource is served.
func withRestartFlags() bridgeOption {
	return func(o *bridgeOptions) {
		withLogLevel("info")(o)
		withFlags("--resource-poll", "300ms")(o)
	}
}

// withEnv adds KEY=value pairs to the bridge's environment; they take
// precedence over the test process's own (os/exec keeps the last of a key).
func withEnv(kv ...string) bridgeOption {
	return func(o *bridgeOptions) { o.env = append(o.env, kv...) }
}

// withLeaderElection makes the bridge a replica that delivers only while
// it holds the Lease namespace/lease.
func withLeaderElection(namespace, lease string) bridgeOption {
	return withFlags("--leader-elect", "--leader-elect-namespace", namespace, "--leader-elect-name", lease)
}

// withShortLease shortens the Lease's durations (4s, renewed within 3s,
// tried every 500ms): a frozen or killed leader is replaced sooner.
func withShortLease() bridgeOption {
	return withFlags("--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms")
}

// withReplicaName is the replica's identity in leader election (its
// HOSTNAME, as a pod's name).
func withReplicaName(name string) bridgeOption { return withEnv("HOSTNAME=" + name) }

// withReadyLog says when a run has started: once its log holds all of
// texts (by default "bridge started").
func withReadyLog(texts ...string) bridgeOption { return func(o *bridgeOptions) { o.ready = texts } }

// withStartTimeout is how long a run may take to start (by default 60s).
func withStartTimeout(d time.Duration) bridgeOption {
	return func(o *bridgeOptions) { o.startTimeout = d }
}

// withKillAtEnd ends the bridge with SIGKILL when the test ends, for a
// test that freezes or kills bridges and asserts on what follows, not on
// their clean exit. By default the test's end sends SIGTERM and requires
// a clean exit within 30s.
func withKillAtEnd() bridgeOption { return func(o *bridgeOptions) { o.killAtEnd = true } }

// startBridge runs `bridge run` with config against cp and waits until it
// has started (synced its caches). It is ended when the test ends: see
// withKillAtEnd. By default it logs as text at debug level, keeps its
// checkpoint in a file of its own, serves the admin endpoints on a free
// loopback port (adminURL) and reads credential files from the tests'
// temp dirs. Each run has a new working directory, as a new pod has.
func startBridge(t *testing.T, cp *testenv.ControlPlane, config string, opts ...bridgeOption) *bridgeProc {
	t.Helper()
	b, err := tryStartBridge(t, cp, config, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tryStartBridge is startBridge returning, rather than failing the test,
// when the bridge does not start (it is then stopped).
func tryStartBridge(t *testing.T, cp *testenv.ControlPlane, config string, opts ...bridgeOption) (*bridgeProc, error) {
	t.Helper()
	o := bridgeOptions{logLevel: "debug", ready: []string{"bridge started"}, startTimeout: 60 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	dir := t.TempDir()
	b := &bridgeProc{t: t, o: o, configPath: o.configFile, logPath: filepath.Join(dir, "bridge.log")}
	if o.configFile == "" {
		b.configPath = filepath.Join(dir, "config.yaml")
		must(t, os.WriteFile(b.configPath, []byte(config), 0o600))
	} else if config != "" {
		t.Fatal("startBridge: a config and withConfigFile")
	}
	kc := o.kubeconfig
	if kc == "" {
		var err error
		kc, err = cp.Kubeconfig(dir)
		must(t, err)
	}
	b.args = []string{"run", "--config", b.configPath, "--kubeconfig", kc, "--log-format", "text", "--log-level", o.logLevel,
		"--admin-addr", "127.0.0.1:0", "--admin-addr-file", adminAddrFile(b.logPath),
		"--credential-dirs", os.TempDir()} // the tests' secrets are in their temp dirs
	switch {
	case o.checkpointFile != "":
		b.args = append(b.args, "--checkpoint-file", o.checkpointFile)
	case !o.configCheckpoint:
		b.args = append(b.args, "--checkpoint-file", filepath.Join(dir, "state.db"))
	}
	b.args = append(b.args, o.flags...)
	if err := b.run(); err != nil {
		return nil, err
	}
	t.Cleanup(b.end)
	return b, nil
}

// start runs the bridge again, as it ran before, after stop or kill.
func (b *bridgeProc) start() {
	b.t.Helper()
	if err := b.run(); err != nil {
		b.t.Fatal(err)
	}
}

// run starts a run and waits until its log says it has started; on an
// error the run has ended.
func (b *bridgeProc) run() error {
	if b.cmd != nil && !b.exited() {
		return errors.New("startBridge: the bridge is running")
	}
	_ = os.Remove(adminAddrFile(b.logPath)) // the last run's
	logFile, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "\n===== start %s\n", time.Now().Format(time.RFC3339Nano))
	bin := bridgeBin
	if b.o.binary != "" {
		bin = b.o.binary
	}
	b.cmd = exec.Command(bin, b.args...)
	b.cmd.Dir = b.t.TempDir()
	b.cmd.Env = append(os.Environ(), b.o.env...)
	b.cmd.Stdout, b.cmd.Stderr = logFile, logFile
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // killed if the test binary dies first
	b.done, b.err = make(chan struct{}), nil
	if err := b.cmd.Start(); err != nil {
		logFile.Close()
		return err
	}
	go func(cmd *exec.Cmd, done chan struct{}) {
		err := cmd.Wait()
		logFile.Close()
		b.err = err
		close(done)
	}(b.cmd, b.done)
	ready := func() bool {
		log := b.runLog()
		for _, s := range b.o.ready {
			if !strings.Contains(log, s) {
				return false
			}
		}
		return true
	}
	testenv.Poll(b.o.startTimeout, 50*time.Millisecond, func() bool { return ready() || b.exited() })
	switch {
	case ready():
		return nil
	case b.exited():
		return fmt.Errorf("bridge exited before it started (%v):\n%s", b.err, b.runLog())
	default:
		b.kill()
		return fmt.Errorf("bridge not started after %s (its log lacks %q):\n%s", b.o.startTimeout, b.o.ready, b.runLog())
	}
}

// log is the output of every run so far.
func (b *bridgeProc) log() string {
	data, _ := os.ReadFile(b.logPath)
	return string(data)
}

// runLog is the output of the current (or last) run.
func (b *bridgeProc) runLog() string {
	log := b.log()
	return log[max(0, strings.LastIndex(log, "\n===== start ")):]
}

// waitLog waits up to timeout until the current run's log holds text.
func (b *bridgeProc) waitLog(text string, timeout time.Duration) {
	b.t.Helper()
	eventually(b.t, timeout, func() error {
		if strings.Contains(b.runLog(), text) {
			return nil
		}
		return fmt.Errorf("no %q in the bridge's log:\n%s", text, b.runLogTail())
	})
}

// exited reports whether the current run has ended.
func (b *bridgeProc) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the run to exit, and returns whether it
// did and its exit status.
func (b *bridgeProc) wait(timeout time.Duration) (exited bool, err error) {
	select {
	case <-b.done:
		return true, b.err
	case <-time.After(timeout):
		return false, nil
	}
}

// signal sends sig to the run.
func (b *bridgeProc) signal(sig syscall.Signal) {
	b.t.Helper()
	must(b.t, b.cmd.Process.Signal(sig))
}

// terminate sends SIGTERM and waits up to timeout for the exit; a run
// still there then is killed. It returns whether the run exited of
// itself, and its exit status.
func (b *bridgeProc) terminate(timeout time.Duration) (exited bool, err error) {
	if b.exited() {
		return true, b.err
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	if exited, err := b.wait(timeout); exited {
		return true, err
	}
	_ = b.cmd.Process.Kill()
	<-b.done
	return false, nil
}

// stop ends the run as the kubelet ends a pod: SIGTERM, and a clean exit
// (its queues drained, its checkpoint written) within 30s, else the test
// fails here. A run that has exited already is left as it is.
func (b *bridgeProc) stop() {
	b.t.Helper()
	if !b.halt() {
		b.t.FailNow()
	}
}

// halt is stop reporting a failure (as t.Errorf) rather than ending the
// test: it reports whether the run stopped cleanly.
func (b *bridgeProc) halt() bool {
	b.t.Helper()
	if b.exited() {
		return true
	}
	ok := true
	switch exited, err := b.terminate(30 * time.Second); {
	case !exited:
		b.t.Errorf("bridge did not stop within 30s of SIGTERM:\n%s", b.runLogTail())
		ok = false
	case err != nil:
		b.t.Errorf("bridge exited with %v after SIGTERM:\n%s", err, b.runLogTail())
		ok = false
	}
	return b.checkRaces() && ok
}

// kill ends the run with SIGKILL, as an OOM kill or a lost node does
// (a race the run reported fails the test, as with stop).
func (b *bridgeProc) kill() {
	b.t.Helper()
	if b.exited() {
		return
	}
	_ = b.cmd.Process.Kill()
	<-b.done
	b.checkRaces()
}

// stopWith ends the run with sig: SIGTERM as stop does, SIGKILL as kill.
func (b *bridgeProc) stopWith(sig syscall.Signal) {
	b.t.Helper()
	switch sig {
	case syscall.SIGTERM:
		b.stop()
	case syscall.SIGKILL:
		b.kill()
	default:
		b.t.Fatalf("stopWith(%v): SIGTERM or SIGKILL", sig)
	}
}

// end is the bridge's teardown when the test ends.
func (b *bridgeProc) end() {
	if b.o.killAtEnd {
		b.kill()
	} else {
		b.halt()
	}
	if b.t.Failed() {
		b.t.Logf("bridge log (%s), the end:\n%s", b.logPath, lastLines(b.log(), 60))
	}
}

// checkRaces reports (t.Errorf) a race that the race detector (the
// tests' bridge is built with it) found in the run; it returns false then.
func (b *bridgeProc) checkRaces() bool {
	b.t.Helper()
	log := b.runLog()
	i := strings.Index(log, "WARNING: DATA RACE")
	if i < 0 {
		return true
	}
	b.t.Errorf("the race detector fired:\n%s", log[i:])
	return false
}

func (b *bridgeProc) runLogTail() string { return lastLines(b.runLog(), 60) }

// adminURL is the admin endpoint of the current run.
func (b *bridgeProc) adminURL() string {
	b.t.Helper()
	u, err := adminURLOf(b.logPath)
	if err != nil {
		b.t.Fatalf("%v\n%s", err, b.runLogTail())
	}
	return u
}

// adminAddrFile is where a bridge logging to logPath writes its admin
// address (bridge run --admin-addr-file); each run rewrites it.
func adminAddrFile(logPath string) string { return logPath + ".admin" }

// adminURLOf is the admin endpoint of the bridge logging to logPath, as it
// wrote it (the latest run's).
func adminURLOf(logPath string) (string, error) {
	data, err := os.ReadFile(adminAddrFile(logPath))
	if err != nil {
		return "", fmt.Errorf("no admin address: %w", err)
	}
	return "http://" + strings.TrimSpace(string(data)), nil
}

// runBridgeCommand runs the bridge with args to its end: a one-shot
// command (replay), or a run that must fail at once. It returns what the
// bridge printed (stdout and stderr) and its exit status.
func runBridgeCommand(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return runBridgeCommandEnv(t, nil, args...)
}

// runBridgeCommandEnv is runBridgeCommand with KEY=value pairs added to
// the bridge's environment.
func runBridgeCommandEnv(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bridgeBin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("bridge %s: %v", strings.Join(args, " "), err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

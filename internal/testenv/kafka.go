package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Kafka is franz-go's kfake cluster (one broker) run as a process of its
// own (internal/testenv/kfakecmd) on a loopback port, persisting to a
// data directory in the test's temp dir with every produced batch synced
// before it is acknowledged. Stop, Kill and Start keep the port and the
// directory: what the broker acknowledged survives a restart, even after
// a SIGKILL; clients reconnect. Compacted topics are compacted every
// CleanerInterval.
type Kafka struct {
	bin, dir, logPath string
	port              int
	proc              *process
}

// CleanerInterval is how often the broker compacts topics with
// cleanup.policy=compact.
const CleanerInterval = 500 * time.Millisecond

var kfakeBin struct {
	once sync.Once
	path string
	err  error
}

// buildKfake builds kfakecmd once per test binary.
func buildKfake() (string, error) {
	kfakeBin.once.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			kfakeBin.err = err
			return
		}
		dir, err := os.MkdirTemp("", "kubebridge-kfake-")
		if err != nil {
			kfakeBin.err = err
			return
		}
		kfakeBin.path = filepath.Join(dir, "kfakecmd")
		cmd := exec.Command("go", "build", "-o", kfakeBin.path, "./internal/testenv/kfakecmd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			kfakeBin.err = fmt.Errorf("building kfakecmd: %v\n%s", err, out)
		}
	})
	return kfakeBin.path, kfakeBin.err
}

// StartKafka starts a kfake broker for one test, stopped when it ends.
func StartKafka(t testing.TB) *Kafka {
	t.Helper()
	bin, err := buildKfake()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k := &Kafka{bin: bin, dir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "kfake.log"), port: FreePort()}
	k.Start(t)
	t.Cleanup(k.Stop)
	return k
}

// Brokers are the seed brokers to give a client.
func (k *Kafka) Brokers() []string {
	return []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(k.port))}
}

// Start starts a stopped broker on its port and data directory, and waits
// until it accepts connections.
func (k *Kafka) Start(t testing.TB) {
	t.Helper()
	args := []string{"-port", strconv.Itoa(k.port), "-data-dir", k.dir, "-cleaner-ms", strconv.Itoa(int(CleanerInterval / time.Millisecond))}
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may be held a moment after a kill
		if k.proc, err = startProcess("kfake", k.bin, args, k.logPath); err != nil {
			t.Fatal(err)
		}
		if err = k.waitReady(10 * time.Second); err == nil {
			return
		}
		_ = k.proc.stop(5 * time.Second)
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("kfake did not start: %v\n%s", err, k.proc.logTail())
}

func (k *Kafka) waitReady(timeout time.Duration) error {
	addr := k.Brokers()[0]
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-k.proc.done:
			return fmt.Errorf("kfake exited: %v", k.proc.err)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("kfake not listening on %s within %s", addr, timeout)
}

// Stop closes the broker (SIGTERM: it persists and exits) and waits;
// safe to call twice.
func (k *Kafka) Stop() {
	if k.proc != nil {
		_ = k.proc.stop(10 * time.Second)
	}
}

// Kill ends the broker with SIGKILL: what it acknowledged is on disk
// (synced writes), what it had not is lost, as a crashed broker's.
func (k *Kafka) Kill() {
	if k.proc == nil {
		return
	}
	select {
	case <-k.proc.done:
		return
	default:
	}
	_ = syscall.Kill(-k.proc.cmd.Process.Pid, syscall.SIGKILL)
	<-k.proc.done
}

// Restart stops the broker and starts it again on its port and data.
func (k *Kafka) Restart(t testing.TB) {
	t.Helper()
	k.Stop()
	k.Start(t)
}

// Log is the broker's output so far, for failure messages.
func (k *Kafka) Log() string { return k.proc.logTail() }

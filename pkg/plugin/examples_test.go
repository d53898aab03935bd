package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/delivery/deliverytest"
	"github.com/kubebridge/kubebridge/internal/testenv"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	execsink "github.com/kubebridge/kubebridge/pkg/sinks/exec"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// goExample is examples/plugins/go, built once for the package's tests.
var goExample string

func TestMain(m *testing.M) { testenv.MainWithProgram(m, "../../examples/plugins/go", &goExample) }

// The example plugins, the Go one on this package and the Python one on
// the standard library, behind the exec sink and the real delivery loop:
// every event lands in AUDIT_FILE, the retry-once event after its retry,
// the permanent one in the dead-letter, and the crash restarts the plugin
// without losing anything.
func TestExamplePlugins(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command func(t *testing.T) []string
	}{
		{"go", func(*testing.T) []string { return []string{goExample} }},
		{"python", func(t *testing.T) []string {
			if _, err := osexec.LookPath("python3"); err != nil {
				t.Skip("no python3")
			}
			return []string{"python3", "../../examples/plugins/python/audit.py"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auditFile := filepath.Join(t.TempDir(), "audit.log")
			c := execsink.Factory.NewConfig().(*execsink.Config)
			c.Command = tc.command(t)
			c.Env = map[string]string{"AUDIT_FILE": auditFile}
			cfg := config.Sink{Name: "audit", Type: "exec", Spec: c, Workers: 2, Queue: config.Queue{Capacity: 100},
				Retry: config.Retry{InitialInterval: config.Duration(5 * time.Millisecond), MaxInterval: config.Duration(50 * time.Millisecond)}}
			logs := &syncWriter{w: &strings.Builder{}}
			sink, err := execsink.Factory.Create(context.Background(), sinks.SettingsFor(cfg,
				slog.New(slog.NewTextHandler(logs, nil)).With("sink", "audit")))
			if err != nil {
				t.Fatal(err)
			}
			dl := &sinkstest.RecordingDeadLetter{}
			d := deliverytest.Start(t, cfg, sink, dl) // the bridge's engine: drained below

			plain := structured(t, "plain", nil)
			retry := structured(t, "retry", map[string]string{"audit.kubebridge.io/fail": "retry-once"})
			poison := structured(t, "poison", map[string]string{"audit.kubebridge.io/fail": "permanent"})
			crash := structured(t, "crash", map[string]string{"audit.kubebridge.io/crash": "once"})
			var rest []*event.Event
			for i := range 20 {
				rest = append(rest, structured(t, fmt.Sprintf("cm-%d", i), nil))
			}
			for _, e := range append([]*event.Event{plain, retry, poison, crash}, rest...) {
				d.Offer(e)
			}

			want := append([]*event.Event{plain, retry, crash}, rest...)
			deadline := time.Now().Add(30 * time.Second)
			for {
				data, _ := os.ReadFile(auditFile)
				missing := 0
				for _, e := range want {
					if !strings.Contains(string(data), e.ID+"\t"+e.Type()+"\t"+e.Subject+"\n") {
						missing++
					}
				}
				if missing == 0 && d.Stats().DeadLettered == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d events missing from the audit file, %d dead-lettered:\n%s", missing, d.Stats().DeadLettered, data)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if dl.Events[0].ID != poison.ID || !sinks.IsPermanent(dl.Errors[0]) || !strings.Contains(dl.Errors[0].Error(), "prod/poison is labelled audit.kubebridge.io/fail=permanent") {
				t.Errorf("dead-letter got %s: %v", dl.Events[0].ID, dl.Errors[0])
			}
			seen, _ := os.ReadFile(auditFile + ".seen")
			for _, k := range []string{"retry " + retry.ID, "crash " + crash.ID} {
				if !strings.Contains(string(seen), k+"\n") {
					t.Errorf("seen file lacks %q:\n%s", k, seen)
				}
			}
			d.Close() // everything is delivered: the delivery stops, then the sink closes
			<-d.Done()
			if err := sink.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
			if log := logs.String(); !strings.Contains(log, "exit status 3") {
				t.Errorf("the crash and restart are not logged:\n%s", log)
			}
		})
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

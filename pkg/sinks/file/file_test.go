package file

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

func events(n, from int) []*event.Event {
	r := &event.Rule{Name: "r", Cluster: "c", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, IncludeObject: true}
	out := make([]*event.Event, n)
	for i := range out {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"pad": strings.Repeat("x", 200)}}}
		u.SetNamespace("ns")
		u.SetName("cm")
		u.SetUID("uid")
		u.SetResourceVersion(itoa(from + i))
		out[i] = event.New(r, event.Added, u, nil, time.Unix(0, 0))
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: not JSON: %q", path, sc.Text())
		}
		out = append(out, m["id"].(string))
	}
	return out
}

func TestWritesJSONLinesAndRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "events.jsonl")
	s, err := Open(path, 4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 10; i++ { // 10 batches of 5 events of ~400 bytes: rotates every two batches
		if err := s.Send(ctx, events(5, i*5)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cur, b1, b2 := lines(t, path), lines(t, path+".1"), lines(t, path+".2")
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("more backups than maxBackups: %v", err)
	}
	all := append(append(b2, b1...), cur...)
	for i := 1; i < len(all); i++ { // the newest files hold a contiguous, ordered tail
		prev, _ := strconv.Atoi(rvOf(all[i-1]))
		cur, _ := strconv.Atoi(rvOf(all[i]))
		if cur != prev+1 {
			t.Fatalf("not contiguous across rotation: %s after %s", all[i], all[i-1])
		}
	}
	if last := all[len(all)-1]; rvOf(last) != "49" || !strings.HasSuffix(last, ".added") {
		t.Errorf("last event %s", all[len(all)-1])
	}
	for _, p := range []string{path, path + ".1", path + ".2"} {
		if st, _ := os.Stat(p); st.Size() > 4096 {
			t.Errorf("%s is %d bytes, over maxSize", p, st.Size())
		}
	}
	// Reopening appends.
	s, err = Open(path, 1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ctx, events(1, 100)); err != nil {
		t.Fatal(err)
	}
	s.Close(ctx)
	if got := lines(t, path); len(got) != len(cur)+1 || rvOf(got[len(got)-1]) != "100" {
		t.Errorf("after reopen: %v", got)
	}
}

// A device is refused when the sink opens, whatever the config said: a
// full disk is reported as such (pkg/internal/rotatefile tests it), but the sink
// writes (and rotates) only regular files.
func TestDevicesAreRefused(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	s, err := Open("/dev/full", 1<<20, 0)
	if err == nil {
		s.Close(context.Background())
		t.Fatal("opened /dev/full")
	}
	if !strings.Contains(err.Error(), "/dev/full is not a regular file") {
		t.Errorf("err = %v, want it to say /dev/full is not a regular file", err)
	}
}

type fileRemote struct{ path string }

func (r fileRemote) Received(t testing.TB) []sinkstest.Received {
	data, err := os.ReadFile(r.path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var bodies [][]byte
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		if len(line) > 0 {
			bodies = append(bodies, line)
		}
	}
	got, err := sinkstest.ParseIDs(bodies)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
func (fileRemote) Down(t testing.TB)    { t.Fatal("a file has no outages") }
func (fileRemote) Up(t testing.TB)      { t.Fatal("a file has no outages") }
func (fileRemote) Restart(t testing.TB) { t.Fatal("a file has no outages") }
func (fileRemote) Refuse(t testing.TB)  { t.Fatal("a file refuses nothing") }

func TestContract(t *testing.T) {
	sinkstest.Run(t, sinkstest.Harness{
		Config:   config.Sink{Name: "archive", Workers: 3},
		PerEvent: true,
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			path := filepath.Join(t.TempDir(), "events.jsonl")
			s, err := Open(path, 1<<30, 1)
			if err != nil {
				t.Fatal(err)
			}
			return s, fileRemote{path}
		},
	})
}

// rvOf reads the resourceVersion of an event id <uid>.<tag>.<rv>.<type>.
func rvOf(id string) string {
	parts := strings.Split(id, ".")
	return parts[len(parts)-2]
}

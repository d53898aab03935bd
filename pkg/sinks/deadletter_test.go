package sinks

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// dlEvent is an event of object ns/cm-<i>.
func dlEvent(i int) *event.Event {
	name := fmt.Sprintf("cm-%d", i)
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": name, "uid": "u-" + name, "resourceVersion": strconv.Itoa(i)}}}
	return event.New(&event.Rule{Name: "r", GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}, event.Updated, u, nil, time.Now())
}

func dlSubject(i int) string { return fmt.Sprintf("ns/cm-%d", i) }

// readDeadLetters returns the subjects of the events in the dead-letter
// file at path, in order, and fails the test on any line that is not one
// whole record.
func readDeadLetters(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var subjects []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Sink, Error string
			Event       struct{ Subject string }
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil || rec.Event.Subject == "" || rec.Sink != "hook" || rec.Error == "" {
			t.Fatalf("%s: not a whole record (%v): %q", filepath.Base(path), err, sc.Text())
		}
		subjects = append(subjects, rec.Event.Subject)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return subjects
}

// A dead-letter file rotates by size: the records spread over the file and
// its backups, each file holds whole records within the size, the oldest
// beyond maxBackups is removed, and what is kept is the newest records, in
// order, none missing between.
func TestFileDeadLetterRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "dead.jsonl")
	const maxSize = 2000
	d, err := OpenFileDeadLetter(path, maxSize, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var sent []string
	for i := 0; i < 60; i += 3 { // batches of three
		if err := d.Put(context.Background(), "hook", []*event.Event{dlEvent(i), dlEvent(i + 1), dlEvent(i + 2)}, errors.New("HTTP 400")); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, dlSubject(i), dlSubject(i+1), dlSubject(i+2))
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s.3 kept beyond maxBackups 2: %v", path, err)
	}
	var kept []string
	for _, name := range []string{path + ".2", path + ".1", path} { // oldest first
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > maxSize {
			t.Errorf("%s: %d bytes, over %d", name, st.Size(), maxSize)
		}
		got := readDeadLetters(t, name)
		if len(got) == 0 {
			t.Errorf("%s is empty", name)
		}
		kept = append(kept, got...)
	}
	if len(kept) >= len(sent) || strings.Join(kept, ",") != strings.Join(sent[len(sent)-len(kept):], ",") {
		t.Errorf("kept %v\nof sent %v", kept, sent)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 3 {
		t.Errorf("files: %v", entries)
	}
}

// Records put concurrently, over many rotations, are each kept whole in
// exactly one file (maxBackups large enough to keep them all).
func TestFileDeadLetterRotatesConcurrently(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dead.jsonl")
	d, err := OpenFileDeadLetter(path, 3000, 100)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if err := d.Put(context.Background(), "hook", []*event.Event{dlEvent(w*1000 + i)}, errors.New("refused")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	files := 0
	for i := 0; ; i++ {
		name := path
		if i > 0 {
			name = fmt.Sprintf("%s.%d", path, i)
		}
		if _, err := os.Stat(name); err != nil {
			break
		}
		files++
		for _, s := range readDeadLetters(t, name) {
			seen[s]++
		}
	}
	if files < 5 {
		t.Errorf("%d files: the dead-letter did not rotate", files)
	}
	for w := range 4 {
		for i := range 25 {
			if s := dlSubject(w*1000 + i); seen[s] != 1 {
				t.Errorf("%s kept %d times", s, seen[s])
			}
		}
	}
}

// A rotation that fails loses nothing: Put reports the error, what the
// file held stays in place, and the next Put rotates once it can.
func TestFileDeadLetterRotationFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dead.jsonl")
	d, err := OpenFileDeadLetter(path, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	for i := range 2 { // dead.jsonl.1 and dead.jsonl
		if err := d.Put(ctx, "hook", []*event.Event{dlEvent(i)}, errors.New("x")); err != nil {
			t.Fatal(err)
		}
	}
	// dead.jsonl.1 cannot move to dead.jsonl.2: a directory that is not empty is there.
	if err := os.MkdirAll(filepath.Join(path+".2", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "hook", []*event.Event{dlEvent(2)}, errors.New("x")); err == nil {
		t.Error("a rotation that cannot rename reported no error")
	}
	if a, b := readDeadLetters(t, path+".1"), readDeadLetters(t, path); len(a) != 1 || a[0] != dlSubject(0) || len(b) != 1 || b[0] != dlSubject(1) {
		t.Errorf("after the failed rotation: .1 %v, current %v", a, b)
	}
	if err := os.RemoveAll(path + ".2"); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "hook", []*event.Event{dlEvent(2)}, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{".2": dlSubject(0), ".1": dlSubject(1), "": dlSubject(2)} {
		if got := readDeadLetters(t, path+name); len(got) != 1 || got[0] != want {
			t.Errorf("after retrying: dead.jsonl%s holds %v, want %s", name, got, want)
		}
	}
}

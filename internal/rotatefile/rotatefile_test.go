package rotatefile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Writes rotate by size: every file holds whole writes, at most maxBackups
// old files are kept, the newest writes are in the file itself, and
// nothing written is lost but what the oldest backup dropped.
func TestRotatesBySizeKeepingWholeWrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dl.jsonl")
	f, err := Open(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := f.Write(fmt.Appendf(nil, "{\"n\":%02d,\"pad\":\"xxxxxxxxxxxxxxxxxxxx\"}\n", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Fatalf("files %v, want the file and 2 backups", entries)
	}
	var all []byte
	for _, name := range []string{path + ".2", path + ".1", path} {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > 100 || !bytes.HasSuffix(data, []byte("\n")) || bytes.Count(data, []byte("\n")) != 2 {
			t.Errorf("%s holds %q: want two whole lines within 100 bytes", name, data)
		}
		all = append(all, data...)
	}
	if !bytes.HasSuffix(all, []byte("{\"n\":19,\"pad\":\"xxxxxxxxxxxxxxxxxxxx\"}\n")) || !bytes.HasPrefix(all, []byte("{\"n\":14,")) {
		t.Errorf("kept %q: want writes 14 to 19, in order", all)
	}
}

// A write larger than maxSize goes whole into a file of its own.
func TestWriteLargerThanMaxSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := Open(path, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, w := range []string{"abc\n", "0123456789abcdef\n", "x\n"} {
		if err := f.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	if string(cur) != "x\n" || string(old) != "0123456789abcdef\n" {
		t.Errorf("file %q, backup %q", cur, old)
	}
}

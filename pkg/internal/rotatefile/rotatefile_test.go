package rotatefile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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

// Whatever waits at the path when the file is opened (a link to the
// checkpoint or a credential, a second name of it, a FIFO, a directory),
// nothing but a regular file of its own is written, and opening a FIFO
// nobody reads does not hang.
func TestOpenRefusesLinksAndSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "state.db")
	if err := os.WriteFile(victim, []byte("checkpoint"), 0o600); err != nil {
		t.Fatal(err)
	}
	plants := map[string]func(path string) error{
		"symbolic link": func(p string) error { return os.Symlink(victim, p) },
		"relative link": func(p string) error { return os.Symlink("state.db", p) },
		"hard link":     func(p string) error { return os.Link(victim, p) },
		"FIFO":          func(p string) error { return syscall.Mkfifo(p, 0o600) },
		"directory":     func(p string) error { return os.Mkdir(p, 0o700) },
	}
	for what, plant := range plants {
		t.Run(what, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(what, " ", "-")+".jsonl")
			if err := plant(path); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				f, err := Open(path, 1<<20, 1)
				if err == nil {
					err = f.Write([]byte("event\n"))
					f.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("opened and wrote a %s", what)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("opening a %s hangs", what)
			}
			if b, _ := os.ReadFile(victim); string(b) != "checkpoint" {
				t.Errorf("the checkpoint now holds %q", b)
			}
		})
	}
}

// Rotation works in the directory as it was at Open: a link swapped in
// for the directory afterwards (after the config was checked) makes it
// neither write, rename nor remove the files it points at.
func TestRotationStaysInItsDirectory(t *testing.T) {
	base := t.TempDir()
	logs, secret := filepath.Join(base, "logs"), filepath.Join(base, "secret")
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dl.jsonl", "dl.jsonl.1", "dl.jsonl.2"} {
		if err := os.WriteFile(filepath.Join(secret, name), []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Open(filepath.Join(logs, "dl.jsonl"), 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(logs, logs+"-old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, logs); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := f.Write([]byte("0123456789\n")); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"dl.jsonl", "dl.jsonl.1", "dl.jsonl.2"} {
		if b, err := os.ReadFile(filepath.Join(secret, name)); err != nil || string(b) != "keep" {
			t.Errorf("%s in the directory linked in afterwards: %q, %v", name, b, err)
		}
		if b, _ := os.ReadFile(filepath.Join(logs+"-old", name)); string(b) != "0123456789\n" {
			t.Errorf("%s in the directory opened: %q", name, b)
		}
	}
}

// A full disk is reported as such.
func TestDiskFullIsReported(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// /dev/full itself is refused (a device): the file as a full disk makes it.
	r := &File{path: "/dev/full", dir: root, name: "full", maxSize: 1 << 20, f: full}
	defer r.Close()
	if err := r.Write([]byte("event\n")); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("err = %v, want disk full", err)
	}
}

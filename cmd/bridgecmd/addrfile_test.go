package bridgecmd

import (
	"os"
	"path/filepath"
	"testing"
)

// --admin-addr-file writes only its own file: links planted where the old
// code put its temporary file (<path>.tmp) and at the path itself are not
// followed, so the files they point at keep their content.
func TestAdminAddrFileFollowsNoLinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "admin.addr")
	for _, link := range []string{path + ".tmp", path} {
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeFileAtomic(path, []byte("127.0.0.1:8080\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Errorf("the file a link pointed at now holds %q", b)
	}
	st, err := os.Lstat(path)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o644 {
		t.Fatalf("%s: %v, %v; want a regular file, mode 0644", path, st.Mode(), err)
	}
	if b, _ := os.ReadFile(path); string(b) != "127.0.0.1:8080\n" {
		t.Errorf("%s holds %q", path, b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 { // victim, the planted admin.addr.tmp link, admin.addr
		t.Errorf("left behind: %v", entries)
	}
}

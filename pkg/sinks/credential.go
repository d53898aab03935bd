package sinks

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"time"
)

// CredentialFile is a secret a sink reads from a file (a token, a
// password, a key): mounted Secrets change under a running pod, so it is
// read again when the file changes (checked at most every CheckEvery, or at
// once after Refresh, e.g. on a 401). A file that vanishes or turns empty
// keeps the last good value: a Secret being rewritten is not a reason to
// stop sending with the credential that still works.
type CredentialFile struct {
	path string
	trim func([]byte) []byte

	mu      sync.Mutex
	value   []byte
	info    os.FileInfo // of the file value was read from
	checked time.Time
	gen     int // bumped when value changes
	err     error
}

// CheckEvery spaces the stat of a credential file (a variable for tests).
var CheckEvery = time.Second

// TrimLine trims a trailing line break (editors add one).
func TrimLine(b []byte) []byte { return bytes.TrimRight(b, "\r\n") }

// TrimSpace trims surrounding white space (tokens).
func TrimSpace(b []byte) []byte { return bytes.TrimSpace(b) }

// OpenCredentialFile reads path now: a credential that cannot be read at
// start is an error (the config names a file that is not there).
func OpenCredentialFile(path string, trim func([]byte) []byte) (*CredentialFile, error) {
	c := &CredentialFile{path: path, trim: trim}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

// Path is the file's path, for messages.
func (c *CredentialFile) Path() string { return c.path }

func (c *CredentialFile) load() error {
	info, err := os.Stat(c.path)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return err
	}
	if c.trim != nil {
		b = c.trim(b)
	}
	if len(b) == 0 {
		return fmt.Errorf("%s is empty", c.path)
	}
	if c.value == nil || !bytes.Equal(b, c.value) {
		c.value = b
		c.gen++
	}
	c.info = info
	return nil
}

// Value returns the current content and its generation (which changes
// with the content), reading the file again if it changed.
func (c *CredentialFile) Value() ([]byte, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= CheckEvery {
		c.checked = now
		info, err := os.Stat(c.path)
		switch {
		case err != nil:
			c.err = err
		case !os.SameFile(info, c.info) || !info.ModTime().Equal(c.info.ModTime()) || info.Size() != c.info.Size():
			c.err = c.load()
		}
	}
	return c.value, c.gen
}

// Refresh makes the next Value check the file at once: the destination
// refused the credential, which may have been rotated since.
func (c *CredentialFile) Refresh() {
	c.mu.Lock()
	c.checked = time.Time{}
	c.mu.Unlock()
}

// Err is the last error reading the file again (nil once read well).
func (c *CredentialFile) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

package testenv

import (
	"testing"
	"time"
)

// Poll calls cond every interval until it returns true or timeout has
// passed, and reports whether it did. For a caller that asserts on its
// own afterwards, so that a timeout shows what was there.
func Poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// Eventually polls cond every 50ms until it holds, failing t with what it
// waited for after timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, 50*time.Millisecond, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Await calls check every interval until it returns nil; once timeout has
// passed, it fails t with check's last error, which says what was missing.
func Await(t testing.TB, timeout, interval time.Duration, check func() error) {
	t.Helper()
	var err error
	if !Poll(timeout, interval, func() bool { err = check(); return err == nil }) {
		t.Fatalf("timed out after %s: %v", timeout, err)
	}
}

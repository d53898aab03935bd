package docscheck

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine has an owner that waits for it: after the package's tests
// no goroutine of theirs, nor of the code they drive, may still be running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

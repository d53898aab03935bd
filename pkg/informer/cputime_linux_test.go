//go:build linux

package informer

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used (user and system, every
// thread): what a benchmark costs, whatever else shares the machine.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

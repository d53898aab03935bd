//go:build linux

package exec

import (
	"syscall"
	"unsafe"
)

// sysProcAttr puts the plugin in its own process group (a terminal's
// Ctrl-C reaches the bridge only, which then shuts the plugin down in
// order; and the group can be killed as a whole) and has the kernel kill it
// when the bridge dies, so that no plugin outlives its bridge. (Strictly,
// Pdeathsig fires when the OS thread that started the plugin ends. Go ends
// a thread only when a goroutine locked to it exits; should that happen,
// the plugin is restarted as after any crash.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the plugin's process group. Callers make sure the
// plugin (the group's leader) has not been reaped: until then its pid,
// and so the group id, cannot be reused.
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }

// waitUnreaped blocks until process pid has exited, leaving it a zombie
// (WNOWAIT): its pid stays reserved until os/exec reaps it.
func waitUnreaped(pid int) {
	const pPID, wExited, wNoWait = 1, 4, 0x1000000
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}

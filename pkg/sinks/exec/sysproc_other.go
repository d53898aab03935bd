//go:build !linux

package exec

import "syscall"

// sysProcAttr: elsewhere the plugin runs in the bridge's process group and
// is not killed by the kernel when the bridge dies; Close still kills it.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killGroup: without a process group of its own there is no group to
// kill; proc.kill kills the plugin itself.
func killGroup(int) {}

// waitUnreaped returns at once: with no group kill, nothing needs the pid
// kept.
func waitUnreaped(int) {}

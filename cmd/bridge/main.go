// Command bridge is the kubebridge CLI: it turns Kubernetes changes into
// CloudEvents delivered to NATS, webhooks and files. It is a thin layer of
// flags over internal/bridge.
package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // something failed that is not the config's fault (e.g. the cluster is unreachable)
	exitInvalid = 2 // the config or the command line is wrong
)

// exitError carries an exit code; its message, if any, is already printed.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := newRootCommand()
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(os.Stderr, "bridge:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "bridge:", err)
	return exitInvalid // cobra's own errors: unknown flags and commands
}

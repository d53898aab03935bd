package bridgecmd

import (
	"errors"
	"fmt"
	"io"
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

// run executes the command line args and returns the process's exit code;
// what the command reports (config problems, the error that ends it) goes
// to stderr.
func run(s Settings, args []string, stderr io.Writer) int {
	cmd := New(s)
	cmd.SetArgs(args)
	cmd.SetErr(stderr)
	err := cmd.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(stderr, "bridge:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "bridge:", err)
	return exitInvalid // cobra's own errors: unknown flags and commands
}

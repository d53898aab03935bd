// Package bridgecmd is the bridge command line (run, validate, replay,
// tail, version) as a library, so that a team can build its own bridge
// binary with its own sink types, as the OpenTelemetry collector's
// otelcol.NewCommand does for a distribution: the runtime is the same, only
// the list of sink types differs.
//
// kubebridge's own binary (cmd/bridge) is
//
//	func main() {
//		bridgecmd.Main(bridgecmd.Settings{Sinks: components.SinkRegistry()})
//	}
//
// and a distribution adds its factories to the standard ones:
//
//	reg, err := sinks.NewRegistry(append(components.Sinks(), counter.Factory)...)
//	if err != nil {
//		log.Fatal(err)
//	}
//	bridgecmd.Main(bridgecmd.Settings{Sinks: reg})
//
// (examples/custom-bridge is such a module; docs/sdk.md walks through it).
package bridgecmd

import (
	"errors"
	"os"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Settings are what a bridge binary is built with.
type Settings struct {
	// Sinks are the sink types the binary knows: a config may name these
	// types, and no other. Required: components.SinkRegistry() for the
	// standard ones.
	Sinks *sinks.Registry
}

// Main runs the command line of os.Args and exits: 0 on success, 2 when
// the config or the command line is wrong, 1 for any other failure (the
// cluster unreachable, a sink that cannot start). It never returns.
func Main(s Settings) {
	os.Exit(run(s, os.Args[1:], os.Stderr))
}

// errNoSinks is the error of a command built without sink types.
var errNoSinks = &exitError{exitInvalid, errors.New("this build has no sink types (bridgecmd.Settings.Sinks is nil)")}

// Command custom-bridge is a kubebridge distribution of its own: the
// bridge's command line (run, validate, replay, tail, version) with the
// standard sink types plus one written here, tsv. It is all a team needs
// to ship sinks the kubebridge repository does not have (README.md).
package main

import (
	"fmt"
	"os"

	"github.com/kubebridge/kubebridge/cmd/bridgecmd"
	"github.com/kubebridge/kubebridge/examples/custom-bridge/tsv"
	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func main() {
	reg, err := sinks.NewRegistry(append(components.Sinks(), tsv.Factory)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "custom-bridge:", err)
		os.Exit(1)
	}
	bridgecmd.Main(bridgecmd.Settings{Sinks: reg})
}

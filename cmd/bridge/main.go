// Command bridge is the kubebridge CLI: it turns Kubernetes changes into
// CloudEvents delivered to NATS, webhooks, files and plugins. It is
// kubebridge's own distribution: the command line (cmd/bridgecmd) with the
// standard sink types (pkg/components).
package main

import (
	"github.com/kubebridge/kubebridge/cmd/bridgecmd"
	"github.com/kubebridge/kubebridge/pkg/components"
)

func main() {
	bridgecmd.Main(bridgecmd.Settings{Sinks: components.SinkRegistry()})
}

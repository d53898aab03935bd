// Package components is the one place where the sink types of a build are
// listed. A new sink type is a package exporting a sinks.Factory (its config
// key, its config with defaults and validation, its constructor) plus one
// line below; the config loader, `bridge validate`, the bridge and the
// config reference in README.md all take the list from here.
package components

import (
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/exec"
	"github.com/kubebridge/kubebridge/pkg/sinks/file"
	"github.com/kubebridge/kubebridge/pkg/sinks/kafka"
	"github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/sinks/webhook"
)

// Sinks lists the sink types of this build.
func Sinks() []sinks.Factory {
	return []sinks.Factory{
		nats.Factory,
		webhook.Factory,
		file.Factory,
		exec.Factory,
		kafka.Factory,
	}
}

// SinkRegistry returns the registry of Sinks(); it is also the config
// loader's config.SinkTypes.
func SinkRegistry() *sinks.Registry {
	r, err := sinks.NewRegistry(Sinks()...)
	if err != nil {
		panic("components: " + err.Error()) // a programming error in the list above, caught by its test
	}
	return r
}

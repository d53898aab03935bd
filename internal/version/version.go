// Package version holds the build's version, set at link time:
//
//	go build -ldflags "-X github.com/kubebridge/kubebridge/internal/version.Version=v0.1.0"
package version

import "runtime/debug"

// Version is the release version; "dev" when not set at link time.
var Version = "dev"

// Commit returns the VCS revision the binary was built from, when Go recorded it.
func Commit() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

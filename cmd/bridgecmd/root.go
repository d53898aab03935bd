package bridgecmd

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/kubebridge/kubebridge/internal/version"
)

// New returns the bridge's root command with its sub-commands, which know
// the sink types of s. Main runs it; a program that runs it itself gets
// errors whose message the command has not printed.
func New(s Settings) *cobra.Command {
	root := &cobra.Command{
		Use:           "bridge",
		Short:         "kubebridge turns Kubernetes changes into CloudEvents for NATS, webhooks and files",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if s.Sinks == nil {
				return errNoSinks
			}
			return nil
		},
	}
	root.AddCommand(newVersionCommand(), newValidateCommand(s.Sinks), newRunCommand(s.Sinks), newTailCommand(), newReplayCommand(s.Sinks))
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "bridge %s (commit %s, %s, %s/%s)\n",
				version.Version, version.Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

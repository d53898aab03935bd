package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/kubebridge/kubebridge/internal/version"
)

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "bridge",
		Short:         "kubebridge turns Kubernetes changes into CloudEvents for NATS, webhooks and files",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand(), newValidateCommand(), newRunCommand(), newTailCommand(), newReplayCommand())
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

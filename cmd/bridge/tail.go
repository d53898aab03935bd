package main

import (
	"context"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubebridge/kubebridge/pkg/tail"
)

func newTailCommand() *cobra.Command {
	var (
		o       tail.Options
		output  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tail --nats URL [--subject 'k8s.>'] [--jetstream STREAM]",
		Short: "Print kubebridge events from NATS",
		Long: `Tail subscribes to kubebridge's NATS subjects and prints each event: time,
change, resource, object, rule, and for updates the changed paths. With
--jetstream it reads the stream from its start; otherwise only what is
published from now on. -o json prints each event's JSON as received.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "json":
				o.JSON = true
			case "text":
			default:
				return &exitError{exitInvalid, errFlag("-o must be text or json")}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			if err := tail.Run(ctx, o, cmd.OutOrStdout()); err != nil {
				return &exitError{exitFailure, err}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.URL, "nats", "nats://127.0.0.1:4222", "NATS server URL")
	f.StringVar(&o.Subject, "subject", "k8s.>", "subject to read (wildcards allowed)")
	f.StringVar(&o.Stream, "jetstream", "", "read this JetStream stream from its start")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	f.IntVar(&o.Count, "count", 0, "exit after this many events (0: run until interrupted)")
	f.DurationVar(&timeout, "timeout", 0, "give up after this long (0: no limit); with --count, exit 1 if fewer arrived")
	return cmd
}

type errFlag string

func (e errFlag) Error() string { return string(e) }

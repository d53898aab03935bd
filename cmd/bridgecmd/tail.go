package bridgecmd

import (
	"context"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/tail"
)

func newTailCommand() *cobra.Command {
	var (
		o                      tail.Options
		output                 string
		timeout                time.Duration
		tlsCA, tlsCert, tlsKey string
	)
	cmd := &cobra.Command{
		Use:   "tail --nats URL [--subject 'k8s.>'] [--jetstream STREAM]",
		Short: "Print kubebridge events from NATS",
		Long: `Tail subscribes to kubebridge's NATS subjects and prints each event: time,
change, resource, object, rule, and for updates the changed paths. With
--jetstream it reads the stream from its start, every subject the stream
captures (--subject filters them); otherwise only what is published from
now on, on --subject (default k8s.>). -o json prints each event's JSON as one line, the
same JSON value with DEL, C1 controls and line separators escaped (\u009b),
and bytes that are not UTF-8 (a raw 0x9b, the 8-bit CSI) as \ufffd; a
message that is not JSON is printed as a JSON string. Names and paths
that hold control characters are printed quoted, with Go escapes. Either
way an object's name, labels or annotations cannot drive the terminal.
It authenticates as a nats sink does (--creds, --nkey, --token-file,
--user/--password-file, --tls-*).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tlsCA != "" || tlsCert != "" || tlsKey != "" {
				o.Connection.TLS = &config.TLS{CAFile: tlsCA, CertFile: tlsCert, KeyFile: tlsKey}
			}
			if tls := o.Connection.TLS; tls != nil && tls.Validate() != nil {
				return &exitError{exitInvalid, errFlag("--tls-cert and --tls-key go together")}
			}
			if (o.Connection.User == "") != (o.Connection.PasswordFile == "") {
				return &exitError{exitInvalid, errFlag("--user and --password-file go together")}
			}
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
	f.StringVar(&o.Connection.URL, "nats", "nats://127.0.0.1:4222", "NATS server URL (a comma-separated list for a cluster)")
	f.StringVar(&o.Connection.CredentialsFile, "creds", "", "NATS .creds file (JWT and nkey seed)")
	f.StringVar(&o.Connection.NKeySeedFile, "nkey", "", "file holding an nkey seed")
	f.StringVar(&o.Connection.TokenFile, "token-file", "", "file holding an auth token")
	f.StringVar(&o.Connection.User, "user", "", "user name; the password comes from --password-file")
	f.StringVar(&o.Connection.PasswordFile, "password-file", "", "file holding the password for --user")
	f.StringVar(&tlsCA, "tls-ca", "", "PEM bundle of CAs to trust (default: the system pool)")
	f.StringVar(&tlsCert, "tls-cert", "", "client certificate (PEM), with --tls-key")
	f.StringVar(&tlsKey, "tls-key", "", "client key (PEM), with --tls-cert")
	f.StringVar(&o.Subject, "subject", "", "subject to read, wildcards allowed (default k8s.>; with --jetstream, every subject of the stream)")
	f.StringVar(&o.Stream, "jetstream", "", "read this JetStream stream from its start, all its subjects unless --subject filters them")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	f.IntVar(&o.Count, "count", 0, "exit after this many events (0: run until interrupted)")
	f.DurationVar(&timeout, "timeout", 0, "give up after this long (0: no limit); with --count, exit 1 if fewer arrived")
	return cmd
}

type errFlag string

func (e errFlag) Error() string { return string(e) }

package bridgecmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubebridge/kubebridge/internal/bridge"
	"github.com/kubebridge/kubebridge/internal/preflight"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func newValidateCommand(sinkTypes *sinks.Registry) *cobra.Command {
	var (
		file, kubeconfig, kubeContext string
		credentialDirs                string
		timeout                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "validate --config FILE [--kubeconfig FILE]",
		Short: "Check a config offline and, with --kubeconfig, against a live cluster",
		Long: `Validate checks a config file: strict decoding, defaults, every field, the
references between rules and sinks, label and field selectors and CEL
expressions. It prints every problem with its file, line and key path.

With --kubeconfig it also asks the cluster whether each rule's resource
exists (CRDs included) and whether the current identity may list and watch
it in the namespaces the rule names, and prints each missing permission as
the RBAC rule that would grant it.

Exit status: 0 valid, 2 invalid, 1 when the cluster could not be asked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &exitError{exitInvalid, errors.New("validate: --config is required")}
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			cfg, warnings, err := config.Load(file, sinkTypes)
			for _, w := range warnings {
				fmt.Fprintln(errOut, w.Format(file))
			}
			if err != nil {
				fmt.Fprintln(errOut, err)
				return &exitError{exitInvalid, fmt.Errorf("%s is invalid (%s)", file, count(err.(*config.Error).Count(), "error"))}
			}
			dirs, err := config.ParseCredentialDirs(credentialDirs)
			if err != nil {
				return &exitError{exitInvalid, err}
			}
			// Offline the files need not exist here: lexically; run checks
			// again with links resolved.
			problems := config.ConfineCredentials(cfg, dirs, false)
			problems = append(problems, config.ConfineOutputFiles(cfg, config.Protected{ConfigFile: file, CheckpointFile: cfg.Checkpoint.File}, false)...)
			if len(problems) > 0 {
				for _, p := range problems {
					fmt.Fprintln(errOut, p.Format(file))
				}
				return &exitError{exitInvalid, fmt.Errorf("%s is invalid (%s)", file, count(len(problems), "error"))}
			}
			where := "offline"
			if kubeconfig != "" {
				rc, err := bridge.RESTConfig(kubeconfig, kubeContext)
				if err != nil {
					return &exitError{exitFailure, err}
				}
				rc.Timeout = timeout
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				cs, err := kubernetes.NewForConfig(rc)
				if err != nil {
					return &exitError{exitFailure, err}
				}
				_, problems, err := preflight.Check(ctx, cfg, cs)
				if err != nil {
					return &exitError{exitFailure, fmt.Errorf("cannot check against the cluster: %w", err)}
				}
				for _, p := range problems {
					fmt.Fprintln(errOut, p.Format(file))
				}
				// Warnings (a resource the cluster does not serve: its rule
				// waits for it) do not refuse the config.
				if errs := preflight.Errors(problems); len(errs) > 0 {
					return &exitError{exitInvalid, fmt.Errorf("%s does not fit the cluster at %s (%s)", file, rc.Host, count(len(errs), "error"))}
				}
				where = "and checked against " + rc.Host
			}
			fmt.Fprintf(out, "%s is valid %s: cluster %s, %s (%s), %s (%s)\n", file, where, cfg.Cluster,
				count(len(cfg.Sinks), "sink"), strings.Join(sinkNames(cfg), ", "),
				count(len(cfg.Rules), "rule"), strings.Join(ruleNames(cfg), ", "))
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "config", "c", "", "config file (required)")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "also check against the cluster of this kubeconfig")
	cmd.Flags().StringVar(&kubeContext, "context", "", "kubeconfig context (default: its current context)")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "bound on the cluster checks")
	addCredentialDirsFlag(cmd.Flags(), &credentialDirs)
	return cmd
}

func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func sinkNames(c *config.Config) []string {
	names := make([]string, len(c.Sinks))
	for i, s := range c.Sinks {
		names[i] = s.Name
	}
	return names
}

func ruleNames(c *config.Config) []string {
	names := make([]string, len(c.Rules))
	for i, r := range c.Rules {
		names[i] = r.Name
	}
	return names
}

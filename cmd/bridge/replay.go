package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubebridge/kubebridge/pkg/bridge"
)

func newReplayCommand() *cobra.Command {
	var admin, sink, rule string
	cmd := &cobra.Command{
		Use:   "replay --sink S [--rule R] [--admin URL]",
		Short: "Re-send a sink the full view of its rules, through a running bridge",
		Long: `Replay asks a running bridge (its admin endpoint) to queue every object of
every rule that delivers to the sink (or of one rule) to that sink, as
updated events with kbreplay: resync and their usual ids, and prints the
progress and the final count.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sink == "" {
				return &exitError{exitInvalid, errors.New("replay: --sink is required")}
			}
			q := url.Values{"sink": {sink}}
			if rule != "" {
				q.Set("rule", rule)
			}
			client := &http.Client{Timeout: 10 * time.Minute}
			resp, err := client.Post(admin+"/replay?"+q.Encode(), "", nil)
			if err != nil {
				return &exitError{exitFailure, fmt.Errorf("asking the bridge at %s: %w", admin, err)}
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
				return &exitError{exitFailure, fmt.Errorf("the bridge answered %s: %s", resp.Status, body)}
			}
			out := cmd.OutOrStdout()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				var p bridge.ReplayProgress
				if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
					return &exitError{exitFailure, fmt.Errorf("unexpected answer %q", sc.Text())}
				}
				if p.Done {
					fmt.Fprintf(out, "replay to sink %s: %d events queued\n", sink, p.Queued)
					return nil
				}
				fmt.Fprintf(out, "  rule %-30s %6d events queued\n", p.Rule, p.Queued)
			}
			return &exitError{exitFailure, fmt.Errorf("the bridge ended the replay early: %v", sc.Err())}
		},
	}
	f := cmd.Flags()
	f.StringVar(&admin, "admin", "http://127.0.0.1:8080", "the running bridge's admin endpoint")
	f.StringVar(&sink, "sink", "", "the sink to replay to (required)")
	f.StringVar(&rule, "rule", "", "only this rule's view (default: every rule of the sink)")
	return cmd
}

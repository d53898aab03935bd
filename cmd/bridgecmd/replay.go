package bridgecmd

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	adminapi "github.com/kubebridge/kubebridge/internal/admin"
	"github.com/kubebridge/kubebridge/internal/bridge"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func newReplayCommand(sinkTypes *sinks.Registry) *cobra.Command {
	var admin, sink, rule, file, kubeconfig, kubeContext, tokenFile string
	var allowSecretData, allowExecPlugins bool
	cmd := &cobra.Command{
		Use:   "replay --sink S [--rule R] (--admin URL | --config F [--kubeconfig K])",
		Short: "Re-send a sink the full view of its rules",
		Long: `Replay sends every object of every rule that delivers to the sink (or of
one rule) to that sink, as updated events with kbreplay: resync and their
usual ids, and prints the progress and the final count.

With --admin it asks a running bridge (its admin endpoint) to queue them,
with a bearer token (--token-file, or $KUBEBRIDGE_TOKEN, or the pod's
service account token) whose identity may create replays.kubebridge.io
(named after the sink) in the bridge's namespace.
With --config it runs standalone: it watches the cluster until its caches
sync, delivers the view to that one sink, waits for every acknowledgement
and exits (it writes no checkpoint).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sink == "" {
				return &exitError{exitInvalid, errors.New("replay: --sink is required")}
			}
			if file != "" {
				if _, _, err := applyKubeCBOR(cmd.Flags()); err != nil {
					return &exitError{exitInvalid, err}
				}
				if _, err := applyMemoryLimit(cmd.Flags()); err != nil {
					return &exitError{exitInvalid, err}
				}
				return replayStandalone(cmd, file, kubeconfig, kubeContext, sink, rule, bridge.Options{Sinks: sinkTypes, AllowSecretData: allowSecretData, OptIns: optIns(allowExecPlugins)})
			}
			q := url.Values{"sink": {sink}}
			if rule != "" {
				q.Set("rule", rule)
			}
			token, err := replayToken(tokenFile)
			if err != nil {
				return &exitError{exitInvalid, err}
			}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodPost, admin+"/replay?"+q.Encode(), nil)
			if err != nil {
				return &exitError{exitInvalid, fmt.Errorf("--admin: %w", err)}
			}
			if token != "" {
				if err := tokenMayGo(req.URL); err != nil {
					return &exitError{exitInvalid, err}
				}
				req.Header.Set("Authorization", "Bearer "+token)
			}
			client := &http.Client{Timeout: 10 * time.Minute}
			resp, err := client.Do(req)
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
				var p adminapi.ReplayProgress
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
	f.StringVar(&tokenFile, "token-file", "", "file holding the bearer token for --admin (default: $KUBEBRIDGE_TOKEN, else the pod's service account token)")
	f.StringVar(&sink, "sink", "", "the sink to replay to (required)")
	f.StringVar(&rule, "rule", "", "only this rule's view (default: every rule of the sink)")
	f.StringVarP(&file, "config", "c", "", "replay standalone with this config, instead of through a running bridge")
	f.StringVar(&kubeconfig, "kubeconfig", "", "with --config: kubeconfig file (default: in-cluster service account)")
	f.StringVar(&kubeContext, "context", "", "with --config: kubeconfig context")
	f.BoolVar(&allowSecretData, "allow-secret-data", false, "with --config: honour rules that set allowSecretData (as bridge run --allow-secret-data)")
	f.BoolVar(&allowExecPlugins, "allow-exec-plugins", false, "with --config: let an exec sink run its program (as bridge run --allow-exec-plugins)")
	f.Bool(kubeCBORFlag, true, "with --config: let the informers read CBOR from the apiserver (as bridge run --kube-cbor)")
	addMemoryLimitFlag(f)
	return cmd
}

// tokenMayGo refuses to send a token in clear text beyond this machine:
// http is for loopback (kubectl port-forward), https for the rest.
func tokenMayGo(u *url.URL) error {
	if u.Scheme == "https" {
		return nil
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--admin %s: a token is not sent over plain http beyond loopback; use kubectl port-forward and http://127.0.0.1, or https", u.Redacted())
}

// saTokenFile is where a pod's service account token is mounted.
var saTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// replayToken finds the bearer token for /replay: the file named, else
// $KUBEBRIDGE_TOKEN, else the pod's service account token, else none (the
// bridge then answers 401).
func replayToken(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if t := os.Getenv("KUBEBRIDGE_TOKEN"); t != "" {
		return strings.TrimSpace(t), nil
	}
	if b, err := os.ReadFile(saTokenFile); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}

func replayStandalone(cmd *cobra.Command, file, kubeconfig, kubeContext, sink, rule string, opts bridge.Options) error {
	cfg, rc, err := loadForCluster(cmd, opts.Sinks, file, kubeconfig, kubeContext, func(w config.Problem) {
		fmt.Fprintln(cmd.ErrOrStderr(), w.Format(file))
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	out := cmd.OutOrStdout()
	last := -1
	opts.Config, opts.REST = cfg, rc
	st, err := bridge.Replay(ctx, opts, sink, rule, func(s bridge.ReplayStatus) {
		if s.Delivered+s.Failed == last && !s.Done {
			return
		}
		last = s.Delivered + s.Failed
		fmt.Fprintf(out, "  %s %d/%d delivered\n", bar(s.Delivered+s.Failed, s.Queued), s.Delivered, s.Queued)
	})
	if err != nil {
		var ce *bridge.ConfigError
		if errors.As(err, &ce) {
			for _, p := range ce.Problems {
				fmt.Fprintln(cmd.ErrOrStderr(), p.Format(file))
			}
			return &exitError{exitInvalid, fmt.Errorf("%s does not fit the cluster", file)}
		}
		return &exitError{exitFailure, err}
	}
	fmt.Fprintf(out, "replay to sink %s: %d events delivered", sink, st.Delivered)
	if st.Failed > 0 {
		fmt.Fprintf(out, ", %d refused", st.Failed)
	}
	fmt.Fprintln(out)
	return nil
}

// bar draws a 30-character progress bar.
func bar(done, total int) string {
	const width = 30
	n := width
	if total > 0 {
		n = done * width / total
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

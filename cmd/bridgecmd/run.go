package bridgecmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/bridge"
	"github.com/kubebridge/kubebridge/internal/version"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	execsink "github.com/kubebridge/kubebridge/pkg/sinks/exec"
)

func newRunCommand(sinkTypes *sinks.Registry) *cobra.Command {
	var (
		file, kubeconfig, kubeContext, logFormat, logLevel                 string
		checkpointFile, adminAddr, adminAddrFile, profilingAddr, namespace string
		credentialDirs, memberSelector                                     string
		resetCheckpoint, leaderElect, reload, profiling                    bool
		allowSecretData, allowExecPlugins                                  bool
		le                                                                 bridge.LeaderElection
		drainTimeout, syncTimeout, checkpointInterval                      time.Duration
		resourcePoll                                                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run --config FILE [--kubeconfig FILE]",
		Short: "Watch the cluster and deliver events to the configured sinks",
		Long: `Run loads the config (exit 2 if it is invalid or does not fit the cluster:
unknown resources, missing RBAC), starts one queue and worker per sink and
the shared informers, reconciles each sink with its checkpoint (what
changed while the bridge was down is delivered with kbreplay: checkpoint),
and delivers events until SIGINT or SIGTERM. The
first signal stops watching and drains the queues into the sinks for up to
--drain-timeout; a second signal exits at once.

Without --kubeconfig it uses the in-cluster service account.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &exitError{exitInvalid, errors.New("run: --config is required")}
			}
			logger, err := newLogger(logFormat, logLevel)
			if err != nil {
				return &exitError{exitInvalid, err}
			}
			cbor, cborFrom, err := applyKubeCBOR(cmd.Flags())
			if err != nil {
				return &exitError{exitInvalid, err}
			}
			mem, err := applyMemoryLimit(cmd.Flags())
			if err != nil {
				return &exitError{exitInvalid, err}
			}
			credDirs, err := config.ParseCredentialDirs(credentialDirs)
			if err != nil {
				return &exitError{exitInvalid, err}
			}
			cfg, rc, err := loadForCluster(cmd, sinkTypes, file, kubeconfig, kubeContext, func(w config.Problem) { logger.Warn("config: " + w.Format(file)) })
			if err != nil {
				return err
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			opts := bridge.Options{Config: cfg, Sinks: sinkTypes, REST: rc, Logger: logger, SyncTimeout: syncTimeout,
				CheckpointFile: checkpointFile, ResetCheckpoint: resetCheckpoint, CheckpointInterval: checkpointInterval,
				AllowSecretData: allowSecretData, OptIns: optIns(allowExecPlugins), Namespace: namespace, CredentialDirs: credDirs,
				ResourcePoll: resourcePoll, ReloadDrain: drainTimeout}
			sharding := cfg.Sharding != nil
			if leaderElect || sharding { // sharding: a Lease per shard, with the same settings
				if le.RenewDeadline >= le.LeaseDuration || le.RetryPeriod >= le.RenewDeadline {
					return &exitError{exitInvalid, errors.New("leader election: want --leader-elect-retry-period < --leader-elect-renew-deadline < --leader-elect-lease-duration")}
				}
				if memberSelector != "" {
					sel, err := labels.Parse(memberSelector)
					if err != nil {
						return &exitError{exitInvalid, fmt.Errorf("--shard-member-selector: %w", err)}
					}
					if le.PodUID == "" {
						return &exitError{exitInvalid, errors.New("--shard-member-selector needs --pod-uid (default $POD_UID): this replica's member Lease carries its Pod's uid")}
					}
					le.MemberSelector = sel
				}
				opts.LeaderElection = &le
			}
			b := bridge.New(opts)
			logger.Info("starting", "version", version.Version, "config", file, "cluster", cfg.Cluster, "apiserver", rc.Host, "kubeCBOR", cbor, "kubeCBORFrom", cborFrom,
				"memoryLimit", mem.Bytes, "memoryLimitFrom", mem.From)
			if adminAddr != "" {
				ln, err := net.Listen("tcp", adminAddr)
				if err != nil {
					return &exitError{exitFailure, fmt.Errorf("--admin-addr: %w", err)}
				}
				defer serve(ln, b.AdminHandler())()
				logger.Info("admin endpoints listening", "addr", ln.Addr().String(), "paths", "/healthz /readyz /metrics /replay")
				if adminAddrFile != "" {
					if err := writeFileAtomic(adminAddrFile, []byte(ln.Addr().String()+"\n")); err != nil {
						return &exitError{exitFailure, fmt.Errorf("--admin-addr-file: %w", err)}
					}
				}
			}
			if profiling {
				ln, err := listenLoopback(profilingAddr)
				if err != nil {
					return &exitError{exitInvalid, fmt.Errorf("--profiling-addr: %w", err)}
				}
				defer serve(ln, profilingHandler())()
				logger.Info("pprof listening (loopback only)", "addr", ln.Addr().String())
			}
			if err := b.Start(ctx); err != nil {
				var ce *bridge.ConfigError
				if errors.As(err, &ce) {
					for _, p := range ce.Problems {
						fmt.Fprintln(cmd.ErrOrStderr(), p.Format(file))
					}
					return &exitError{exitInvalid, fmt.Errorf("%s does not fit the cluster at %s; nothing was started", file, rc.Host)}
				}
				if ctx.Err() != nil { // SIGTERM while starting (a pod deleted early): a clean stop
					logger.Info("stopped before it had started", "cause", context.Cause(ctx))
					return nil
				}
				return &exitError{exitFailure, fmt.Errorf("start: %w", err)}
			}
			watchCtx, stopWatch := context.WithCancel(ctx)
			watching := make(chan struct{})
			if reload {
				go func() {
					defer close(watching)
					watchConfig(watchCtx, file, sinkTypes, b, logger)
				}()
			} else {
				close(watching)
			}
			var fatal error
			select {
			case <-ctx.Done():
			case fatal = <-b.Fatal():
				logger.Error("stopping", "error", fatal)
			}
			stopWatch()
			<-watching // no reload starts once the shutdown does
			stop()     // a second signal now ends the process (Go's default)
			logger.Info("stopping: draining queues", "timeout", drainTimeout)
			drainCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			// The teardown is bounded piece by piece; this bounds it as a
			// whole, whatever a destination cut off by a partition holds
			// (the exit ends the goroutine): leaving then is a SIGKILL's
			// leaving, which the next start and the shards' new owners
			// reconcile from the checkpoint.
			shut := make(chan error, 1)
			go func() { shut <- b.Shutdown(drainCtx) }()
			select {
			case err = <-shut:
			case <-time.After(drainTimeout + shutdownGrace):
				err = fmt.Errorf("the shutdown did not end within %s of the drain; exiting without it (what was not recorded is sent again by the next owner)", shutdownGrace)
			}
			if err != nil {
				logger.Error("shutdown incomplete", "error", err)
				return &exitError{exitFailure, err}
			}
			for _, d := range b.Deliveries() {
				s := d.Stats()
				logger.Info("sink stopped", "sink", d.Name, "delivered", s.Delivered, "failed", s.Failed, "coalesced", s.Queue.Coalesced)
			}
			if fatal != nil {
				return &exitError{exitFailure, fatal}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "config", "c", "", "config file (required)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster service account)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context (default: its current context)")
	f.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.DurationVar(&drainTimeout, "drain-timeout", 10*time.Second, "on shutdown, how long queues may drain into their sinks; on a reload, how long a replaced sink may (what is left is sent again from the checkpoint)")
	f.DurationVar(&syncTimeout, "sync-timeout", 2*time.Minute, "how long to wait for the informers' first sync")
	f.StringVar(&checkpointFile, "checkpoint-file", "", "checkpoint file, instead of the config's checkpoint (file or natsKV)")
	f.DurationVar(&resourcePoll, "resource-poll", 10*time.Second, "how often to ask the cluster whether each rule's resource is served (a rule whose CRD is absent waits for it; one whose CRD is deleted delivers its objects' deletions)")
	f.DurationVar(&checkpointInterval, "checkpoint-interval", time.Second, "how often acknowledged events are written to the checkpoint (the most a crash redelivers)")
	f.StringVar(&adminAddr, "admin-addr", ":8080", "address of /healthz, /readyz, /metrics and /replay (empty: none)")
	f.StringVar(&adminAddrFile, "admin-addr-file", "", "write the admin endpoints' address (host:port) to this file once they listen: for scripts and tests that pass --admin-addr with port 0")
	f.StringVar(&namespace, "namespace", envOr("POD_NAMESPACE", "default"), "the namespace the bridge runs in: callers of /replay need create on replays.kubebridge.io there")
	f.BoolVar(&profiling, "profiling", false, "serve Go's pprof profiles under /debug/pprof/ on --profiling-addr")
	f.StringVar(&profilingAddr, "profiling-addr", "127.0.0.1:6060", "loopback address of the pprof profiles (a profile shows internals and costs CPU: never beyond the pod; use kubectl port-forward)")
	f.BoolVar(&reload, "reload", true, "apply changes of the config file live (checked first; a bad config is refused and the running one stays)")
	f.BoolVar(&leaderElect, "leader-elect", false, "deliver only while holding a Lease; other replicas keep warm caches and take over")
	f.StringVar(&le.Namespace, "leader-elect-namespace", envOr("POD_NAMESPACE", "default"), "namespace of the Lease")
	f.StringVar(&le.Name, "leader-elect-name", "kubebridge", "name of the Lease (with sharding: the prefix of the shards' Leases, <name>-shard-<i>)")
	f.StringVar(&le.Identity, "identity", envOr("POD_NAME", ""), "this replica's name in the Leases, unique among the replicas (default: $POD_NAME, else the host name and pid)")
	f.DurationVar(&le.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a lease holds without renewal")
	f.DurationVar(&le.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "the leader stops delivering when it could not renew for this long")
	f.DurationVar(&le.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "how often to try to acquire or renew")
	f.StringVar(&memberSelector, "shard-member-selector", "", "with sharding, count another replica only when its identity is a running Pod in --leader-elect-namespace that matches this label selector and whose uid its member Lease carries (the chart passes its selector labels); empty: every member Lease counts, whoever wrote it")
	f.StringVar(&le.PodUID, "pod-uid", envOr("POD_UID", ""), "this replica's Pod uid, written into its member Lease for --shard-member-selector")
	f.BoolVar(&allowSecretData, "allow-secret-data", false, "honour rules that set allowSecretData: true (Secret data then leaves the cluster in their events); without it Secret data is always redacted, whatever the config says")
	f.BoolVar(&allowExecPlugins, "allow-exec-plugins", false, "let exec sinks start the programs the config names (whoever may edit the config may then run code as the bridge)")
	addCredentialDirsFlag(f, &credentialDirs)
	addKubeCBORFlag(f)
	addMemoryLimitFlag(f)
	f.BoolVar(&resetCheckpoint, "reset-checkpoint", false, "move an unreadable checkpoint file aside and start empty (the full view is delivered again)")
	return cmd
}

// watchConfig polls the config file (a ConfigMap volume swaps it through
// a symlink, so its content is compared, not its inode) and reloads the
// bridge with each new, valid version.
func watchConfig(ctx context.Context, file string, sinkTypes *sinks.Registry, b *bridge.Bridge, logger *slog.Logger) {
	last, _ := os.ReadFile(file)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		data, err := os.ReadFile(file)
		if err != nil || bytes.Equal(data, last) {
			continue
		}
		last = data
		cfg, _, err := config.Parse(file, data, sinkTypes)
		if err != nil {
			logger.Error("config change refused: the running config stays", "errors", err.Error())
			continue
		}
		if err := b.Reload(ctx, cfg); err != nil {
			var ce *bridge.ConfigError
			if errors.As(err, &ce) {
				for _, p := range ce.Problems {
					logger.Error("config change refused: the running config stays", "problem", p.Format(file))
				}
				continue
			}
			if errors.Is(err, bridge.ErrReloadAborted) {
				logger.Error("config change failed while being applied; stopping (the next start reconciles from the checkpoint)", "error", err)
				continue
			}
			logger.Error("config change refused: the running config stays", "error", err)
		}
	}
}

// loadForCluster loads the config (printing its errors: exit 2) and the
// client config for the cluster (exit 1 when that fails).
func loadForCluster(cmd *cobra.Command, sinkTypes *sinks.Registry, file, kubeconfig, kubeContext string, warn func(config.Problem)) (*config.Config, *rest.Config, error) {
	cfg, warnings, err := config.Load(file, sinkTypes)
	for _, w := range warnings {
		warn(w)
	}
	if err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), err)
		return nil, nil, &exitError{exitInvalid, fmt.Errorf("%s is invalid", file)}
	}
	rc, err := bridge.RESTConfig(kubeconfig, kubeContext)
	if err != nil {
		return nil, nil, &exitError{exitFailure, err}
	}
	return cfg, rc, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: want json or text, got %q", format)
}

// serve serves h on ln until the returned stop is called, which waits
// for the server's goroutine.
func serve(ln net.Listener, h http.Handler) (stop func()) {
	// Bounded for clients that open connections and hold them: headers
	// and the (empty) body within 10s/30s, idle keep-alives closed after
	// 2 minutes, 64 KiB of headers. No write timeout: /replay streams its
	// progress for as long as a replay takes.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		_ = srv.Close()
		<-done
	}
}

// listenLoopback listens on addr, which must be a loopback address.
func listenLoopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%q is not a loopback address (127.0.0.1, ::1 or localhost): profiles must not be reachable from the network", addr)
	}
	return net.Listen("tcp", addr)
}

// profilingHandler serves net/http/pprof's handlers. They are off by
// default: a profile is costly to take and shows internals.
func profilingHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// addCredentialDirsFlag adds --credential-dirs: where the credential files
// a config names may be (the pod's service-account directory never).
func addCredentialDirsFlag(f *pflag.FlagSet, v *string) {
	f.StringVar(v, "credential-dirs", strings.Join(config.DefaultCredentialDirs, ","),
		"comma-separated directories the config's credential files (tokens, signing secrets, NATS creds, TLS keys: every *File key) must be in, symbolic links resolved; the pod's service-account directory is refused whatever this says")
}

// optIns are the permissions the flags give sink types that need one
// (--allow-exec-plugins: exec sinks).
func optIns(allowExecPlugins bool) map[string]bool {
	return map[string]bool{execsink.OptInName: allowExecPlugins}
}

// writeFileAtomic writes data to path through a temporary file and a
// rename, so that a reader sees the old content or the new, never part.
// The temporary file is new (O_EXCL, a random name in path's directory): a
// link planted where it goes is never followed, so nothing but path is
// written; the rename replaces a link at path itself, not its target.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o644) // CreateTemp makes it 0600: readers are scripts of other users
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// shutdownGrace is how long the teardown may take past the drain: the
// last checkpoint writes, closing the sinks (each bounded on its own), the
// Leases released.
const shutdownGrace = 20 * time.Second

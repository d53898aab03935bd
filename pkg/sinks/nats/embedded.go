package nats

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultEmbeddedAddr is where an embedded server listens when url is empty.
const DefaultEmbeddedAddr = "127.0.0.1:4222"

// startEmbedded runs a nats-server with JetStream inside the bridge, for dev
// and single-node setups (embedded: true). It listens on the host:port of
// c.URL (default 127.0.0.1:4222) and keeps JetStream data under
// $KUBEBRIDGE_DATA_DIR/nats/<sink> (default: the user cache dir). It
// returns the URL to connect to.
func startEmbedded(name string, c *Config) (*server.Server, string, error) {
	addr := DefaultEmbeddedAddr
	if c.URL != "" {
		u, err := url.Parse(strings.Split(c.URL, ",")[0])
		if err != nil {
			return nil, "", err
		}
		addr = u.Host
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("embedded server address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, "", fmt.Errorf("embedded server port %q: %w", portStr, err)
	}
	if !loopback(host) && c.TokenFile == "" && c.User == "" {
		return nil, "", fmt.Errorf("embedded server on %s: a non-loopback address needs tokenFile or user/passwordFile (anyone who reaches it could read and publish events)", addr)
	}
	dataDir := os.Getenv("KUBEBRIDGE_DATA_DIR")
	if dataDir == "" {
		if dataDir, err = os.UserCacheDir(); err != nil {
			dataDir = os.TempDir()
		}
		dataDir = filepath.Join(dataDir, "kubebridge")
	}
	opts := &server.Options{
		ServerName: "kubebridge-" + name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(dataDir, "nats", name),
		NoSigs:     true,
		NoLog:      true,
	}
	// The server takes the credentials its own clients (the sink, tail)
	// present.
	switch {
	case c.TokenFile != "":
		tok, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, "", fmt.Errorf("tokenFile: %w", err)
		}
		opts.Authorization = strings.TrimSpace(string(tok))
		if opts.Authorization == "" {
			return nil, "", fmt.Errorf("tokenFile %s is empty: the server would take any client", c.TokenFile)
		}
	case c.User != "":
		pw, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return nil, "", fmt.Errorf("passwordFile: %w", err)
		}
		opts.Username, opts.Password = c.User, strings.TrimRight(string(pw), "\r\n")
		if opts.Password == "" {
			return nil, "", fmt.Errorf("passwordFile %s is empty", c.PasswordFile)
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, "", fmt.Errorf("embedded nats-server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, "", errors.New("embedded nats-server: not ready within 10s (is the port taken?)")
	}
	return srv, srv.ClientURL(), nil
}

// Embedded is a nats-server run inside the bridge, owned by whoever
// started it: the host (sinks.Host) keeps one per embedded sink's server
// settings across reloads of that sink (sharedEmbedded), so that the
// connections of the KV checkpoint and of dead-letters to it outlive the
// sink.
type Embedded struct {
	srv *server.Server
	// URL is where its clients connect.
	URL string
}

// StartEmbedded runs the server an embedded sink named name configures.
func StartEmbedded(name string, c *Config) (*Embedded, error) {
	srv, url, err := startEmbedded(name, c)
	if err != nil {
		return nil, err
	}
	return &Embedded{srv: srv, URL: url}, nil
}

// Close shuts the server down and waits for it.
func (e *Embedded) Close() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// EmbeddedKey identifies the server an embedded sink configures: what
// startEmbedded reads (its name names the store directory).
func EmbeddedKey(name string, c *Config) string {
	return strings.Join([]string{name, c.URL, c.TokenFile, c.User, c.PasswordFile}, "\x00")
}

// WithServer returns a copy of c that connects to the server at url as a
// client of it, instead of running one (the host runs it).
func (c *Config) WithServer(url string) *Config {
	cc := *c
	cc.Embedded, cc.URL = false, url
	return &cc
}

// loopback says whether host (a listen address) is reachable from this
// machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

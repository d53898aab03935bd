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

package nats

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// An embedded server beyond loopback would let anyone who reaches it read
// and publish events: it refuses to start without credentials, and with a
// token it requires the token of every client.
func TestEmbeddedServerBeyondLoopbackNeedsAuth(t *testing.T) {
	t.Setenv("KUBEBRIDGE_DATA_DIR", t.TempDir())
	port := strconv.Itoa(testenv.FreePort())
	_, _, err := startEmbedded("open", &Config{Embedded: true, URL: "nats://0.0.0.0:" + port, Subject: DefaultSubject})
	if err == nil || !strings.Contains(err.Error(), "needs tokenFile or user/passwordFile") {
		t.Fatalf("err = %v", err)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	must(t, os.WriteFile(empty, []byte("\n"), 0o600))
	if _, _, err := startEmbedded("blank", &Config{Embedded: true, URL: "nats://0.0.0.0:" + port, TokenFile: empty, Subject: DefaultSubject}); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("an empty token file: err = %v", err)
	}

	tokenFile := filepath.Join(t.TempDir(), "token")
	must(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))
	srv, url, err := startEmbedded("guarded", &Config{Embedded: true, URL: "nats://0.0.0.0:" + port, TokenFile: tokenFile, Subject: DefaultSubject})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if nc, err := natsgo.Connect(url, natsgo.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("a client without the token connected")
	}
	nc, err := natsgo.Connect(url, natsgo.Token("s3cret"))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	nc.Close()

	// On loopback, as in the demo, no credentials are needed.
	lo, loURL, err := startEmbedded("local", &Config{Embedded: true, URL: "nats://127.0.0.1:" + strconv.Itoa(testenv.FreePort()), Subject: DefaultSubject})
	if err != nil {
		t.Fatal(err)
	}
	defer lo.WaitForShutdown()
	defer lo.Shutdown()
	nc, err = natsgo.Connect(loURL)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

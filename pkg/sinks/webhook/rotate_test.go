package webhook

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// A rotated bearer token and signing secret are picked up without a
// reload: the receiver's 401 makes the sink read the files again at once
// (the periodic check is set to an hour here), the refused event is
// retried, not lost, and succeeds with the new credentials.
func TestCredentialRotationAfter401(t *testing.T) {
	old := sinks.CheckEvery
	sinks.CheckEvery = time.Hour
	t.Cleanup(func() { sinks.CheckEvery = old })
	var mu sync.Mutex
	token, secret := "first", []byte("hmac-one")
	accepted := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+token || verifyV2(secret, r.Header, body, time.Now()) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		accepted++
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	tokenFile, secretFile := filepath.Join(dir, "token"), filepath.Join(dir, "hmac")
	must(t, os.WriteFile(tokenFile, []byte("first\n"), 0o600))
	must(t, os.WriteFile(secretFile, []byte("hmac-one\n"), 0o600))
	s, err := New(&Config{URL: srv.URL, Mode: "binary", Timeout: config.Duration(5 * time.Second), BearerTokenFile: tokenFile, SigningSecretFile: secretFile}, nil)
	must(t, err)
	defer s.Close(context.Background())
	src := sinkstest.NewSource(10)
	e := src.Next(1)
	must(t, s.Send(context.Background(), []*event.Event{e}))

	// Rotated on both sides, the files through a new inode as a Secret
	// volume does.
	mu.Lock()
	token, secret = "second", []byte("hmac-two")
	mu.Unlock()
	replace(t, tokenFile, "second\n")
	replace(t, secretFile, "hmac-two\n")
	e = src.Next(1)
	err = s.Send(context.Background(), []*event.Event{e})
	if r, ok := sinks.DestinationReason(err); !ok || r != sinks.ReasonUnauthorized {
		t.Fatalf("first send after rotation = %v, want the destination's unauthorized (retried, not refused)", err)
	}
	must(t, s.Send(context.Background(), []*event.Event{e}))
	mu.Lock()
	defer mu.Unlock()
	if accepted != 2 {
		t.Errorf("accepted %d events, want 2", accepted)
	}
}

func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	must(t, os.WriteFile(tmp, []byte(content), 0o600))
	must(t, os.Rename(tmp, path))
}

// A rotated CA (the receiver's certificate re-issued by a new CA, the
// caFile updated): new connections trust the new CA without a reload.
func TestCAFileRotation(t *testing.T) {
	old := sinks.CheckEvery
	sinks.CheckEvery = 0
	t.Cleanup(func() { sinks.CheckEvery = old })
	ca1, cert1 := issue(t)
	ca2, cert2 := issue(t)
	var mu sync.Mutex
	current := cert1
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	// A TLS listener of our own: httptest's StartTLS would serve its
	// built-in certificate to a client that sends no SNI (an IP address).
	srv.Listener = tls.NewListener(srv.Listener, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		return &current, nil
	}})
	srv.Start()
	t.Cleanup(srv.Close)
	url := "https://" + srv.Listener.Addr().String()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	must(t, os.WriteFile(caFile, ca1, 0o600))
	s, err := New(&Config{URL: url, Mode: "binary", Timeout: config.Duration(5 * time.Second), TLS: &config.TLS{CAFile: caFile}}, nil)
	must(t, err)
	defer s.Close(context.Background())
	src := sinkstest.NewSource(10)
	must(t, s.Send(context.Background(), []*event.Event{src.Next(1)}))

	mu.Lock()
	current = cert2
	mu.Unlock()
	srv.CloseClientConnections()
	replace(t, caFile, string(ca2))
	must(t, s.Send(context.Background(), []*event.Event{src.Next(1)}))
}

// issue makes a CA and a certificate for 127.0.0.1 signed by it.
func issue(t *testing.T) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(t, err)
	ca, err := x509.ParseCertificate(caDER)
	must(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "receiver"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A credential a request sends must stay a token: a credentialFiles entry
// that holds a private key is refused when the sink is built, naming the
// key; one rotated into a key later is not sent (the event is retried as
// the sink's config failing, never lost) until it holds a token again.
func TestSentCredentialStaysAToken(t *testing.T) {
	old := sinks.CheckEvery
	sinks.CheckEvery = 0
	t.Cleanup(func() { sinks.CheckEvery = old })
	srv, got := recordRequests(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	const pemKey = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI...\n-----END PRIVATE KEY-----\n"
	must(t, os.WriteFile(keyFile, []byte(pemKey), 0o600))
	r := &Request{Method: http.MethodPost, Body: `{"routing_key": credentials.key}`}
	_, err := New(&Config{URL: srv.URL, Mode: "binary", Timeout: config.Duration(time.Second), Request: r, CredentialFiles: map[string]string{"key": keyFile}}, nil)
	if err == nil || !strings.Contains(err.Error(), "credentialFiles.key: "+keyFile+" holds a PEM private key") {
		t.Fatalf("New with a private key as a credential: %v", err)
	}
	replace(t, keyFile, "R0UT1NGKEY\n")
	s := shaped(t, srv.URL, r, func(c *Config) { c.CredentialFiles = map[string]string{"key": keyFile} })
	must(t, s.Send(context.Background(), []*event.Event{pod("prod", "a", "Failed", "")}))
	replace(t, keyFile, pemKey)
	err = s.Send(context.Background(), []*event.Event{pod("prod", "b", "Failed", "")})
	if reason, _ := sinks.DestinationReason(err); reason != sinks.ReasonConfig || strings.Contains(err.Error(), "MC4CAQ") {
		t.Errorf("after the file became a key: %v, want the sink's config failing, without the key", err)
	}
	for _, req := range got() {
		if strings.Contains(string(req.body), "PRIVATE") {
			t.Errorf("the key was sent: %s", req.body)
		}
	}
	if n := len(got()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

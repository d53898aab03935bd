package kafka

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// TLS with the broker's CA from caFile: the sink verifies the broker
// (127.0.0.1, an IP SAN) and produces; with another CA it is refused and
// nothing is acknowledged.
func TestTLS(t *testing.T) {
	caPEM, cert := issue(t)
	otherCA, _ := issue(t)
	b := startBroker(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	dir := t.TempDir()
	caFile, otherFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherFile, otherCA, 0o600); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, b, func(c *Config) { c.TLS = &config.TLS{CAFile: caFile} })
	mustSend(t, s, ev(event.Added, "prod", "a", "uid-a", 1))

	bad := newSink(t, b, func(c *Config) { c.TLS = &config.TLS{CAFile: otherFile}; c.Timeout = config.Duration(time.Second) })
	if err := bad.Send(context.Background(), []*event.Event{ev(event.Updated, "prod", "a", "uid-a", 2)}); err == nil || sinks.IsPermanent(err) {
		t.Fatalf("Send to a broker the CA does not vouch for: %v, want a retryable failure", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	recs := readTopic(t, b.addrs(), "k8s.test.cms", kgo.DialTLSConfig(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}))
	if len(recs) != 1 {
		t.Errorf("%d records, want 1:%s", len(recs), describe(recs))
	}
}

// issue makes a CA and a certificate for 127.0.0.1 signed by it.
func issue(t *testing.T) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "broker"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

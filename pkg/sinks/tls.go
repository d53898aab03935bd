package sinks

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// TLSFiles is a sink's tls block with its files read again when they
// change (a cert-manager renewal, a rotated CA): Config returns a config
// built from what the files hold now.
type TLSFiles struct {
	c         config.TLS
	ca        *CredentialFile
	cert, key *CredentialFile
}

// OpenTLS reads the files of a tls block; what cannot be read or parsed at
// start is an error naming the key.
func OpenTLS(c *config.TLS) (*TLSFiles, error) {
	t := &TLSFiles{c: *c}
	var err error
	if c.CAFile != "" {
		if t.ca, err = OpenCredentialFile(c.CAFile, nil); err != nil {
			return nil, fmt.Errorf("tls.caFile: %w", err)
		}
	}
	if c.CertFile != "" {
		if t.cert, err = OpenCredentialFile(c.CertFile, nil); err != nil {
			return nil, fmt.Errorf("tls.certFile: %w", err)
		}
		if t.key, err = OpenCredentialFile(c.KeyFile, nil); err != nil {
			return nil, fmt.Errorf("tls.keyFile: %w", err)
		}
	}
	if _, err := t.RootCAs(); err != nil {
		return nil, err
	}
	if _, err := t.Certificate(); err != nil {
		return nil, err
	}
	return t, nil
}

// Generation grows whenever one of the files' content changes.
func (t *TLSFiles) Generation() int {
	g := 0
	for _, f := range []*CredentialFile{t.ca, t.cert, t.key} {
		if f != nil {
			_, n := f.Value()
			g += n
		}
	}
	return g
}

// Base is the config without the files' content: the version floor and
// the opt-in to skip verification.
func (t *TLSFiles) Base() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.c.InsecureSkipVerify} //nolint:gosec // opt-in, warned about at load and start
}

// RootCAs is the pool of caFile as it is now (nil: the system's).
func (t *TLSFiles) RootCAs() (*x509.CertPool, error) {
	if t.ca == nil {
		return nil, nil
	}
	pem, _ := t.ca.Value()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls.caFile %s: no PEM certificates", t.ca.Path())
	}
	return pool, nil
}

// Certificate is the client certificate as it is now (a zero one when
// none is configured).
func (t *TLSFiles) Certificate() (tls.Certificate, error) {
	if t.cert == nil {
		return tls.Certificate{}, nil
	}
	certPEM, _ := t.cert.Value()
	keyPEM, _ := t.key.Value()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls.certFile/keyFile: %w", err)
	}
	return cert, nil
}

// HasCertificate says whether a client certificate is configured.
func (t *TLSFiles) HasCertificate() bool { return t.cert != nil }

// Config builds the client config from the files as they are now.
func (t *TLSFiles) Config() (*tls.Config, error) {
	tc := t.Base()
	pool, err := t.RootCAs()
	if err != nil {
		return nil, err
	}
	tc.RootCAs = pool
	if t.cert != nil {
		cert, err := t.Certificate()
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// TLSConfig builds a client TLS config from a sink's tls block, once.
func TLSConfig(c *config.TLS) (*tls.Config, error) {
	t, err := OpenTLS(c)
	if err != nil {
		return nil, err
	}
	return t.Config()
}

package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// What a sink sends is kept apart from what the bridge only uses: a
// credentialFiles entry or a bearer token that is a TLS private key, a
// certificate, NATS credentials or a seed, a multi-line file, or a file the
// config also uses as a key is refused, by validate (where the file can be
// read) and run, naming the key; a token passes.
func TestSentCredentialsAreTokens(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"token":   "  xoxb-0123456789-abcdef\n",
		"tls.key": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA...\n-----END EC PRIVATE KEY-----\n",
		"ca.crt":  "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n",
		"user.creds": "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1Qi...\n------END NATS USER JWT------\n\n" +
			"-----BEGIN USER NKEY SEED-----\nSUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY\n------END USER NKEY SEED------\n",
		"seed":  "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY\n",
		"lines": "first\nsecond\n",
		"hmac":  "s3cr3t\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	doc := strings.ReplaceAll(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: pd
    webhook:
      url: https://events.example.com/
      signingSecretFile: DIR/hmac
      bearerTokenFile: DIR/seed
      request:
        body: '{"a": credentials.a, "b": credentials.b, "c": credentials.c, "d": credentials.d, "e": credentials.e, "f": credentials.f, "g": credentials.g}'
      credentialFiles:
        a: DIR/token
        b: DIR/tls.key
        c: DIR/ca.crt
        d: DIR/user.creds
        e: DIR/lines
        f: DIR/hmac
        g: DIR/missing
rules:
  - {name: r, resource: v1/configmaps, sinks: [pd]}
`, "DIR", dir)
	cfg, _, err := config.Parse("c.yaml", []byte(doc), components.SinkRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, resolve := range []bool{false, true} {
		var got []string
		for _, p := range config.ConfineCredentials(cfg, []string{dir}, resolve) {
			got = append(got, strings.ReplaceAll(p.Format("c.yaml"), dir, "DIR"))
		}
		want := []string{
			"c.yaml:9: sinks[0].webhook.bearerTokenFile: DIR/seed holds a NATS nkey seed, which the bridge may use (nkeySeedFile) but never sends: a credential a sink sends is a token (an API key), one line",
			"c.yaml:14: sinks[0].webhook.credentialFiles.b: DIR/tls.key holds a PEM private key, which the bridge may use (tls.keyFile) but never sends: a credential a sink sends is a token (an API key), one line",
			"c.yaml:15: sinks[0].webhook.credentialFiles.c: DIR/ca.crt holds a PEM block, which the bridge may use (tls) but never sends: a credential a sink sends is a token (an API key), one line",
			"c.yaml:16: sinks[0].webhook.credentialFiles.d: DIR/user.creds holds NATS credentials, which the bridge may use (credentialsFile) but never sends: a credential a sink sends is a token (an API key), one line",
			"c.yaml:17: sinks[0].webhook.credentialFiles.e: DIR/lines has 2 lines: a credential a sink sends is a token (an API key), one line",
			"c.yaml:18: sinks[0].webhook.credentialFiles.f: DIR/hmac is also sinks[0].webhook.signingSecretFile, which the bridge uses but never sends: a credential a sink sends must be a file of its own",
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("resolve %v: problems\n got %s\nwant %s", resolve, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// A NATS sink sends its tokenFile and passwordFile in CONNECT, as they
// are: to a server the config names. They are held to the same rule as a
// webhook's bearer token: a TLS key or a seed is refused, naming the key.
func TestNATSTokenAndPasswordAreSent(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"tls.key": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA...\n-----END EC PRIVATE KEY-----\n",
		"seed":    "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	doc := strings.ReplaceAll(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: a
    nats: {url: "nats://nats.example.com:4222", tokenFile: DIR/tls.key}
  - name: b
    nats: {url: "nats://nats.example.com:4222", user: u, passwordFile: DIR/seed}
rules:
  - {name: r, resource: v1/configmaps, sinks: [a, b]}
`, "DIR", dir)
	cfg, _, err := config.Parse("c.yaml", []byte(doc), components.SinkRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range config.ConfineCredentials(cfg, []string{dir}, true) {
		got = append(got, p.Path)
	}
	if strings.Join(got, " ") != "sinks[0].nats.tokenFile sinks[1].nats.passwordFile" {
		t.Errorf("refused %v, want the NATS token and password files", got)
	}
}

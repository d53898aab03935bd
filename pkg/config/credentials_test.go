package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

func TestCredentialFilesAreConfined(t *testing.T) {
	cfg, _, err := config.Parse("c.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: hook
    webhook:
      url: https://siem.example.com/
      bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
      signingSecretFile: /etc/kubebridge/hmac
      tls: {caFile: /etc/kubebridge/../../etc/ssl/private/key.pem}
  - name: bus
    nats: {url: "nats://nats:4222", tokenFile: relative/token, tls: {certFile: /etc/kubebridge/nats/tls.crt, keyFile: /etc/kubebridge/nats/tls.key}}
  - name: pd
    webhook:
      url: https://events.pagerduty.com/v2/enqueue
      preset: pagerduty
      credentialFiles:
        routingKey: /var/run/secrets/kubernetes.io/serviceaccount/token
rules:
  - {name: r, resource: v1/configmaps, sinks: [hook, bus, pd]}
`), components.SinkRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cf := range config.CredentialFiles(cfg) {
		got = append(got, cf.Path+"="+cf.File)
	}
	want := "sinks[0].webhook.signingSecretFile=/etc/kubebridge/hmac sinks[0].webhook.bearerTokenFile=/var/run/secrets/kubernetes.io/serviceaccount/token sinks[0].webhook.tls.caFile=/etc/kubebridge/../../etc/ssl/private/key.pem sinks[1].nats.tokenFile=relative/token sinks[1].nats.tls.certFile=/etc/kubebridge/nats/tls.crt sinks[1].nats.tls.keyFile=/etc/kubebridge/nats/tls.key sinks[2].webhook.credentialFiles.routingKey=/var/run/secrets/kubernetes.io/serviceaccount/token"
	if strings.Join(got, " ") != want {
		t.Errorf("credential files\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	var msgs []string
	for _, p := range config.ConfineCredentials(cfg, config.DefaultCredentialDirs, false) {
		msgs = append(msgs, p.Format("c.yaml"))
	}
	wantMsgs := []string{
		"c.yaml:8: sinks[0].webhook.bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token is in the pod's service-account directory (/var/run/secrets): a config may never send the bridge's own credentials",
		"c.yaml:10: sinks[0].webhook.tls.caFile: /etc/kubebridge/../../etc/ssl/private/key.pem (that is /etc/ssl/private/key.pem) is not inside an allowed credential directory (--credential-dirs: /etc/kubebridge)",
		"c.yaml:12: sinks[1].nats.tokenFile: relative/token is not an absolute path (credential files must be inside an allowed directory, --credential-dirs: /etc/kubebridge)",
		"c.yaml:18: sinks[2].webhook.credentialFiles.routingKey: /var/run/secrets/kubernetes.io/serviceaccount/token is in the pod's service-account directory (/var/run/secrets): a config may never send the bridge's own credentials",
	}
	if strings.Join(msgs, "\n") != strings.Join(wantMsgs, "\n") {
		t.Errorf("problems\n got %s\nwant %s", strings.Join(msgs, "\n"), strings.Join(wantMsgs, "\n"))
	}
	// Allowing everything still never allows the service-account directory.
	if p := config.ConfineCredentials(cfg, []string{"/"}, false); len(p) != 3 || !strings.Contains(p[0].Message, "service-account") {
		t.Errorf("with / allowed: %v", p)
	}
}

// A link inside an allowed directory pointing elsewhere is refused once
// links are resolved (bridge run); the kubelet's own links inside a secret
// volume (..data -> ..2026_...) stay inside it and pass.
func TestCredentialLinksAreResolved(t *testing.T) {
	root := t.TempDir()
	allowed, outside := filepath.Join(root, "allowed"), filepath.Join(root, "outside")
	for _, d := range []string{filepath.Join(allowed, "..2026_11_25"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(allowed, "..2026_11_25", "token"), []byte("t"), 0o600))
	must(os.Symlink("..2026_11_25", filepath.Join(allowed, "..data")))
	must(os.Symlink("..data/token", filepath.Join(allowed, "token")))
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(allowed, "sneaky")))
	for file, ok := range map[string]bool{filepath.Join(allowed, "token"): true, filepath.Join(allowed, "sneaky"): false} {
		cfg, _, err := config.Parse("c.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: hook
    webhook: {url: "https://example.com/", bearerTokenFile: `+file+`}
rules:
  - {name: r, resource: v1/configmaps, sinks: [hook]}
`), components.SinkRegistry())
		if err != nil {
			t.Fatal(err)
		}
		if p := config.ConfineCredentials(cfg, []string{allowed}, false); len(p) != 0 {
			t.Errorf("%s lexically: %v", file, p)
		}
		p := config.ConfineCredentials(cfg, []string{allowed}, true)
		if ok != (len(p) == 0) || (!ok && !strings.Contains(p[0].Message, "(a link to "+filepath.Join(outside, "secret")+") is not inside")) {
			t.Errorf("%s resolved: %v", file, p)
		}
	}
}

// A request's for needs the sink's replay, its timer: refused without
// replayEvery, naming the key.
func TestForNeedsReplayEvery(t *testing.T) {
	doc := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: am
    webhook:
      url: http://127.0.0.1:9093/api/v2/alerts
      preset: alertmanager
      request: {for: 5m}
%s
rules:
  - {name: r, resource: v1/pods, sinks: [am]}
`
	_, _, err := config.Parse("c.yaml", []byte(fmt.Sprintf(doc, "")), components.SinkRegistry())
	if err == nil || !strings.Contains(err.Error(), "c.yaml:9: sinks[0].webhook.request.for: waits for a timer, which is the sink's replay: set replayEvery") {
		t.Errorf("without replayEvery: %v", err)
	}
	if _, _, err := config.Parse("c.yaml", []byte(fmt.Sprintf(doc, "    replayEvery: 1m")), components.SinkRegistry()); err != nil {
		t.Errorf("with replayEvery: %v", err)
	}
}

// A replay slower than the wait it ends is a warning: the alert may fire
// that much late.
func TestForLongerReplayWarns(t *testing.T) {
	_, warns, err := config.Parse("c.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: am
    webhook:
      url: https://hooks.example.com/
      preset: generic
      request: {for: 1m}
    replayEvery: 5m
rules:
  - {name: r, resource: v1/pods, sinks: [am]}
`), components.SinkRegistry())
	if err != nil || len(warns) != 1 || warns[0].Path != "sinks[0].webhook.request.for" || !strings.Contains(warns[0].Message, "waits 1m0s, but the sink's replay, which ends the wait, comes every 5m0s") {
		t.Errorf("err %v, warnings %v", err, warns)
	}
}

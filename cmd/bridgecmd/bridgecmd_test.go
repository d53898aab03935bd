package bridgecmd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

type tallyConfig struct {
	Every int `yaml:"every"`
}

// tally is a sink type of a distribution of its own, beside the standard ones.
var tally = sinks.Factory{
	Type:      "tally",
	NewConfig: func() any { return &tallyConfig{Every: 1} },
	Create: func(context.Context, sinks.Settings) (sinks.Sink, error) {
		return nil, errors.New("not in this test")
	},
}

// A distribution's command knows its own sink types and the standard ones
// it was given, and only those.
func TestDistributionKnowsItsSinkTypes(t *testing.T) {
	reg, err := sinks.NewRegistry(append(components.Sinks(), tally)...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "c.yaml", `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - {name: count, tally: {every: 10}}
  - {name: archive, file: {path: "-"}}
rules:
  - {name: cms, resource: v1/configmaps, sinks: [count, archive]}
`)
	var out, errOut bytes.Buffer
	cmd := New(Settings{Sinks: reg})
	cmd.SetArgs([]string{"validate", "--config", cfg})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	if err := cmd.Execute(); err != nil || !strings.HasPrefix(out.String(), cfg+" is valid offline: cluster dev, 2 sinks (count, archive)") {
		t.Errorf("with tally: %v, stdout %q, stderr %q", err, out.String(), errOut.String())
	}

	errOut.Reset()
	if code := run(Settings{Sinks: components.SinkRegistry()}, []string{"validate", "--config", cfg}, &errOut); code != exitInvalid ||
		!strings.Contains(errOut.String(), cfg+`:5: sinks[0].tally: unknown field or sink type`) {
		t.Errorf("standard build: exit %d, stderr %q", code, errOut.String())
	}

	errOut.Reset()
	if code := run(Settings{}, []string{"validate", "--config", cfg}, &errOut); code != exitInvalid ||
		errOut.String() != "bridge: this build has no sink types (bridgecmd.Settings.Sinks is nil)\n" {
		t.Errorf("no sink types: exit %d, stderr %q", code, errOut.String())
	}
}

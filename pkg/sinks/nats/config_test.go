package nats_test

import (
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// maxPending is a JetStream window: validated with jetstream, a warning
// naming its path on a core sink, where it has no effect.
func TestMaxPendingOnlyWithJetStream(t *testing.T) {
	for _, c := range []struct {
		name, nats string
		warnings   []string
		errors     []string
	}{
		{"jetstream", "jetstream: true, maxPending: 1024", nil, nil},
		{"jetstream out of range", "jetstream: true, maxPending: 0", nil,
			[]string{"config.yaml:6: sinks[0].nats.maxPending: must be between 1 and 65536, got 0"}},
		{"core default", "jetstream: false", nil, nil},
		{"core set", "maxPending: 1024", []string{"config.yaml:6: warning: sinks[0].nats.maxPending: has no effect without jetstream: true"}, nil},
		{"core out of range", "maxPending: 0", []string{"config.yaml:6: warning: sinks[0].nats.maxPending: has no effect without jetstream: true"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
sinks:
  - name: bus
    nats: {url: "nats://127.0.0.1:4222", ` + c.nats + `}
rules:
  - name: cms
    resource: v1/configmaps
    sinks: [bus]
`
			_, warnings, err := config.Parse("config.yaml", []byte(doc), components.SinkRegistry())
			var got []string
			for _, w := range warnings {
				got = append(got, w.Format("config.yaml"))
			}
			if strings.Join(got, "\n") != strings.Join(c.warnings, "\n") {
				t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.warnings, "\n"))
			}
			got = nil
			if err != nil {
				cerr, ok := err.(*config.Error)
				if !ok {
					t.Fatalf("error of type %T: %v", err, err)
				}
				for _, p := range cerr.Problems {
					got = append(got, p.Format("config.yaml"))
				}
			}
			if strings.Join(got, "\n") != strings.Join(c.errors, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.errors, "\n"))
			}
		})
	}
}

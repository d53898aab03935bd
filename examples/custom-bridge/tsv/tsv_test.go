package tsv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// file is the far end of a tsv sink: the lines it holds.
type file struct{ path string }

func (f file) Received(t testing.TB) []sinkstest.Received {
	data, err := os.ReadFile(f.path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []sinkstest.Received
	for line := range strings.Lines(string(data)) {
		fields := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(fields) != 5 {
			t.Fatalf("line %q has %d fields, want 5", line, len(fields))
		}
		out = append(out, sinkstest.Received{Subject: fields[3], ID: fields[4]})
	}
	return out
}

// A local file has no outages to simulate and refuses nothing.
func (file) Down(testing.TB)    {}
func (file) Up(testing.TB)      {}
func (file) Restart(testing.TB) {}
func (file) Refuse(testing.TB)  {}

// The sink passes the contract every kubebridge sink passes, driven the
// way the bridge drives it.
func TestContract(t *testing.T) {
	sinkstest.Run(t, sinkstest.Harness{
		Config: config.Sink{Name: "ledger", Type: "tsv"},
		New: func(t testing.TB, cfg config.Sink) (sinks.Sink, sinkstest.Remote) {
			path := filepath.Join(t.TempDir(), "events.tsv")
			cfg.Spec = &Config{Path: path}
			s, err := Factory.Create(t.Context(), sinks.SettingsFor(cfg, nil))
			if err != nil {
				t.Fatal(err)
			}
			return s, file{path}
		},
	})
}

// The loader decodes a tsv block strictly and reports a bad one by path.
func TestConfig(t *testing.T) {
	reg, err := sinks.NewRegistry(Factory)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = config.Parse("c.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: ledger
    tsv: {path: events.tsv}
rules:
  - {name: cms, resource: v1/configmaps, sinks: [ledger]}
`), reg)
	if err == nil || !strings.Contains(err.Error(), `c.yaml:6: sinks[0].tsv.path: must be absolute, got "events.tsv"`) {
		t.Errorf("err = %v", err)
	}
}

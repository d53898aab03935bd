package testenv

import (
	"testing"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/filters"
)

// CompileRules parses doc, a whole BridgeConfig, with the sink types
// given (components.SinkRegistry(), or a test's registry) and compiles
// every rule of it, in order, as the bridge does; an error fails t.
// nsLabels is for rules with a namespaceSelector (nil: none). (pkg/filters'
// own tests cannot use it: testenv imports filters.)
func CompileRules(t testing.TB, doc string, types config.SinkTypes, nsLabels filters.NamespaceLabels) []*filters.Rule {
	t.Helper()
	cfg, _, err := config.Parse("t.yaml", []byte(doc), types)
	if err != nil {
		t.Fatal(err)
	}
	rules := make([]*filters.Rule, len(cfg.Rules))
	for i := range cfg.Rules {
		if rules[i], err = filters.Compile(cfg, i, nsLabels, nil); err != nil {
			t.Fatal(err)
		}
	}
	return rules
}

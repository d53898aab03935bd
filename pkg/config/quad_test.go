package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	. "github.com/kubebridge/kubebridge/pkg/config"
)

// A config with thousands of problems is reported in bounded size: the
// first problems in file order, each message bounded (a wrong sink
// reference names ten sinks, not all), then how many more there are.
// (Before, a 750 KB config with 8,000 sinks and rules produced a 440 MB
// error, quadratic in its size; sinks and rules are now capped too.)
func TestManyProblemsAreReportedBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks:\n")
	const n, sinks = 1000, 100 // the most a config may have
	for i := 0; i < sinks; i++ {
		fmt.Fprintf(&b, "  - {name: s%d, file: {path: /x}}\n", i)
	}
	b.WriteString("rules:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {name: r%d, resource: v1/configmaps, sinks: [nope]}\n", i)
	}
	_, warnings, err := Parse("c.yaml", []byte(b.String()), types)
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("err = %v", err)
	}
	ps := cerr.Problems
	if len(ps) != 200 || cerr.More != n-200 || cerr.Count() != n || !strings.HasSuffix(err.Error(), fmt.Sprintf("\nc.yaml: ... and %d more errors", n-200)) {
		t.Errorf("%d problems, %d more", len(ps), cerr.More)
	}
	if len(warnings) != sinks { // every sink is unused
		t.Errorf("%d warnings", len(warnings))
	}
	if size := len(err.Error()); size > 64<<10 {
		t.Errorf("the error is %d bytes", size)
	}
	if !strings.Contains(err.Error(), `unknown sink "nope" (have: s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, ... (100 in all))`) {
		t.Errorf("sink list not bounded: %.300s", err)
	}
}

// Each rule and namespace is checked against the cluster at every start and
// reload: a config cannot ask for more than 1000 rules, 1000 namespaces per
// rule or 100 sinks.
func TestConfigSizeIsCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: /x}}]\nrules:\n")
	for i := 0; i < 1001; i++ {
		fmt.Fprintf(&b, "  - {name: r%d, resource: v1/configmaps, sinks: [s]}\n", i)
	}
	b.WriteString("  - {name: wide, resource: v1/configmaps, sinks: [s], namespaces: [")
	for i := 0; i < 1001; i++ {
		fmt.Fprintf(&b, "n%d,", i)
	}
	b.WriteString("]}\n")
	_, _, err := Parse("c.yaml", []byte(b.String()), types)
	if err == nil || !strings.Contains(err.Error(), "rules: 1002 rules, more than 1000") || !strings.Contains(err.Error(), "rules[1001].namespaces: 1001 namespaces, more than 1000") {
		t.Errorf("err = %.400v", err)
	}
}

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
// (Before, a 750 KB config produced a 440 MB error, quadratic in its size.)
func TestManyProblemsAreReportedBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks:\n")
	const n = 8000
	for i := 0; i < n; i++ {
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
	if len(warnings) != 201 || warnings[200].Message != fmt.Sprintf("... and %d more warnings", n-200) { // every sink is unused
		t.Errorf("%d warnings, last %q", len(warnings), warnings[len(warnings)-1].Message)
	}
	if size := len(err.Error()); size > 64<<10 {
		t.Errorf("the error is %d bytes", size)
	}
	if !strings.Contains(err.Error(), `unknown sink "nope" (have: s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, ... (8000 in all))`) {
		t.Errorf("sink list not bounded: %.300s", err)
	}
}

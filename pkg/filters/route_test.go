package filters

import (
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// A route that reads namespaceLabels makes the rule track namespaces: any
// change of a namespace's labels may move its objects (not only one that
// changes a selector's verdict); a route over the object alone does not.
func TestRouteReadsNamespaceLabels(t *testing.T) {
	nsLabels := func(string) (labels.Set, bool) { return labels.Set{"team": "a"}, true }
	byNS := compile(t, "    resource: v1/configmaps\n    route: {sink: \"namespaceLabels.team\", default: s}\n", nsLabels)
	byObject := compile(t, "    resource: v1/configmaps\n    route: {sink: \"object.metadata.name\", default: s}\n", nil)
	plain := compile(t, "    resource: v1/configmaps\n", nil)
	a, b := labels.Set{"team": "a"}, labels.Set{"team": "b"}
	for _, tc := range []struct {
		name          string
		r             *Rule
		reads, change bool
	}{{"namespaceLabels", byNS, true, true}, {"object", byObject, false, false}, {"no route", plain, false, false}} {
		if got := tc.r.ReadsNamespaceLabels(); got != tc.reads {
			t.Errorf("%s: ReadsNamespaceLabels() = %v, want %v", tc.name, got, tc.reads)
		}
		if got := tc.r.NamespaceChanged(a, b); got != tc.change {
			t.Errorf("%s: NamespaceChanged(team a -> b) = %v, want %v", tc.name, got, tc.change)
		}
		if tc.r.NamespaceChanged(a, labels.Set{"team": "a"}) {
			t.Errorf("%s: NamespaceChanged with the same labels", tc.name)
		}
	}
	if got, known := byNS.RouteNamespaceLabels(cm("x", "o", "1", nil, nil)); got["team"] != "a" || !known {
		t.Errorf("RouteNamespaceLabels = %v, %v; want the namespace's", got, known)
	}
	if got, known := byObject.RouteNamespaceLabels(cm("x", "o", "1", nil, nil)); got != nil || !known {
		t.Errorf("a route over the object alone reads namespace labels %v, %v", got, known)
	}
	doc := "apiVersion: kubebridge.io/v1alpha1\nkind: BridgeConfig\ncluster: c\nsinks: [{name: s, file: {path: x}}]\nrules:\n  - {name: r, resource: v1/configmaps, sinks: [s], route: {sink: namespaceLabels.team, default: s}}\n"
	cfg, _, err := config.Parse("t.yaml", []byte(doc), components.SinkRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(cfg, 0, nil, nil); err == nil {
		t.Error("a route reading namespaceLabels compiled without a namespace labels source")
	}
}

// The error logged for a default may quote a name the object chose (up to
// an annotation's 256 KiB): it is cut, on a rune boundary.
func TestRouteErrorLogIsBounded(t *testing.T) {
	long := strings.Repeat("é", 1000)
	got := clip(long, maxRouteErrorLog)
	if len(got) > maxRouteErrorLog+len("…") || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("clip: %d bytes, valid UTF-8 %v: %q", len(got), utf8.ValidString(got), got[len(got)-8:])
	}
	if clip("short", maxRouteErrorLog) != "short" {
		t.Error("a short error was cut")
	}
}

package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The bridge takes the GC's soft memory limit from the container's memory
// limit (KUBEBRIDGE_MEMORY_LIMIT, as the chart sets it) times
// --memory-limit-ratio, unless GOMEMLIMIT is set; the start log says which,
// and the runtime really has it (go_gc_gomemlimit_bytes on /metrics).
func TestBridgeMemoryLimit(t *testing.T) {
	t.Parallel()
	cp := testenv.SharedControlPlane(t)
	for _, c := range []struct {
		name, goMemLimit string
		flags            []string
		wantLog          string
		want             float64
	}{
		{"container limit", "", nil,
			`memoryLimit=483183820 memoryLimitFrom="0.9 x KUBEBRIDGE_MEMORY_LIMIT=536870912"`, 483183820},
		{"container limit with a ratio", "", []string{"--memory-limit-ratio=0.5"},
			`memoryLimit=268435456 memoryLimitFrom="0.5 x KUBEBRIDGE_MEMORY_LIMIT=536870912"`, 268435456},
		{"GOMEMLIMIT wins", "300MiB", nil,
			`memoryLimit=314572800 memoryLimitFrom=GOMEMLIMIT`, 314572800},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := startBridge(t, cp, fileConfig(filepath.Join(t.TempDir(), "events.jsonl"), rule("cms", "v1/configmaps", "default")), withFlags(c.flags...),
				withEnv("GOMEMLIMIT="+c.goMemLimit, "KUBEBRIDGE_MEMORY_LIMIT=536870912")) // 512Mi
			if line := startLine(b.log()); !strings.Contains(line, c.wantLog) {
				t.Errorf("start line lacks %q:\n%s", c.wantLog, line)
			}
			_, text := get(t, b.adminURL()+"/metrics")
			if got := metric(t, text, "go_gc_gomemlimit_bytes"); got != c.want {
				t.Errorf("go_gc_gomemlimit_bytes = %v, want %v", got, c.want)
			}
		})
	}
	// Without the variable there is no limit (the runtime's "none" is MaxInt64).
	t.Run("none", func(t *testing.T) {
		b := startBridge(t, cp, fileConfig(filepath.Join(t.TempDir(), "events.jsonl"), rule("cms", "v1/configmaps", "default")),
			withEnv("GOMEMLIMIT=", "KUBEBRIDGE_MEMORY_LIMIT=")) // empty counts as unset
		if line := startLine(b.log()); !strings.Contains(line, "memoryLimit=0 memoryLimitFrom=none") {
			t.Errorf("start line lacks memoryLimit=0 memoryLimitFrom=none:\n%s", line)
		}
		_, text := get(t, b.adminURL()+"/metrics")
		if got := metric(t, text, "go_gc_gomemlimit_bytes"); got != 9.223372036854776e18 {
			t.Errorf("go_gc_gomemlimit_bytes = %v, want MaxInt64 (none)", got)
		}
	})
}

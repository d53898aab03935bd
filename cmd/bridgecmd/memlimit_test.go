package bridgecmd

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

// The container's memory limit becomes the GC's soft limit, scaled by the
// ratio, unless the operator set GOMEMLIMIT; bad input is refused, naming
// the variable or flag. The setter is a fake: the test process's own limit
// is never touched.
func TestMemoryLimitDecision(t *testing.T) {
	const runtimeLimit = 300 << 20 // what the fake runtime reports as already set
	for _, tc := range []struct {
		name    string
		ratio   float64
		env     map[string]string
		want    memLimit
		wantSet int64 // the limit passed to the setter; 0: none
		wantErr string
	}{
		{name: "nothing set", ratio: 0.9, want: memLimit{From: "none"}},
		{name: "empty variable is unset", ratio: 0.9, env: map[string]string{memoryLimitEnv: ""}, want: memLimit{From: "none"}},
		{name: "container limit", ratio: 0.9, env: map[string]string{memoryLimitEnv: "536870912"},
			want: memLimit{Bytes: 483183820, From: "0.9 x KUBEBRIDGE_MEMORY_LIMIT=536870912"}, wantSet: 483183820},
		{name: "ratio 1", ratio: 1, env: map[string]string{memoryLimitEnv: "1000"},
			want: memLimit{Bytes: 1000, From: "1 x KUBEBRIDGE_MEMORY_LIMIT=1000"}, wantSet: 1000},
		{name: "quantity", ratio: 0.5, env: map[string]string{memoryLimitEnv: "1Gi"},
			want: memLimit{Bytes: 1 << 29, From: "0.5 x KUBEBRIDGE_MEMORY_LIMIT=1073741824"}, wantSet: 1 << 29},
		{name: "huge limit saturates", ratio: 1, env: map[string]string{memoryLimitEnv: "100Ei"},
			want: memLimit{Bytes: math.MaxInt64, From: "1 x KUBEBRIDGE_MEMORY_LIMIT=9223372036854775807"}, wantSet: math.MaxInt64},
		{name: "GOMEMLIMIT wins", ratio: 0.9, env: map[string]string{goMemLimitEnv: "300MiB", memoryLimitEnv: "536870912"},
			want: memLimit{Bytes: runtimeLimit, From: "GOMEMLIMIT"}},
		{name: "GOMEMLIMIT=off wins", ratio: 0.9, env: map[string]string{goMemLimitEnv: "off", memoryLimitEnv: "536870912"},
			want: memLimit{Bytes: 0, From: "GOMEMLIMIT"}},
		{name: "not a number", ratio: 0.9, env: map[string]string{memoryLimitEnv: "lots"},
			wantErr: `KUBEBRIDGE_MEMORY_LIMIT="lots": want the container's memory limit, a positive number of bytes`},
		{name: "zero", ratio: 0.9, env: map[string]string{memoryLimitEnv: "0"}, wantErr: `KUBEBRIDGE_MEMORY_LIMIT="0": want`},
		{name: "negative", ratio: 0.9, env: map[string]string{memoryLimitEnv: "-5"}, wantErr: `KUBEBRIDGE_MEMORY_LIMIT="-5": want`},
		{name: "ratio 0", ratio: 0, env: map[string]string{memoryLimitEnv: "1000"}, wantErr: "--memory-limit-ratio=0: want a share of the container's memory limit in (0, 1]"},
		{name: "ratio above 1", ratio: 1.5, wantErr: "--memory-limit-ratio=1.5: want"},
		{name: "ratio NaN", ratio: math.NaN(), wantErr: "--memory-limit-ratio=NaN: want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			var set int64
			setter := func(n int64) int64 {
				if n < 0 {
					if tc.env[goMemLimitEnv] == "off" {
						return math.MaxInt64
					}
					return runtimeLimit
				}
				set = n
				return runtimeLimit
			}
			got, err := memoryLimit(tc.ratio, lookup, setter)
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q...", err, tc.wantErr)
				}
				if set != 0 {
					t.Errorf("a limit of %d was set despite the error", set)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if set != tc.wantSet {
				t.Errorf("limit set = %d, want %d", set, tc.wantSet)
			}
		})
	}
}

// applyMemoryLimit sets the process's limit from the run command's flag and
// the environment (the test's limit is restored afterwards; the one set is
// large enough not to change how this process collects).
func TestApplyMemoryLimitSetsTheRuntimeLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	t.Setenv(goMemLimitEnv, "")
	t.Setenv(memoryLimitEnv, "68719476736") // 64 GiB
	cmd := newRunCommand(nil)               // flags only
	if err := cmd.ParseFlags([]string{"--memory-limit-ratio=0.5"}); err != nil {
		t.Fatal(err)
	}
	got, err := applyMemoryLimit(cmd.Flags())
	if err != nil {
		t.Fatal(err)
	}
	want := memLimit{Bytes: 32 << 30, From: "0.5 x KUBEBRIDGE_MEMORY_LIMIT=68719476736"}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if cur := debug.SetMemoryLimit(-1); cur != 32<<30 {
		t.Errorf("the runtime's limit is %d, want %d", cur, int64(32<<30))
	}
}

// `bridge run` refuses a bad ratio or variable with exit 2 and a message
// naming it, before it reads the config or reaches the cluster.
func TestRunRefusesABadMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--memory-limit-ratio=2"}, "", "bridge: --memory-limit-ratio=2: want a share of the container's memory limit in (0, 1]\n"},
		{[]string{"--memory-limit-ratio=-0.1"}, "536870912", "bridge: --memory-limit-ratio=-0.1: want"},
		{[]string{"--memory-limit-ratio=x"}, "", `invalid argument "x" for "--memory-limit-ratio" flag`},
		{nil, "512 megs", `bridge: KUBEBRIDGE_MEMORY_LIMIT="512 megs": want the container's memory limit, a positive number of bytes`},
	} {
		args := append([]string{"run", "--config", "/nonexistent/kubebridge.yaml"}, tc.args...)
		r := runBridgeEnv(t, []string{goMemLimitEnv + "=", memoryLimitEnv + "=" + tc.env}, args...)
		if r.code != exitInvalid || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v %s=%q: exit %d, stderr %q; want exit 2 and %q", tc.args, memoryLimitEnv, tc.env, r.code, r.stderr, tc.want)
		}
	}
}

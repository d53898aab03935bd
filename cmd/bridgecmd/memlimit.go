package bridgecmd

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitRatioFlag is the share of the container's memory limit given
// to the Go runtime as its soft memory limit.
const memoryLimitRatioFlag = "memory-limit-ratio"

// memoryLimitEnv carries the container's memory limit in bytes; the Helm
// chart sets it from the downward API (resourceFieldRef limits.memory),
// only when the container has a memory limit (without one the downward API
// reports the node's allocatable memory).
const memoryLimitEnv = "KUBEBRIDGE_MEMORY_LIMIT"

// goMemLimitEnv is the Go runtime's own setting, applied before main runs.
const goMemLimitEnv = "GOMEMLIMIT"

// defaultMemoryLimitRatio leaves 10% of the container's limit to memory the
// Go runtime does not count in its limit but the container's cgroup does:
// the mapped pages of the binary; the checkpoint's bbolt mmap
// (internal/checkpoint/bolt.go opens it without InitialMmapSize, so the mapping
// follows the file's size) and the page cache of its writes; exec plugins'
// processes; and the runtime's own overshoot (the limit is soft: the heap
// can pass it between two collections, and the GC gives up at 50% of the CPU
// rather than thrash).
const defaultMemoryLimitRatio = 0.9

// addMemoryLimitFlag registers --memory-limit-ratio on a command that
// watches the cluster.
func addMemoryLimitFlag(f *pflag.FlagSet) {
	f.Float64(memoryLimitRatioFlag, defaultMemoryLimitRatio, "with "+memoryLimitEnv+" (the container's memory limit in bytes, set by the Helm chart) in the environment, the Go GC's soft memory limit is this share of it: the GC works harder as the heap nears it instead of letting it grow to twice the live heap; the rest is for memory outside the Go heap (the binary, the checkpoint's mmap, exec plugins). "+goMemLimitEnv+", when set, wins")
}

// memLimit is the Go runtime's soft memory limit at start and what set it,
// for the start log.
type memLimit struct {
	Bytes int64  // 0: none
	From  string // "none", "GOMEMLIMIT", or "<ratio> x KUBEBRIDGE_MEMORY_LIMIT=<bytes>"
}

// applyMemoryLimit sets the Go runtime's soft memory limit, process-wide,
// from --memory-limit-ratio and the environment (see memoryLimit). A command
// without the flag uses the default ratio.
func applyMemoryLimit(f *pflag.FlagSet) (memLimit, error) {
	ratio := defaultMemoryLimitRatio
	if f.Lookup(memoryLimitRatioFlag) != nil {
		r, err := f.GetFloat64(memoryLimitRatioFlag)
		if err != nil {
			return memLimit{}, fmt.Errorf("--%s: %w", memoryLimitRatioFlag, err)
		}
		ratio = r
	}
	return memoryLimit(ratio, os.LookupEnv, debug.SetMemoryLimit)
}

// memoryLimit decides the soft memory limit and applies it with set (whose
// argument -1 reads the current limit, as debug.SetMemoryLimit's does). An
// operator's GOMEMLIMIT always wins: the runtime has already applied it, and
// it is left alone. Otherwise a KUBEBRIDGE_MEMORY_LIMIT of N bytes sets the
// limit to ratio x N. Neither: no limit, the GC is paced by GOGC alone. An
// empty variable counts as unset, as the runtime treats GOMEMLIMIT.
func memoryLimit(ratio float64, lookupEnv func(string) (string, bool), set func(int64) int64) (memLimit, error) {
	if !(ratio > 0 && ratio <= 1) { // also refuses NaN
		return memLimit{}, fmt.Errorf("--%s=%v: want a share of the container's memory limit in (0, 1]", memoryLimitRatioFlag, ratio)
	}
	if v, ok := lookupEnv(goMemLimitEnv); ok && v != "" {
		cur := set(-1)
		if cur == math.MaxInt64 { // GOMEMLIMIT=off
			return memLimit{Bytes: 0, From: goMemLimitEnv}, nil
		}
		return memLimit{Bytes: cur, From: goMemLimitEnv}, nil
	}
	v, ok := lookupEnv(memoryLimitEnv)
	if !ok || v == "" {
		return memLimit{From: "none"}, nil
	}
	// The downward API gives plain bytes (divisor 1); a quantity such as
	// 512Mi, as an operator might write it by hand, is accepted too.
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return memLimit{}, fmt.Errorf("%s=%q: want the container's memory limit, a positive number of bytes (as the downward API's limits.memory gives it) or a quantity such as 512Mi", memoryLimitEnv, v)
	}
	limit := q.Value() // rounds up; saturates at MaxInt64
	soft := float64(limit) * ratio
	n := int64(math.MaxInt64)
	if soft < math.MaxInt64 { // float64(MaxInt64) is 2^63: converting it back would overflow
		n = max(int64(soft), 1)
	}
	set(n)
	return memLimit{Bytes: n, From: fmt.Sprintf("%v x %s=%d", ratio, memoryLimitEnv, limit)}, nil
}

package filters

import (
	"fmt"

	"github.com/google/cel-go/common/types"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// CompileMatcher compiles a where expression over an event (a sink's mute
// where): it sees what a rule's where sees, the event's object, its old
// object and the change. An evaluation that fails or yields no bool is
// false.
func CompileMatcher(expr string) (func(*event.Event) bool, error) {
	ast, errs := celsandbox.CompileWhere(expr)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%v", errs[0])
	}
	env, err := celsandbox.CELEnv()
	if err != nil {
		return nil, err
	}
	prg, err := env.Program(ast, celsandbox.CELProgramOptions()...)
	if err != nil {
		return nil, err
	}
	return func(e *event.Event) bool {
		vars := eventVars(e)
		out, _, err := prg.Eval(vars)
		b, ok := out.(types.Bool)
		return err == nil && ok && bool(b)
	}, nil
}

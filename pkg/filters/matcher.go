package filters

import (
	"fmt"

	"github.com/google/cel-go/common/types"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// CompileMatcher compiles a where expression over an event (a sink's mute
// where): it sees what a rule's where sees, the event's object, its old
// object and the change. An evaluation that fails or yields no bool is an
// error, for the caller to decide what it means (a mute holds the event).
func CompileMatcher(expr string) (func(*event.Event) (bool, error), error) {
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
	return func(e *event.Event) (bool, error) {
		out, _, err := prg.Eval(eventVars(e))
		if err != nil {
			return false, err
		}
		b, ok := out.(types.Bool)
		if !ok {
			return false, fmt.Errorf("got %s, not a bool", out.Type().TypeName())
		}
		return bool(b), nil
	}, nil
}

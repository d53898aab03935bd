package config

import (
	"fmt"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
)

// The variables a rule's where expression sees.
const (
	CELObject    = "object"    // the object (for deleted: its last known state)
	CELOldObject = "oldObject" // the previous state on updates, null otherwise
	CELType      = "type"      // "added", "updated" or "deleted"
)

var (
	celEnvOnce sync.Once
	celEnv     *cel.Env
	celEnvErr  error
)

// CELEnv is the environment where expressions are compiled: the variables
// above plus the string, list, set and math extensions and optional types, a
// subset of what Kubernetes' own CEL (ValidatingAdmissionPolicy) offers.
// It is shared: config validation and the filter stage compile alike.
func CELEnv() (*cel.Env, error) {
	celEnvOnce.Do(func() {
		celEnv, celEnvErr = cel.NewEnv(
			cel.Variable(CELObject, cel.DynType),
			cel.Variable(CELOldObject, cel.DynType),
			cel.Variable(CELType, cel.StringType),
			cel.OptionalTypes(),
			ext.Strings(),
			ext.Lists(),
			ext.Sets(),
			ext.Math(),
			ext.Encoders(),
		)
	})
	return celEnv, celEnvErr
}

// CompileWhere compiles a rule's where expression, which must yield a bool.
// Each compile issue is one error, e.g. "undeclared reference to 'objekt' (column 1)".
func CompileWhere(expr string) (*cel.Ast, []error) {
	env, err := CELEnv()
	if err != nil {
		return nil, []error{fmt.Errorf("CEL environment: %w", err)}
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		var errs []error
		for _, e := range iss.Errors() {
			msg := strings.TrimSuffix(e.Message, " (in container '')")
			if loc := e.Location; loc != nil && loc.Line() > 0 {
				if strings.Contains(expr, "\n") {
					msg += fmt.Sprintf(" (line %d, column %d)", loc.Line(), loc.Column()+1)
				} else {
					msg += fmt.Sprintf(" (column %d)", loc.Column()+1)
				}
			}
			errs = append(errs, fmt.Errorf("%s", msg))
		}
		return nil, errs
	}
	if t := ast.OutputType(); !t.IsAssignableType(cel.BoolType) && t != cel.DynType {
		return nil, []error{fmt.Errorf("must evaluate to a bool, not %s", t)}
	}
	return ast, nil
}

package celsandbox

import (
	"fmt"
	"sync"

	"github.com/google/cel-go/cel"
)

// CELNamespaceLabels is the variable a rule's route sees besides object:
// the labels of the object's namespace (empty for a cluster-scoped object
// or a namespace not known). `namespace` itself is a reserved word in CEL.
const CELNamespaceLabels = "namespaceLabels"

var (
	celRouteEnv     *cel.Env
	celRouteEnvErr  error
	celRouteEnvOnce sync.Once
)

// CELRouteEnv is where's environment with namespaceLabels: a route is
// checked against the same declarations as where.
func CELRouteEnv() (*cel.Env, error) {
	celRouteEnvOnce.Do(func() {
		env, err := CELEnv()
		if err != nil {
			celRouteEnvErr = err
			return
		}
		celRouteEnv, celRouteEnvErr = env.Extend(
			cel.Variable(CELNamespaceLabels, cel.MapType(cel.StringType, cel.StringType)),
		)
	})
	return celRouteEnv, celRouteEnvErr
}

// CompileRoute compiles a rule's route expression, which must yield a
// string (dyn passes: it is checked when evaluated). It may not read
// oldObject or type: a route is part of the rule's view, which the
// object's current state decides, not a transition.
func CompileRoute(expr string) (*cel.Ast, []error) {
	ast, errs := compileTyped(CELRouteEnv, expr, cel.StringType, "a string expression (a sink's name)")
	if errs != nil {
		return nil, errs
	}
	for _, v := range []string{CELOldObject, CELType} {
		if References(ast, v) {
			return nil, []error{fmt.Errorf("reads %s: a route is part of the rule's view, decided by the object's current state alone", v)}
		}
	}
	return ast, nil
}

// References reports whether a checked expression reads variable name.
func References(ast *cel.Ast, name string) bool {
	for _, ref := range ast.NativeRep().ReferenceMap() {
		if ref.Name == name {
			return true
		}
	}
	return false
}

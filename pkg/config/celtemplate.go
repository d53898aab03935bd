package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// The variables a template (a request shaped by CEL) sees besides those of
// where: the event's attributes and, for updates, the JSON patch.
const (
	CELEvent = "event" // id, type, subject, rule, cluster, change, reason, replay, time
	CELPatch = "patch" // list of {op, path, value}; empty unless the event is an update with a patch
)

var (
	celTemplateEnv     *cel.Env
	celTemplateEnvErr  error
	celTemplateEnvOnce sync.Once
)

// CELTemplateEnv is where's environment with event and patch: templates
// are checked against the same declarations as where, so a typo is a load
// error with its key path.
func CELTemplateEnv() (*cel.Env, error) {
	celTemplateEnvOnce.Do(func() {
		env, err := CELEnv()
		if err != nil {
			celTemplateEnvErr = err
			return
		}
		celTemplateEnv, celTemplateEnvErr = env.Extend(
			cel.Variable(CELEvent, cel.MapType(cel.StringType, cel.StringType)),
			cel.Variable(CELPatch, cel.ListType(cel.DynType)),
		)
	})
	return celTemplateEnv, celTemplateEnvErr
}

// Template is a compiled template expression.
type Template struct {
	prg  cel.Program
	want string // "string" or "json"
}

// CompileStringTemplate compiles an expression that yields a string (a
// header, a path, a query value).
func CompileStringTemplate(expr string) (*Template, []error) {
	return compileTemplate(expr, "string")
}

// CompileJSONTemplate compiles an expression that yields a JSON value
// (map, list, string, number, bool, null): a request body.
func CompileJSONTemplate(expr string) (*Template, []error) {
	return compileTemplate(expr, "json")
}

func compileTemplate(expr, want string) (*Template, []error) {
	env, err := CELTemplateEnv()
	if err != nil {
		return nil, []error{fmt.Errorf("CEL environment: %w", err)}
	}
	ast, errs := compileCEL(env, expr)
	if errs != nil {
		return nil, errs
	}
	t := ast.OutputType()
	switch {
	case want == "string" && !t.IsAssignableType(cel.StringType):
		return nil, []error{fmt.Errorf("must be a string expression, got %s", t)}
	case want == "json" && !jsonType(t):
		return nil, []error{fmt.Errorf("must be a JSON value (map, list, string, number, bool or null), got %s", t)}
	}
	prg, err := env.Program(ast, CELProgramOptions()...)
	if err != nil {
		return nil, []error{err}
	}
	return &Template{prg: prg, want: want}, nil
}

// jsonType says whether values of t can be JSON (dyn may be).
func jsonType(t *cel.Type) bool {
	switch t.Kind() {
	case types.DynKind, types.MapKind, types.ListKind, types.StringKind, types.IntKind, types.UintKind,
		types.DoubleKind, types.BoolKind, types.NullTypeKind:
		return true
	}
	return false
}

// TemplateVars are the values a template is evaluated with.
type TemplateVars struct {
	Object, OldObject map[string]any
	Type              string
	Event             map[string]string
	Patch             []any
}

// templateActivation resolves TemplateVars, with the evaluation's
// allocation budget.
type templateActivation struct {
	v      *TemplateVars
	budget CELBudget
}

func (a *templateActivation) ResolveName(name string) (any, bool) {
	switch name {
	case CELObject:
		if a.v.Object == nil {
			return nil, true
		}
		return a.v.Object, true
	case CELOldObject:
		if a.v.OldObject == nil {
			return nil, true
		}
		return a.v.OldObject, true
	case CELType:
		return a.v.Type, true
	case CELEvent:
		return a.v.Event, true
	case CELPatch:
		if a.v.Patch == nil {
			return []any{}, true
		}
		return a.v.Patch, true
	case CELBudgetVar:
		return &a.budget, true
	}
	return nil, false
}

func (a *templateActivation) Parent() interpreter.Activation { return nil }

// ErrTemplateTooLarge is returned for a result over MaxCELStringBytes.
var ErrTemplateTooLarge = errors.New("the result is larger than 1 MiB")

// String evaluates a string template.
func (t *Template) String(v *TemplateVars) (string, error) {
	out, err := t.eval(v)
	if err != nil {
		return "", err
	}
	s, ok := out.(types.String)
	if !ok {
		return "", fmt.Errorf("evaluated to %s, not a string", out.Type())
	}
	if len(s) > MaxCELStringBytes {
		return "", ErrTemplateTooLarge
	}
	return string(s), nil
}

var jsonValueType = reflect.TypeOf(&structpb.Value{})

// JSON evaluates a JSON template and encodes its value: JSON by
// construction (through protobuf's JSON value, no string building), so
// nothing an object holds can break out of a string.
func (t *Template) JSON(v *TemplateVars) ([]byte, error) {
	out, err := t.eval(v)
	if err != nil {
		return nil, err
	}
	// Sized before it is copied: a list of references to one large value
	// is small until it is encoded.
	if valueSize(out, 0) > MaxCELStringBytes {
		return nil, ErrTemplateTooLarge
	}
	native, err := out.ConvertToNative(jsonValueType)
	if err != nil {
		return nil, fmt.Errorf("not a JSON value: %w", err)
	}
	b, err := protojson.Marshal(native.(*structpb.Value))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxCELStringBytes {
		return nil, ErrTemplateTooLarge
	}
	// protojson's output is not stable in white space: compact it, so that
	// a body (and its signature) is the same for the same value.
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil {
		return nil, err
	}
	return c.Bytes(), nil
}

func (t *Template) eval(v *TemplateVars) (ref.Val, error) {
	out, _, err := t.prg.Eval(&templateActivation{v: v})
	if err != nil {
		return nil, err
	}
	return out, nil
}

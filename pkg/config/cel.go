package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
)

// The variables a rule's where expression sees.
const (
	CELObject    = "object"    // the object (for deleted: its last known state)
	CELOldObject = "oldObject" // the previous state on updates, null otherwise
	CELType      = "type"      // "added", "updated" or "deleted"
)

// The declared types of object and oldObject and of their metadata. The
// names show in messages, e.g. "must be a boolean expression, got
// kubebridge.ObjectMeta".
const (
	objectTypeName         = "kubebridge.Object"
	objectMetaTypeName     = "kubebridge.ObjectMeta"
	ownerReferenceTypeName = "kubebridge.OwnerReference"
)

// celStruct declares the fields of a struct type. An open struct has every
// other field too, as dyn: the body of an object (spec, status, data, rules
// ...) depends on its resource, which a rule's where is not checked against.
type celStruct struct {
	fields map[string]*types.Type
	open   bool
}

// celStructs types an object as it reaches a where expression: the
// unstructured form, i.e. JSON. So metadata is Kubernetes' ObjectMeta as
// in JSON: timestamps are RFC 3339 strings, int64s are ints, and a field
// absent in JSON (omitempty) is absent here (has() is false, reading it is
// an evaluation error), as it was when object was dyn. The fields of
// ObjectMeta and OwnerReference are all listed (see TestMetadataTypes), so
// a misspelled one is an "undefined field" error at load.
var celStructs = map[string]celStruct{
	objectTypeName: {open: true, fields: map[string]*types.Type{
		"apiVersion": types.StringType,
		"kind":       types.StringType,
		"metadata":   types.NewObjectType(objectMetaTypeName),
	}},
	objectMetaTypeName: {fields: map[string]*types.Type{
		"name":                       types.StringType,
		"generateName":               types.StringType,
		"namespace":                  types.StringType,
		"selfLink":                   types.StringType,
		"uid":                        types.StringType,
		"resourceVersion":            types.StringType,
		"generation":                 types.IntType,
		"creationTimestamp":          types.StringType,
		"deletionTimestamp":          types.StringType,
		"deletionGracePeriodSeconds": types.IntType,
		"labels":                     types.NewMapType(types.StringType, types.StringType),
		"annotations":                types.NewMapType(types.StringType, types.StringType),
		"ownerReferences":            types.NewListType(types.NewObjectType(ownerReferenceTypeName)),
		"finalizers":                 types.NewListType(types.StringType),
		"managedFields":              types.DynType,
	}},
	ownerReferenceTypeName: {fields: map[string]*types.Type{
		"apiVersion":         types.StringType,
		"kind":               types.StringType,
		"name":               types.StringType,
		"uid":                types.StringType,
		"controller":         types.BoolType,
		"blockOwnerDeletion": types.BoolType,
	}},
}

// objectTypes is the type provider that declares celStructs on top of
// CEL's own registry (which OptionalTypes and the like register into).
//
// It declares types for the checker only: field types carry no IsSet or
// GetFrom, so the interpreter selects their fields as map keys, exactly
// as it does for dyn. The values bound to object and oldObject thus stay
// the unstructured map[string]any (or nil), with no conversion.
type objectTypes struct{ *types.Registry }

func (p objectTypes) FindStructType(name string) (*types.Type, bool) {
	if _, ok := celStructs[name]; ok {
		return types.NewTypeTypeWithParam(types.NewObjectType(name)), true
	}
	return p.Registry.FindStructType(name)
}

func (p objectTypes) FindStructFieldNames(name string) ([]string, bool) {
	s, ok := celStructs[name]
	if !ok {
		return p.Registry.FindStructFieldNames(name)
	}
	return slices.Sorted(maps.Keys(s.fields)), true
}

func (p objectTypes) FindStructFieldType(name, field string) (*types.FieldType, bool) {
	s, ok := celStructs[name]
	if !ok {
		return p.Registry.FindStructFieldType(name, field)
	}
	t, ok := s.fields[field]
	if !ok {
		if !s.open {
			return nil, false
		}
		t = types.DynType
	}
	return &types.FieldType{Type: t}, true
}

// NewValue refuses to build our types (e.g. "kubebridge.ObjectMeta{name:
// 'a'}"): they only describe the objects kubebridge binds.
func (p objectTypes) NewValue(name string, fields map[string]ref.Val) ref.Val {
	if _, ok := celStructs[name]; ok {
		return types.NewErr("values of type %s cannot be constructed", name)
	}
	return p.Registry.NewValue(name, fields)
}

var (
	celEnvOnce sync.Once
	celEnv     *cel.Env
	celEnvErr  error
)

// CELEnv is the environment where expressions are compiled: the variables
// above plus the string, list, set and math extensions and optional types, a
// subset of what Kubernetes' own CEL (ValidatingAdmissionPolicy) offers.
// object and oldObject are kubebridge.Object: metadata is typed, so
// mistakes there are caught at load, and the rest is dyn. Being a struct,
// object itself is not a map (no object['spec'], size(object)); dyn(object)
// is one.
// It is shared: config validation and the filter stage compile alike.
func CELEnv() (*cel.Env, error) {
	celEnvOnce.Do(func() {
		reg, err := types.NewRegistry()
		if err != nil {
			celEnvErr = err
			return
		}
		p := objectTypes{reg}
		celEnv, celEnvErr = cel.NewEnv(
			cel.CustomTypeAdapter(p),
			cel.CustomTypeProvider(p),
			cel.Variable(CELObject, cel.ObjectType(objectTypeName)),
			cel.Variable(CELOldObject, cel.ObjectType(objectTypeName)),
			cel.Variable(CELType, cel.StringType),
			cel.OptionalTypes(),
			// Typed ints compare with doubles (generation > 2.5), as dyn
			// values do when evaluated and as in Kubernetes' CEL.
			cel.CrossTypeNumericComparisons(true),
			ext.Strings(),
			// lists.range allocates its list in one call: bounded here,
			// since the cost check only sees it after.
			ext.Lists(ext.ListsMaxRangeSize(MaxCELListSize)),
			ext.Sets(),
			ext.Math(),
			ext.Encoders(),
		)
	})
	return celEnv, celEnvErr
}

// CompileWhere compiles a rule's where expression, which must yield a bool.
// Each compile issue is one error, e.g. "undeclared reference to 'objekt'
// (column 1)"; an expression whose type is known and not bool gives
// "must be a boolean expression, got string" (dyn passes: it is checked
// when evaluated).
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
	// Assignable from bool: bool, dyn and the like, whose value is only
	// known when evaluated.
	if t := ast.OutputType(); !t.IsAssignableType(cel.BoolType) {
		return nil, []error{fmt.Errorf("must be a boolean expression, got %s", t)}
	}
	// Literal arguments are evaluated when the program is planned, before
	// any cost check: a replace of literals that would build a string over
	// the bound is refused now (others are bounded when evaluated).
	var tooBig error
	celast.PreOrderVisit(ast.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() != celast.CallKind || e.AsCall().FunctionName() != "replace" || tooBig != nil {
			return
		}
		c := e.AsCall()
		if !c.IsMemberFunction() || len(c.Args()) < 2 {
			return
		}
		lits := []celast.Expr{c.Target(), c.Args()[0], c.Args()[1]}
		var v [3]string
		for i, l := range lits {
			s, ok := literalString(l)
			if !ok {
				return
			}
			v[i] = s
		}
		if size := replaceSize(v[0], v[1], v[2], -1); size > MaxCELStringBytes {
			tooBig = fmt.Errorf("replace builds a string of %d bytes, more than %d", size, MaxCELStringBytes)
		}
	}))
	if tooBig != nil {
		return nil, []error{tooBig}
	}
	return ast, nil
}

// Bounds of one evaluation of a where expression.
const (
	// CELCostLimit is the cost limit of one evaluation (the order of
	// Kubernetes' per-expression limit).
	CELCostLimit = 1_000_000
	// MaxCELStringBytes bounds the string replace may build, and
	// MaxCELListSize the list lists.range may: both allocate in one call,
	// before the cost check can stop them.
	MaxCELStringBytes = 1 << 20
	MaxCELListSize    = 100_000
)

// CELProgramOptions are the options every where program is built with:
// the cost limit and the allocation bounds.
func CELProgramOptions() []cel.ProgramOption {
	return []cel.ProgramOption{
		cel.CostLimit(CELCostLimit),
		cel.CustomDecoratorV2(boundAllocations),
		cel.EvalOptions(cel.OptOptimize),
	}
}

// boundAllocations guards calls that allocate in proportion to their
// arguments before the cost tracker sees their result: replace, whose
// result can be its input times its replacement.
func boundAllocations(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	if call, ok := i.(interpreter.InterpretableCall); ok && call.Function() == "replace" && len(call.Args()) >= 3 {
		return boundedReplace{call}, nil
	}
	return i, nil
}

// boundedReplace evaluates replace's arguments first and refuses a result
// over MaxCELStringBytes (an evaluation error: the where is false and
// counted), instead of building it.
type boundedReplace struct{ interpreter.InterpretableCall }

func (b boundedReplace) Eval(a interpreter.Activation) ref.Val {
	if err := b.check(func(x interpreter.InterpretableV2) ref.Val { return x.Eval(a) }); err != nil {
		return err
	}
	return b.InterpretableCall.Eval(a)
}

func (b boundedReplace) Exec(f *interpreter.ExecutionFrame) ref.Val {
	if err := b.check(func(x interpreter.InterpretableV2) ref.Val { return x.Exec(f) }); err != nil {
		return err
	}
	return b.InterpretableCall.Exec(f)
}

func (b boundedReplace) check(eval func(interpreter.InterpretableV2) ref.Val) ref.Val {
	args := b.Args()
	s, ok1 := eval(args[0]).(types.String)
	old, ok2 := eval(args[1]).(types.String)
	repl, ok3 := eval(args[2]).(types.String)
	if !ok1 || !ok2 || !ok3 {
		return nil // the call itself reports what is wrong
	}
	limit := int64(-1)
	if len(args) == 4 {
		if l, ok := eval(args[3]).(types.Int); ok {
			limit = int64(l)
		}
	}
	if size := replaceSize(string(s), string(old), string(repl), limit); size > MaxCELStringBytes {
		return types.NewErr("replace would build a string of %d bytes, more than %d", size, MaxCELStringBytes)
	}
	return nil
}

// replaceSize is the length of s.replace(old, repl, limit) (limit < 0:
// every occurrence), computed without building it.
func replaceSize(s, old, repl string, limit int64) int64 {
	n := int64(strings.Count(s, old)) // "" matches at every rune and at the end
	if limit >= 0 && n > limit {
		n = limit
	}
	return int64(len(s)) + n*(int64(len(repl))-int64(len(old)))
}

// literalString returns the value of a string literal.
func literalString(e celast.Expr) (string, bool) {
	if e.Kind() != celast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}

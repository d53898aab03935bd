package celsandbox

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
)

// The variables a rule's where expression sees.
const (
	CELObject    = "object"    // the object (for deleted: its last known state)
	CELOldObject = "oldObject" // the previous state on updates, null otherwise
	CELType      = "type"      // "added", "updated" or "deleted"
	// CELOwners is the object's owner chain, nearest first (the top
	// controller last): a list of {apiVersion, kind, name, uid, labels};
	// empty unless the rule includes owners.
	CELOwners = "owners"
	// CELInvolved is, for a Kubernetes Event of a rule that includes
	// owners, the object it is about: {apiVersion, kind, namespace, name,
	// uid, labels, owners}; null otherwise.
	CELInvolved = "involved"
)

// The declared types of object and oldObject and of their metadata. The
// names show in messages, e.g. "must be a boolean expression, got
// kubebridge.ObjectMeta".
const (
	objectTypeName         = "kubebridge.Object"
	objectMetaTypeName     = "kubebridge.ObjectMeta"
	ownerReferenceTypeName = "kubebridge.OwnerReference"
	ownerTypeName          = "kubebridge.Owner"
	involvedTypeName       = "kubebridge.Involved"
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
	ownerTypeName: {fields: map[string]*types.Type{
		"apiVersion": types.StringType,
		"kind":       types.StringType,
		"name":       types.StringType,
		"uid":        types.StringType,
		"labels":     types.NewMapType(types.StringType, types.StringType),
	}},
	involvedTypeName: {fields: map[string]*types.Type{
		"apiVersion": types.StringType,
		"kind":       types.StringType,
		"namespace":  types.StringType,
		"name":       types.StringType,
		"uid":        types.StringType,
		"labels":     types.NewMapType(types.StringType, types.StringType),
		"owners":     types.NewListType(types.NewObjectType(ownerTypeName)),
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
			cel.Variable(CELOwners, cel.ListType(cel.ObjectType(ownerTypeName))),
			cel.Variable(CELInvolved, cel.ObjectType(involvedTypeName)),
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
	return compileTyped(CELEnv, expr, cel.BoolType, "a boolean expression")
}

// CompileKey compiles a sink's updateWindow key, which must yield a string
// (dyn passes: it is checked when evaluated).
func CompileKey(expr string) (*cel.Ast, []error) {
	return compileTyped(CELEnv, expr, cel.StringType, "a string expression")
}

// compileTyped compiles expr in the environment env returns, refusing an
// output type that cannot be want (assignable: dyn and the like pass,
// their value is only known when evaluated).
func compileTyped(env func() (*cel.Env, error), expr string, want *cel.Type, what string) (*cel.Ast, []error) {
	e, err := env()
	if err != nil {
		return nil, []error{fmt.Errorf("CEL environment: %w", err)}
	}
	ast, errs := compileCEL(e, expr)
	if errs != nil {
		return nil, errs
	}
	if t := ast.OutputType(); !t.IsAssignableType(want) {
		return nil, []error{fmt.Errorf("must be %s, got %s", what, t)}
	}
	return ast, nil
}

// compileCEL compiles expr in env: each issue is one error with its
// column (and line, for a multi-line expression); a replace of literals
// over the bound is refused, since literal arguments are evaluated when
// the program is planned, before any cost check (others are bounded when
// evaluated).
func compileCEL(env *cel.Env, expr string) (*cel.Ast, []error) {
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
	MaxCELListSize    = 10_000
	// MaxCELSortSize bounds the lists sort and distinct take.
	MaxCELSortSize = 10_000
	// MaxCELAllocBytes bounds what the guarded calls of one evaluation
	// allocate together (see CELBudget).
	MaxCELAllocBytes = 16 << 20
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

// A guard checks a guarded call's arguments before the call runs: err is
// set when the result would pass a bound, and alloc is about what the call
// allocates, charged to the evaluation's budget (see CELBudget).
type guard func(args []ref.Val) (alloc int64, err ref.Val)

// guardedFunctions are the calls that build their result (or sort) in one
// step, before the cost tracker sees it, or whose cost the tracker does not
// know when their arguments are dyn (object fields are: dyn(s) + dyn(s)
// costs 1 whatever the strings' sizes, which is how 3,000 concatenations of
// a 1 MiB string once cost 72,014): each gets a check of its arguments'
// sizes first, and what it allocates is charged to the evaluation.
var guardedFunctions = map[string]guard{
	"replace":       checkReplace,
	"join":          checkJoin,
	"format":        checkFormat,
	"sort":          checkSortable,
	"distinct":      checkSortable,
	"_+_":           checkAdd,
	"reverse":       checkReverse,
	"strings.quote": scaled("strings.quote", 6, true), // \uXXXX escapes
	"base64.encode": scaled("base64.encode", 2, true), // 4/3, rounded up
	"base64.decode": scaled("base64.decode", 1, false),
	"json.encode":   scaled("json.encode", 2, true),
	"flatten":       scaled("flatten", 1, false),
	"slice":         scaled("slice", 1, false),
	"split":         scaled("split", 2, false),
	"lowerAscii":    scaled("lowerAscii", 1, false),
	"upperAscii":    scaled("upperAscii", 1, false),
	"trim":          scaled("trim", 1, false),
	// These convert their string to runes, 4 bytes each, per call.
	"charAt":      scaled("charAt", 4, false),
	"indexOf":     scaled("indexOf", 4, false),
	"lastIndexOf": scaled("lastIndexOf", 4, false),
	"substring":   scaled("substring", 4, false),
	"string":      scaled("string", 1, false),
	"bytes":       scaled("bytes", 1, false),
}

// unguarded are overloads of guarded functions that allocate nothing
// (number arithmetic): left as they are, on the hot path.
var unguarded = map[string]bool{
	"add_int64": true, "add_uint64": true, "add_double": true,
	"add_duration_duration": true, "add_duration_timestamp": true, "add_timestamp_duration": true,
	"int64_to_string": true, "uint64_to_string": true, "double_to_string": true, "bool_to_string": true,
	"string_to_string": true, "bytes_to_bytes": true, "timestamp_to_string": true, "duration_to_string": true,
}

// CELBudget is what one evaluation of a where expression may allocate in
// guarded calls together (MaxCELAllocBytes): each call is bounded on its
// own, and this bounds a comprehension that repeats one (a map over a
// range). The evaluation's activation resolves CELBudgetVar to it; one
// evaluation runs on one goroutine, so it needs no lock.
type CELBudget struct{ used int64 }

// CELBudgetVar is the name under which an activation hands its budget to
// the guards; not a CEL identifier, so no expression can name it.
const CELBudgetVar = "@kubebridge.alloc"

func budgetOf(a interpreter.Activation) *CELBudget {
	if a == nil {
		return nil
	}
	if v, ok := a.ResolveName(CELBudgetVar); ok {
		b, _ := v.(*CELBudget)
		return b
	}
	return nil
}

// overloadImpls are the implementations of the guarded functions by
// overload id (and by function name, for dynamic dispatch).
var overloadImpls = sync.OnceValue(func() map[string]*functions.Overload {
	out := map[string]*functions.Overload{}
	env, err := CELEnv()
	if err != nil {
		return out
	}
	for name, fn := range env.Functions() {
		if guardedFunctions[name] == nil {
			continue
		}
		bindings, err := fn.Bindings()
		if err != nil {
			continue
		}
		for _, b := range bindings {
			out[b.Operator] = b
		}
	}
	return out
})

// boundAllocations puts a guardedCall in place of each call to a guarded
// function.
func boundAllocations(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	call, ok := i.(interpreter.InterpretableCall)
	if !ok {
		return i, nil
	}
	check := guardedFunctions[call.Function()]
	if check == nil || unguarded[call.OverloadID()] {
		return i, nil
	}
	impl := overloadImpls()[call.OverloadID()]
	if impl == nil {
		impl = overloadImpls()[call.Function()]
	}
	if impl == nil {
		return nil, fmt.Errorf("no implementation of %s to guard", call.Function())
	}
	return guardedCall{InterpretableCall: call, impl: impl, check: check}, nil
}

// guardedCall evaluates the call's arguments once, checks them, and only
// then calls the implementation: a result over the bounds is an evaluation
// error (the where is false, and counted) instead of an allocation. It is
// still the InterpretableCall it replaces (function, overload, arguments),
// so the cost tracker counts it as before.
type guardedCall struct {
	interpreter.InterpretableCall
	impl  *functions.Overload
	check guard
}

func (g guardedCall) Eval(a interpreter.Activation) ref.Val {
	return g.run(budgetOf(a), func(x interpreter.InterpretableV2) ref.Val { return x.Eval(a) })
}

func (g guardedCall) Exec(f *interpreter.ExecutionFrame) ref.Val {
	return g.run(budgetOf(f), func(x interpreter.InterpretableV2) ref.Val { return x.Exec(f) })
}

func (g guardedCall) run(budget *CELBudget, eval func(interpreter.InterpretableV2) ref.Val) ref.Val {
	argNodes := g.Args()
	args := make([]ref.Val, len(argNodes))
	for i, x := range argNodes {
		args[i] = eval(x)
		if types.IsUnknownOrError(args[i]) {
			return args[i]
		}
	}
	alloc, err := g.check(args)
	if err != nil {
		return err
	}
	if budget != nil && alloc > 0 {
		budget.used += alloc
		if budget.used > MaxCELAllocBytes {
			return types.NewErr("%s: the expression allocates more than %d bytes in one evaluation", g.Function(), MaxCELAllocBytes)
		}
	}
	switch {
	case len(args) == 1 && g.impl.Unary != nil:
		return g.impl.Unary(args[0])
	case len(args) == 2 && g.impl.Binary != nil:
		return g.impl.Binary(args[0], args[1])
	case g.impl.Function != nil:
		return g.impl.Function(args...)
	}
	return types.NewErr("no such overload: %s", g.Function())
}

func checkReplace(args []ref.Val) (int64, ref.Val) {
	if len(args) < 3 {
		return 0, nil
	}
	s, ok1 := args[0].(types.String)
	old, ok2 := args[1].(types.String)
	repl, ok3 := args[2].(types.String)
	if !ok1 || !ok2 || !ok3 {
		return 0, nil // the call itself reports what is wrong
	}
	limit := int64(-1)
	if len(args) == 4 {
		if l, ok := args[3].(types.Int); ok {
			limit = int64(l)
		}
	}
	size := replaceSize(string(s), string(old), string(repl), limit)
	if size > MaxCELStringBytes {
		return 0, types.NewErr("replace would build a string of %d bytes, more than %d", size, MaxCELStringBytes)
	}
	return size, nil
}

func checkJoin(args []ref.Val) (int64, ref.Val) {
	size := valueSize(args[0], 0)
	if len(args) == 2 {
		if sep, ok := args[1].(types.String); ok {
			if l, ok := args[0].(traits.Lister); ok {
				if n, ok := l.Size().(types.Int); ok {
					size += int64(n) * int64(len(sep))
				}
			}
		}
	}
	if size > MaxCELStringBytes {
		return 0, types.NewErr("join would build a string of about %d bytes, more than %d", size, MaxCELStringBytes)
	}
	return size, nil
}

func checkFormat(args []ref.Val) (int64, ref.Val) {
	var size int64
	for _, a := range args {
		size += valueSize(a, 0)
	}
	if size > MaxCELStringBytes {
		return 0, types.NewErr("format would build a string of about %d bytes, more than %d", size, MaxCELStringBytes)
	}
	return size, nil
}

// checkSortable bounds the lists sort and distinct work on (CPU spent
// before the cost check).
func checkSortable(args []ref.Val) (int64, ref.Val) {
	if l, ok := args[0].(traits.Lister); ok {
		if n, ok := l.Size().(types.Int); ok {
			if int64(n) > MaxCELSortSize {
				return 0, types.NewErr("%d elements to sort, more than %d", n, MaxCELSortSize)
			}
			return 16 * int64(n), nil
		}
	}
	return 0, nil
}

// checkAdd bounds a string or bytes concatenation by its result (a list
// concatenation is a view of its operands: it copies nothing).
func checkAdd(args []ref.Val) (int64, ref.Val) {
	if len(args) != 2 {
		return 0, nil
	}
	var size int64
	switch a := args[0].(type) {
	case types.String:
		b, ok := args[1].(types.String)
		if !ok {
			return 0, nil
		}
		size = int64(len(a)) + int64(len(b))
	case types.Bytes:
		b, ok := args[1].(types.Bytes)
		if !ok {
			return 0, nil
		}
		size = int64(len(a)) + int64(len(b))
	default:
		return 0, nil
	}
	if size > MaxCELStringBytes {
		return 0, types.NewErr("_+_ would build a string of %d bytes, more than %d", size, MaxCELStringBytes)
	}
	return size, nil
}

// checkReverse bounds reverse: of a string (its runes), of a list.
func checkReverse(args []ref.Val) (int64, ref.Val) {
	switch x := args[0].(type) {
	case types.String:
		if len(x) > MaxCELStringBytes {
			return 0, types.NewErr("reverse of a string of %d bytes, more than %d", len(x), MaxCELStringBytes)
		}
		return 4 * int64(len(x)), nil
	case traits.Lister:
		n, ok := x.Size().(types.Int)
		if !ok {
			return 0, nil
		}
		if int64(n) > MaxCELListSize {
			return 0, types.NewErr("reverse of a list of %d elements, more than %d", n, MaxCELListSize)
		}
		return 16 * int64(n), nil
	}
	return 0, nil
}

// scaled is the guard of a function whose result (or scratch space) is
// about factor times the size of its arguments; bounded checks the result
// against MaxCELStringBytes, else only the budget counts it.
func scaled(name string, factor int64, bounded bool) guard {
	return func(args []ref.Val) (int64, ref.Val) {
		var size int64
		for _, a := range args {
			size += valueSize(a, 0)
		}
		size *= factor
		if bounded && size > MaxCELStringBytes {
			return 0, types.NewErr("%s would build about %d bytes, more than %d", name, size, MaxCELStringBytes)
		}
		return size, nil
	}
}

// valueSize approximates the bytes a value takes when written out:
// strings and bytes by their length, lists and maps by their elements. It
// stops counting once past MaxCELStringBytes; a value nested deeper than
// 64 levels (no Kubernetes object is) counts as over it.
func valueSize(v ref.Val, depth int) int64 {
	switch x := v.(type) {
	case types.String:
		return int64(len(x))
	case types.Bytes:
		return int64(len(x))
	case traits.Lister:
		if depth > 64 {
			return MaxCELStringBytes + 1
		}
		var size int64
		it := x.Iterator()
		for it.HasNext() == types.True {
			size += valueSize(it.Next(), depth+1) + 2
			if size > MaxCELStringBytes {
				return size
			}
		}
		return size
	case traits.Mapper:
		if depth > 64 {
			return MaxCELStringBytes + 1
		}
		var size int64
		it := x.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			size += valueSize(k, depth+1) + valueSize(x.Get(k), depth+1) + 4
			if size > MaxCELStringBytes {
				return size
			}
		}
		return size
	}
	return 16
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

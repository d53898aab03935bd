package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
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
			ext.Lists(),
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
	return ast, nil
}

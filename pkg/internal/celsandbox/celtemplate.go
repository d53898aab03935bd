package celsandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// The variables a template (a request shaped by CEL) sees besides those of
// where: the event's attributes and, for updates, the JSON patch.
const (
	CELEvent = "event" // id, type, subject, source, rule, cluster, change, reason, replay, time, entered
	CELPatch = "patch" // list of {op, path, value}; empty unless the event is an update with a patch
	// CELChanges is what an update changed, for people: {known, list:
	// [{op, path, old, new}], more, text} (TemplateVars.Changes).
	CELChanges = "changes"
	// CELCredentials maps the names a sink declares (webhook
	// credentialFiles) to their files' current contents: an API key that
	// goes in a body or a header (PagerDuty's routing_key, Opsgenie's
	// GenieKey). Only credentials.<name> reads it, so a template names each
	// credential it sends and the config can be checked for it.
	CELCredentials = "credentials"
	// CELDigest is a digest's (a sink's digest, request.digest): {group,
	// count, entered, left, changed, items: [{change, line, ...}], more,
	// title, text} (TemplateVars.Digest); empty in a request of one event.
	CELDigest = "digest"
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
			cel.Variable(CELChanges, cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable(CELCredentials, cel.MapType(cel.StringType, cel.StringType)),
			cel.Variable(CELDigest, cel.MapType(cel.StringType, cel.DynType)),
		)
	})
	return celTemplateEnv, celTemplateEnvErr
}

// Template is a compiled template expression.
type Template struct {
	prg         cel.Program
	want        string   // "string" or "json"
	credentials []string // the names of credentials.<name> it reads
}

// Credentials lists the credentials the template reads, by name.
func (t *Template) Credentials() []string { return t.credentials }

// CompileTemplate compiles expr to yield want: "string", "bool" or
// "json".
func CompileTemplate(expr, want string) (*Template, []error) {
	switch want {
	case "string", "bool", "json":
		return compileTemplate(expr, want)
	}
	return nil, []error{fmt.Errorf("a template yields string, bool or json, not %q", want)}
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
	case want == "bool" && !t.IsAssignableType(cel.BoolType):
		return nil, []error{fmt.Errorf("must be a boolean expression, got %s", t)}
	case want == "json" && !jsonType(t):
		return nil, []error{fmt.Errorf("must be a JSON value (map, list, string, number, bool or null), got %s", t)}
	}
	creds, err := credentialRefs(ast.NativeRep().Expr())
	if err != nil {
		return nil, []error{err}
	}
	prg, err := env.Program(ast, CELProgramOptions()...)
	if err != nil {
		return nil, []error{err}
	}
	return &Template{prg: prg, want: want, credentials: creds}, nil
}

// credentialRefs lists the names e reads as credentials.<name> (or
// credentials["name"]); any other use of credentials (the whole map, a
// computed key) is refused, so that what a template can send is known
// from the config.
func credentialRefs(e celast.Expr) ([]string, error) {
	var names []string
	var err error
	isCreds := func(x celast.Expr) bool {
		return x.Kind() == celast.IdentKind && x.AsIdent() == CELCredentials
	}
	seen := map[int64]bool{} // the credentials idents used by name
	celast.PreOrderVisit(e, celast.NewExprVisitor(func(x celast.Expr) {
		switch x.Kind() {
		case celast.SelectKind:
			if sel := x.AsSelect(); isCreds(sel.Operand()) && !sel.IsTestOnly() {
				names = append(names, sel.FieldName())
				seen[sel.Operand().ID()] = true
			}
		case celast.CallKind:
			c := x.AsCall()
			if c.FunctionName() == operators.Index && len(c.Args()) == 2 && isCreds(c.Args()[0]) &&
				c.Args()[1].Kind() == celast.LiteralKind {
				if k, ok := c.Args()[1].AsLiteral().(types.String); ok {
					names = append(names, string(k))
					seen[c.Args()[0].ID()] = true
				}
			}
		case celast.IdentKind:
			if isCreds(x) && !seen[x.ID()] && err == nil {
				err = fmt.Errorf("%s is read by name only: %s.<name>, one of the sink's credentialFiles", CELCredentials, CELCredentials)
			}
		}
	}))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return slices.Compact(names), nil
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
	Credentials       map[string]string
	// Changes computes changes, on first use: most templates never read it.
	Changes func() map[string]any
	// Owners is the object's owner chain (CELOwners; nil: empty), and
	// Involved a Kubernetes Event's involved object (CELInvolved; nil:
	// null): what the rule's include: [owners] resolved.
	Owners   []any
	Involved map[string]any
	// Digest is the digest a request renders (CELDigest; nil: empty).
	Digest map[string]any

	changes map[string]any
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
	case CELOwners:
		if a.v.Owners == nil {
			return []any{}, true
		}
		return a.v.Owners, true
	case CELInvolved:
		if a.v.Involved == nil {
			return nil, true
		}
		return a.v.Involved, true
	case CELEvent:
		return a.v.Event, true
	case CELPatch:
		if a.v.Patch == nil {
			return []any{}, true
		}
		return a.v.Patch, true
	case CELChanges:
		if a.v.changes == nil {
			if a.v.Changes != nil {
				a.v.changes = a.v.Changes()
			}
			if a.v.changes == nil {
				a.v.changes = map[string]any{"known": false, "list": []any{}, "more": int64(0), "text": ""}
			}
		}
		return a.v.changes, true
	case CELCredentials:
		if a.v.Credentials == nil {
			return map[string]string{}, true
		}
		return a.v.Credentials, true
	case CELDigest:
		if a.v.Digest == nil {
			return map[string]any{}, true
		}
		return a.v.Digest, true
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

// Bool evaluates a bool template.
func (t *Template) Bool(v *TemplateVars) (bool, error) {
	out, err := t.eval(v)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("evaluated to %s, not a bool", out.Type())
	}
	return bool(b), nil
}

// JSON evaluates a JSON template and encodes its value: JSON by
// construction (each value encoded by its type, strings by
// encoding/json), so nothing an object holds can break out of a string.
func (t *Template) JSON(v *TemplateVars) ([]byte, error) {
	out, err := t.eval(v)
	if err != nil {
		return nil, err
	}
	// Sized before it is encoded: a list of references to one large value
	// is small until it is written out.
	if valueSize(out, 0) > MaxCELStringBytes {
		return nil, ErrTemplateTooLarge
	}
	b, err := appendJSON(make([]byte, 0, 256), out, 0)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxCELStringBytes {
		return nil, ErrTemplateTooLarge
	}
	return b, nil
}

// appendJSON appends v as JSON: null, bools, numbers (NaN and infinities
// are not JSON), strings, lists, and maps with string keys (sorted, so a
// body and its signature are the same for the same value).
func appendJSON(b []byte, v ref.Val, depth int) ([]byte, error) {
	if depth > 64 {
		return nil, errors.New("nested deeper than 64 levels")
	}
	switch x := v.(type) {
	case types.Null:
		return append(b, "null"...), nil
	case types.Bool:
		return strconv.AppendBool(b, bool(x)), nil
	case types.Int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case types.Uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case types.Double:
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%v is not a JSON number", f)
		}
		return strconv.AppendFloat(b, f, 'g', -1, 64), nil
	case types.String:
		return appendJSONString(b, string(x))
	case traits.Lister:
		b = append(b, '[')
		it := x.Iterator()
		for first := true; it.HasNext() == types.True; first = false {
			if !first {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, it.Next(), depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case traits.Mapper:
		var keys []string
		it := x.Iterator()
		for it.HasNext() == types.True {
			k, ok := it.Next().(types.String)
			if !ok {
				return nil, errors.New("a map key is not a string")
			}
			keys = append(keys, string(k))
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSONString(b, k); err != nil {
				return nil, err
			}
			b = append(b, ':')
			if b, err = appendJSON(b, x.Get(types.String(k)), depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("a %s is not a JSON value", v.Type())
}

func appendJSONString(b []byte, s string) ([]byte, error) {
	q, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append(b, q...), nil
}

func (t *Template) eval(v *TemplateVars) (ref.Val, error) {
	out, _, err := t.prg.Eval(&templateActivation{v: v})
	if err != nil {
		return nil, err
	}
	return out, nil
}

package filters

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// WindowKey is a sink's updateWindow key: a CEL expression over an event
// (object, oldObject, type; owners and involved where its rule includes
// owners) whose string groups events into one window.
type WindowKey struct{ prg cel.Program }

// NewWindowKey compiles expr (config validation has checked it).
func NewWindowKey(expr string) (*WindowKey, error) {
	ast, errs := celsandbox.CompileKey(expr)
	if len(errs) > 0 {
		return nil, fmt.Errorf("updateWindow.key: %v", errs[0])
	}
	env, err := celsandbox.CELEnv()
	if err != nil {
		return nil, err
	}
	prg, err := env.Program(ast, celsandbox.CELProgramOptions()...)
	if err != nil {
		return nil, fmt.Errorf("updateWindow.key: %w", err)
	}
	return &WindowKey{prg: prg}, nil
}

// Of evaluates the key for e: an error when the expression fails or yields
// something other than a string (involved is null for an event whose rule
// does not include owners).
func (k *WindowKey) Of(e *event.Event) (string, error) {
	vars := eventVars(e)
	out, _, err := k.prg.Eval(vars)
	if err != nil {
		return "", err
	}
	s, ok := out.(types.String)
	if !ok {
		return "", fmt.Errorf("the key evaluated to %s, not a string", out.Type())
	}
	if len(s) > MaxWindowKey {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
	return string(s), nil
}

// MaxWindowKey bounds a key as kept: an object's value (an annotation of
// up to 256 KiB) may be the key, which the window remembers for each of up
// to maxKeys keys and each object in its views. A longer key is kept as its
// SHA-256, which groups the same events.
const MaxWindowKey = 256

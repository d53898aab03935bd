package webhook

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// maxShownValue bounds each value a change shows: a message names what
// changed, it does not carry the object.
const maxShownValue = 200

// unknownChanges is the text of an update whose previous state is not
// known (found at a start): said, never guessed.
const unknownChanges = "what changed cannot be told: the update was found when kubebridge started, without the previous state"

// changesVar is the template's changes: {known, list: [{op, path, old,
// new}], more, text}, text one line per change ("path: old → new").
func changesVar(e *event.Event) map[string]any {
	cs, more, known := e.Changes()
	if !known {
		text := ""
		if e.Untold() {
			text = unknownChanges
		}
		return map[string]any{"known": false, "list": []any{}, "more": int64(0), "text": text}
	}
	list := make([]any, 0, len(cs))
	lines := make([]string, 0, len(cs)+1)
	for _, c := range cs {
		op, old, now := "changed", shown(c.Old, c.HadOld), shown(c.New, c.HasNew)
		var line string
		switch {
		case !c.HadOld:
			op, line = "added", c.Path+": "+now
		case !c.HasNew:
			op, line = "removed", c.Path+": removed (was "+old+")"
		default:
			line = c.Path + ": " + old + " → " + now
		}
		list = append(list, map[string]any{"op": op, "path": c.Path, "old": old, "new": now})
		lines = append(lines, line)
	}
	if more > 0 {
		lines = append(lines, fmt.Sprintf("… and %d more", more))
	}
	return map[string]any{"known": true, "list": list, "more": int64(more), "text": strings.Join(lines, "\n")}
}

// shown is a value as a message shows it: a string as it is, anything
// else as JSON, cut to maxShownValue characters ending in "…".
func shown(v any, present bool) string {
	if !present {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		s = string(b)
	}
	if utf8.RuneCountInString(s) > maxShownValue {
		r := []rune(s)
		s = string(r[:maxShownValue-1]) + "…"
	}
	return s
}

package config_test

import (
	"errors"
	"strings"
	"testing"

	. "github.com/kubebridge/kubebridge/pkg/config"
)

// A file dead-letter's rotation bounds are checked at load and reported at
// their key, including a size whose bytes would not fit an int64 (it would
// wrap negative and make every write rotate, keeping only the last few).
func TestDeadLetterRotationBounds(t *testing.T) {
	const old = "      jetstream: true\n"
	cfg := mustParse(t, mutate(t, base, old, old+"    deadLetter: {file: /d.jsonl, maxSizeMB: 1048576, maxBackups: 0}\n"))
	if dl := cfg.Sinks[0].DeadLetter; dl.MaxSizeMB != 1<<20 || dl.MaxBackups != 0 {
		t.Errorf("set: %+v", dl)
	}
	for _, tc := range []struct {
		name, block string
		want        []string
	}{
		{"negative size", "{file: /d.jsonl, maxSizeMB: -1}",
			[]string{"config.yaml:9: sinks[0].deadLetter.maxSizeMB: must be at least 1, got -1"}},
		{"size past 1 TiB", "{file: /d.jsonl, maxSizeMB: 1048577}",
			[]string{"config.yaml:9: sinks[0].deadLetter.maxSizeMB: must be at most 1048576 (1 TiB), got 1048577"}},
		{"size past int64 bytes", "{file: /d.jsonl, maxSizeMB: 9000000000000}",
			[]string{"config.yaml:9: sinks[0].deadLetter.maxSizeMB: must be at most 1048576 (1 TiB), got 9000000000000"}},
		{"negative backups", "{file: /d.jsonl, maxBackups: -2}",
			[]string{"config.yaml:9: sinks[0].deadLetter.maxBackups: must not be negative, got -2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse("config.yaml", []byte(mutate(t, base, old, old+"    deadLetter: "+tc.block+"\n")), types)
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("err = %v, want a config error", err)
			}
			var got []string
			for _, p := range cerr.Problems {
				got = append(got, p.Format("config.yaml"))
			}
			if !matchAll(got, tc.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// Command audit is an example kubebridge exec plugin (docs/plugins.md),
// built on pkg/plugin: it appends one line per event,
// "<id>\t<type>\t<subject>", to the file named by $AUDIT_FILE, and fsyncs
// it before acknowledging the event. (Stdout belongs to the protocol.)
//
//	sinks:
//	  - name: audit
//	    exec:
//	      command: [/plugins/audit]
//	      env: {AUDIT_FILE: /data/audit.log}
//
// Knobs for tests, set by labels on the object:
//
//	audit.kubebridge.io/fail: retry-once   the event fails retryably the first time its id is seen
//	audit.kubebridge.io/fail: permanent    the event is refused for good (the sink's dead-letter gets it)
//	audit.kubebridge.io/crash: once        the plugin exits with code 3 the first time it sees the event
//
// Seen ids are kept in $AUDIT_FILE.seen, so that a restarted plugin does
// not fail or crash on the same event forever.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/kubebridge/kubebridge/pkg/plugin"
	"github.com/kubebridge/kubebridge/pkg/sinks/outcome"
)

func main() {
	path := os.Getenv("AUDIT_FILE")
	if path == "" {
		log.Fatal("audit: AUDIT_FILE is not set")
	}
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	seen, err := openSeen(path + ".seen")
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex // handlers run concurrently
	err = plugin.Run(func(ctx context.Context, e plugin.Event) error {
		labels := e.Labels()
		if labels["audit.kubebridge.io/crash"] == "once" && seen.first("crash "+e.ID) {
			os.Exit(3)
		}
		switch labels["audit.kubebridge.io/fail"] {
		case "permanent":
			return outcome.Permanent(fmt.Errorf("%s is labelled audit.kubebridge.io/fail=permanent", e.Subject))
		case "retry-once":
			if seen.first("retry " + e.ID) {
				return fmt.Errorf("%s: the first attempt fails on purpose (retry-once)", e.Subject)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(out, "%s\t%s\t%s\n", e.ID, e.Type, e.Subject); err != nil {
			return err
		}
		return out.Sync()
	})
	if err != nil {
		log.Fatal(err)
	}
}

// seenSet is the set of knobs already applied, kept on disk.
type seenSet struct {
	mu   sync.Mutex
	keys map[string]bool
	f    *os.File
}

func openSeen(path string) (*seenSet, error) {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	s := &seenSet{keys: map[string]bool{}}
	for _, k := range strings.Split(string(data), "\n") {
		s.keys[k] = true
	}
	s.f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	return s, err
}

// first records key and reports whether it was new.
func (s *seenSet) first(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[key] {
		return false
	}
	s.keys[key] = true
	fmt.Fprintln(s.f, key)
	_ = s.f.Sync()
	return true
}

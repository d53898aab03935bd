// Package plugin turns a Go function into a kubebridge exec plugin: a
// program the exec sink starts, which reads events on stdin and answers each
// on stdout (protocol kubebridge.exec/v1, docs/plugins.md). A plugin is a
// ten-line main:
//
//	func main() {
//		err := plugin.Run(func(ctx context.Context, e plugin.Event) error {
//			if e.Change() == "deleted" {
//				return tickets.Close(ctx, e.Subject) // nil acknowledges the event
//			}
//			return nil
//		})
//		if err != nil {
//			log.Fatal(err)
//		}
//	}
//
// The handler's error decides the answer, classed as a Go sink classes
// its own (the outcome classes of pkg/sinks): nil acknowledges the event;
// outcome.Permanent(err) refuses it for good (it goes to the sink's
// dead-letter); outcome.Throttle(err, d) asks for a retry no sooner than d
// (the sink's backoff still caps the wait at its maxInterval); any other
// error is retried with the sink's backoff. Handlers run concurrently (see
// Concurrency) and are answered in any order: kubebridge never has two
// events of one object unanswered, so an object's events still reach the
// handler one at a time, in order. A handler must return within the exec
// sink's timeout (default 30s): a plugin that leaves its oldest event
// unanswered that long is taken for hung, killed and restarted, and its
// unanswered events are resent.
package plugin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kubebridge/kubebridge/pkg/sinks/outcome"
)

// Event is one CloudEvent as kubebridge writes it (structured mode).
type Event struct {
	ID       string    `json:"id"`        // unique per transition, stable across retries and replays of it
	Source   string    `json:"source"`    // kubebridge/<cluster>
	Type     string    `json:"type"`      // io.kubebridge.<resource>.<group or core>.<added|updated|deleted>
	Subject  string    `json:"subject"`   // <namespace>/<name>, or <name> for cluster-scoped objects
	Time     time.Time `json:"time"`      // when the bridge observed the change
	Rule     string    `json:"kbrule"`    // the rule that selected the object
	Cluster  string    `json:"kbcluster"` // the bridge's cluster name
	Replay   string    `json:"kbreplay"`  // "", resync or checkpoint
	Reason   string    `json:"kbreason"`  // "", or unmatched: the object left the rule's view but still exists
	KBChange string    `json:"kbchange"`  // added, updated or deleted (see Change)
	// Data is {"object":…, "oldObject":…, "patch":[…]}, as the rule's include says.
	Data json.RawMessage `json:"data"`
	// Raw is the whole event line as received.
	Raw json.RawMessage `json:"-"`
}

// Change returns the kind of change: added, updated or deleted (kbchange;
// from the end of type for events of versions before it).
func (e Event) Change() string {
	if e.KBChange != "" {
		return e.KBChange
	}
	return e.Type[strings.LastIndexByte(e.Type, '.')+1:]
}

// Labels returns the labels of the object in Data (nil when it has none or
// Data holds no object).
func (e Event) Labels() map[string]string {
	var d struct {
		Object struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"object"`
	}
	_ = json.Unmarshal(e.Data, &d)
	return d.Object.Metadata.Labels
}

// Handler handles one event. Its error is the answer (see the package doc);
// ctx ends when the plugin is asked to stop (SIGTERM or SIGINT under Run).
type Handler func(ctx context.Context, e Event) error

// Option configures Run and Serve.
type Option func(*options)

type options struct{ concurrency int }

// DefaultConcurrency is how many handlers run at once unless Concurrency
// says otherwise.
const DefaultConcurrency = 16

// Concurrency sets how many events are handled at once (at least 1; 1
// handles them one by one, in the order they arrive).
func Concurrency(n int) Option { return func(o *options) { o.concurrency = max(n, 1) } }

// Run serves the protocol on the process's stdin and stdout until stdin
// closes (the bridge's shutdown) and every event read has been answered;
// then it returns nil. On SIGTERM or SIGINT, handlers' ctx ends and Run
// returns once they have answered.
//
// Stdout is the protocol's channel: Run points os.Stdout at stderr, so a
// stray fmt.Println in a handler goes to the bridge's log instead of
// breaking the protocol.
func Run(h Handler, opts ...Option) error {
	proto := os.Stdout
	os.Stdout = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return Serve(ctx, os.Stdin, proto, h, opts...)
}

// answer is one line of the plugin's output.
type answer struct {
	ID         string `json:"id"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Permanent  bool   `json:"permanent,omitempty"`
	RetryAfter string `json:"retryAfter,omitempty"`
}

// Serve reads events from r, one per line, calls h for each (up to the
// concurrency limit at once) and writes each answer as one line to w, in
// the order handlers finish. It returns at the end of r once every event
// read has been answered, or, when ctx ends, once the handlers running have
// answered (a Read of r in progress is then left to end when r is closed).
// A line that cannot be decoded is refused permanently when it has an id,
// and reported on stderr otherwise.
func Serve(ctx context.Context, r io.Reader, w io.Writer, h Handler, opts ...Option) error {
	o := options{concurrency: DefaultConcurrency}
	for _, opt := range opts {
		opt(&o)
	}
	out := &writer{w: bufio.NewWriter(w)}
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() { // the reader; it ends with r, or is abandoned when ctx ends
		defer close(lines)
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			line, err := br.ReadBytes('\n')
			if len(strings.TrimSpace(string(line))) > 0 {
				select {
				case lines <- line:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					readErr <- err
				}
				return
			}
		}
	}()
	slots := make(chan struct{}, o.concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		var line []byte
		var ok bool
		select {
		case line, ok = <-lines:
		case <-ctx.Done():
			wg.Wait()
			return errors.Join(ctx.Err(), out.err())
		}
		if !ok {
			wg.Wait()
			select {
			case err := <-readErr:
				return errors.Join(fmt.Errorf("reading events: %w", err), out.err())
			default:
				return out.err()
			}
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil || e.ID == "" {
			var idOnly struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(line, &idOnly) == nil && idOnly.ID != "" {
				out.send(answer{ID: idOnly.ID, Error: fmt.Sprintf("plugin cannot decode the event: %v", err), Permanent: true})
			} else {
				fmt.Fprintf(os.Stderr, "plugin: skipping an input line that is not an event (%d bytes)\n", len(line))
			}
			continue
		}
		e.Raw = line[:len(line)-len(trailingSpace(line))]
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			// Not handled: answered retryably, so the bridge sends it again.
			out.send(answer{ID: e.ID, Error: "plugin stopping"})
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			out.send(handle(ctx, h, e))
		}()
	}
}

func trailingSpace(b []byte) []byte {
	i := len(b)
	for i > 0 && (b[i-1] == '\n' || b[i-1] == '\r' || b[i-1] == ' ' || b[i-1] == '\t') {
		i--
	}
	return b[i:]
}

// handle runs h and turns its result (or panic) into an answer.
func handle(ctx context.Context, h Handler, e Event) (a answer) {
	a.ID = e.ID
	defer func() {
		if p := recover(); p != nil {
			fmt.Fprintf(os.Stderr, "plugin: handler panicked on event %s: %v\n", e.ID, p)
			a = answer{ID: e.ID, Error: fmt.Sprintf("handler panicked: %v", p)}
		}
	}()
	err := h(ctx, e)
	if err == nil {
		a.OK = true
		return a
	}
	a.Error = err.Error()
	switch {
	case outcome.IsPermanent(err):
		a.Permanent = true
		if inner := errors.Unwrap(err); inner != nil && !outcome.IsPermanent(inner) {
			a.Error = inner.Error() // the class has its own field: the error is the handler's message
		}
	case outcome.IsThrottle(err):
		a.RetryAfter = outcome.ThrottleDelay(err).String()
	}
	return a
}

// writer writes answers, one line each, flushed at once.
type writer struct {
	mu   sync.Mutex
	w    *bufio.Writer
	werr error
}

func (w *writer) send(a answer) {
	b, _ := json.Marshal(a) // strings and bools only: cannot fail
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.werr != nil {
		return
	}
	w.w.Write(b)
	w.w.WriteByte('\n')
	w.werr = w.w.Flush()
}

func (w *writer) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.werr != nil {
		return fmt.Errorf("writing answers: %w", w.werr)
	}
	return nil
}

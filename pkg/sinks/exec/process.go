package exec

import (
	"bufio"
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	osexec "os/exec"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Line bounds.
const (
	maxAnswerLine = 64 << 10 // an answer is small; a longer line is a protocol error
	maxErrorText  = 1 << 10  // an answer's error text is cut to this in errors and logs
	maxStderrLine = 4 << 10  // stderr lines are logged up to this
)

// proc is one run of the plugin. Its goroutines (wait, answers, stderr,
// writer, answer timeout) are awaited by the supervisor through wg.
type proc struct {
	cmd    *osexec.Cmd
	pid    int
	stdin  *os.File // owned by the writer
	stdout *os.File
	stderr *os.File

	started time.Time
	wake    chan struct{} // the writer has work (capacity 1)
	exited  chan struct{} // closed once the process has been waited for
	exitErr error         // cmd.Wait's result, set before exited is closed
	wg      sync.WaitGroup

	killMu sync.Mutex
	reaped bool // set as it is about to be reaped: its pid may be reused, no more group kills (guarded by killMu)

	// Guarded by Sink.mu.
	queue      []*call    // to be written, in order
	unanswered *list.List // of *call: handed to it and not answered, oldest first
	headSince  time.Time  // when unanswered's front last changed by an answer (or a failure)
	closeIn    bool       // close stdin once the queue is written
	stopping   bool       // takes no more events
	reason     error      // why it was stopped, when the bridge stopped it
	waited     bool       // exitErr is cmd.Wait's result
}

// reasonLocked says why p is stopping: the bridge's reason, or its exit
// (the exit status once waitExit has it).
func (p *proc) reasonLocked() error {
	switch {
	case p.reason != nil:
		return p.reason
	case p.exitErr != nil:
		return fmt.Errorf("the plugin exited (%v)", p.exitErr)
	case p.waited:
		return errors.New("the plugin exited (status 0)")
	}
	return errors.New("the plugin exited")
}

// enqueue queues c for the writer and starts its answer's clock; Sink.mu
// is held.
func (p *proc) enqueue(c *call) {
	p.queue = append(p.queue, c)
	c.elem = p.unanswered.PushBack(c)
	p.poke()
}

func (p *proc) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// kill kills the plugin and its process group (children it started),
// unless it has been reaped already (its pid may belong to another
// process by then).
func (p *proc) kill() {
	p.killMu.Lock()
	if !p.reaped {
		killGroup(p.pid)
	}
	p.killMu.Unlock()
	_ = p.cmd.Process.Kill() // safe after reaping: os.Process knows
}

// start starts a run of the plugin and its goroutines.
func (s *Sink) start() (*proc, error) {
	var files [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	for i := 0; i < 6; i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(files[:i])
			return nil, err
		}
		files[i], files[i+1] = r, w
	}
	cmd := osexec.Command(s.argv[0], s.argv[1:]...)
	cmd.Env = s.env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[3], files[5]
	cmd.SysProcAttr = sysProcAttr()
	err := cmd.Start()
	closeAll([]*os.File{files[0], files[3], files[5]}) // the child's ends
	if err != nil {
		closeAll([]*os.File{files[1], files[2], files[4]})
		return nil, err
	}
	p := &proc{
		cmd: cmd, pid: cmd.Process.Pid, stdin: files[1], stdout: files[2], stderr: files[4],
		started: time.Now(), wake: make(chan struct{}, 1), exited: make(chan struct{}),
		unanswered: list.New(),
	}
	s.logger.Info("plugin started", "program", filepath.Base(s.argv[0]), "pid", p.pid, "protocol", Protocol)
	p.wg.Add(5)
	go s.waitExit(p)
	go s.readAnswers(p)
	go s.readStderr(p)
	go s.writeEvents(p)
	go s.watchAnswers(p)
	return p, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			_ = f.Close()
		}
	}
}

// waitExit waits for the process. Before reaping it, it kills what the
// plugin left in its process group (its pid cannot be reused until
// reaped); then it bounds how long the output pipes are drained, and ends
// a write to its stdin at once, since a child that escaped the group may
// still hold the pipes (and not read: the writer would block for ever, and
// with it the restart and Close).
func (s *Sink) waitExit(p *proc) {
	defer p.wg.Done()
	waitUnreaped(p.pid)
	p.killMu.Lock()
	killGroup(p.pid)
	p.reaped = true
	p.killMu.Unlock()
	err := p.cmd.Wait()
	now := time.Now()
	_ = p.stdin.SetWriteDeadline(now) // an error: the writer closed it already
	deadline := now.Add(s.timing.readGrace)
	_ = p.stdout.SetReadDeadline(deadline)
	_ = p.stderr.SetReadDeadline(deadline)
	s.mu.Lock()
	p.stopping = true
	p.exitErr, p.waited = err, true
	s.mu.Unlock()
	close(p.exited)
}

// writeEvents writes the queued events to stdin, in order, until the
// process exits or stdin is to be closed.
func (s *Sink) writeEvents(p *proc) {
	defer p.wg.Done()
	defer p.stdin.Close()
	w := bufio.NewWriterSize(p.stdin, 64<<10)
	for {
		select {
		case <-p.wake:
		case <-p.exited:
			return
		}
		s.mu.Lock()
		queue, closeIn := p.queue, p.closeIn
		p.queue = nil
		s.mu.Unlock()
		for _, c := range queue {
			_, _ = w.Write(c.line)
			_ = w.WriteByte('\n')
		}
		if err := w.Flush(); err != nil { // it exited or closed its stdin
			t := time.NewTimer(s.timing.readGrace)
			defer t.Stop()
			select {
			case <-p.exited: // the exit is the story, not the broken pipe
			case <-t.C:
				s.stop(p, fmt.Errorf("writing to its stdin: %w", err))
			}
			return
		}
		if closeIn {
			return
		}
	}
}

// readAnswers reads answers from stdout until EOF; a line that is not a
// valid answer stops the plugin, and so does the end of its stdout before
// its exit (see stdoutEnded).
func (s *Sink) readAnswers(p *proc) {
	defer p.wg.Done()
	r := bufio.NewReaderSize(p.stdout, 64<<10)
	for {
		line, cut, err := readLine(r, maxAnswerLine, false)
		line = bytes.TrimSpace(line)
		switch {
		case cut:
			s.stop(p, fmt.Errorf("protocol error: an answer line longer than %d bytes", maxAnswerLine))
			return
		case len(line) > 0:
			if perr := s.answer(p, line); perr != nil {
				s.stop(p, fmt.Errorf("protocol error: %w", perr))
				return
			}
		}
		if err != nil {
			s.stdoutEnded(p, err)
			return
		}
	}
}

// stdoutEnded handles the end of the plugin's stdout (EOF, or a read
// error). A plugin that exits closes it first: then nothing is to be done.
// One that does not exit within readGrace can answer nothing more, and is
// stopped; at shutdown only when it still owes answers (it may close its
// stdout once it answered everything, and then take a while to exit).
func (s *Sink) stdoutEnded(p *proc, err error) {
	t := time.NewTimer(s.timing.readGrace)
	defer t.Stop()
	select {
	case <-p.exited:
		return
	case <-t.C:
	}
	s.mu.Lock()
	done := p.closeIn && p.unanswered.Len() == 0
	s.mu.Unlock()
	if done {
		return
	}
	if errors.Is(err, io.EOF) {
		s.stop(p, errors.New("the plugin closed its stdout but kept running: it can answer nothing more"))
	} else {
		s.stop(p, fmt.Errorf("reading its stdout: %w", err))
	}
}

// watchAnswers is the answer timeout. The oldest unanswered event gets
// timeout for its answer, counted from when it was written or from when it
// became the oldest (the one before it was answered), whichever is later:
// an event is never waited for longer than that as the oldest. So a plugin
// that answers nothing is caught timeout after its first write; one that
// drops a single event, timeout after it answered the events written
// before that one; and one that works through a backlog in the pipe
// (events written long ago, handled one after the other) is not. On expiry
// p counts as hung and is stopped (killed with its process group); the
// supervisor then fails its unanswered events retryably (the delivery loop
// resends them) and restarts it. The timer is set for the oldest's due
// time, or a whole timeout ahead when nothing is unanswered (any event
// handed over later is due later), so it never fires late.
func (s *Sink) watchAnswers(p *proc) {
	defer p.wg.Done()
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	for {
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
		s.mu.Lock()
		next, overdue, unanswered := s.timeout, time.Duration(0), 0
		if front := p.unanswered.Front(); front != nil {
			since := front.Value.(*call).sent
			if p.headSince.After(since) {
				since = p.headSince
			}
			if waited := time.Since(since); waited >= s.timeout {
				overdue, unanswered = waited, p.unanswered.Len()
			} else {
				next = s.timeout - waited
			}
		}
		s.mu.Unlock()
		select {
		case <-p.exited: // its exit is the story
			return
		default:
		}
		if unanswered > 0 {
			// Counts and times only: never event data.
			s.logger.Warn("plugin did not answer in time; killing it (its unanswered events are resent)",
				"pid", p.pid, "timeout", s.timeout, "waited", overdue.Round(time.Millisecond), "unanswered", unanswered)
			s.stop(p, fmt.Errorf("no answer within the timeout (%s)", s.timeout))
			return
		}
		t.Reset(next)
	}
}

// answer settles the call an answer line is for.
func (s *Sink) answer(p *proc, line []byte) error {
	var a struct {
		ID         *string `json:"id"`
		OK         *bool   `json:"ok"`
		Error      string  `json:"error"`
		Permanent  bool    `json:"permanent"`
		RetryAfter string  `json:"retryAfter"`
	}
	if err := json.Unmarshal(line, &a); err != nil {
		return fmt.Errorf("not a JSON answer (%d bytes, starting %q): %v", len(line), cut(line, 64), err)
	}
	if a.ID == nil || *a.ID == "" {
		return fmt.Errorf("an answer without an id (%d bytes, starting %q)", len(line), cut(line, 64))
	}
	if a.OK == nil {
		return fmt.Errorf("the answer for %q has no ok", cut([]byte(*a.ID), 256))
	}
	var outcome error
	if !*a.OK {
		msg := a.Error
		if msg == "" {
			msg = "refused without an error text"
		}
		outcome = fmt.Errorf("plugin: %s", cut([]byte(msg), maxErrorText))
		switch {
		case a.Permanent:
			outcome = sinks.Permanent(outcome)
		case a.RetryAfter != "":
			d, err := time.ParseDuration(a.RetryAfter)
			if err != nil || d < 0 {
				return fmt.Errorf("the answer for %q has retryAfter %q, not a duration like 5s", cut([]byte(*a.ID), 256), cut([]byte(a.RetryAfter), 64))
			}
			outcome = sinks.Throttle(outcome, d)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.pending[*a.ID]
	if c == nil || c.proc != p {
		return fmt.Errorf("an answer for %q, which is not an unanswered event", cut([]byte(*a.ID), 256))
	}
	s.finishLocked(c, outcome)
	return nil
}

// readStderr logs the plugin's stderr, one record per line.
func (s *Sink) readStderr(p *proc) {
	defer p.wg.Done()
	r := bufio.NewReaderSize(p.stderr, maxStderrLine)
	for {
		line, truncated, err := readLine(r, maxStderrLine, true)
		if line = bytes.TrimRight(line, "\r\n"); len(line) > 0 {
			if truncated {
				s.logger.Info("plugin stderr", "pid", p.pid, "line", string(line), "truncated", true)
			} else {
				s.logger.Info("plugin stderr", "pid", p.pid, "line", string(line))
			}
		}
		if err != nil {
			return
		}
	}
}

// readLine reads one line of at most limit bytes. Of a longer line, it
// returns the first limit bytes with truncated set, at once, or, with
// drain, once the rest of the line has been read and dropped.
func readLine(r *bufio.Reader, limit int, drain bool) (line []byte, truncated bool, err error) {
	for {
		frag, err := r.ReadSlice('\n')
		if room := limit - len(line); len(frag) > room {
			frag, truncated = frag[:max(room, 0)], true
			if !drain {
				return append(line, frag...), true, nil
			}
		}
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			if errors.Is(err, io.EOF) && len(line) == 0 {
				return nil, truncated, err
			}
			return line, truncated, err
		}
	}
}

func cut(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// stop takes p out of service for reason and kills it; the supervisor
// then logs the reason, fails its unanswered events and restarts it.
func (s *Sink) stop(p *proc, reason error) {
	s.mu.Lock()
	p.stopping = true
	if p.reason == nil {
		p.reason = reason
	}
	s.mu.Unlock()
	p.kill()
}

// supervise owns the plugin's runs: it waits for each to end, fails its
// unanswered events, and starts the next after a backoff, until Close.
func (s *Sink) supervise(p *proc) {
	defer close(s.stopped)
	// Restarts back off from minBackoff, doubling up to maxBackoff.
	fresh := func() wait.Backoff {
		return wait.Backoff{Duration: s.timing.minBackoff, Factor: 2, Cap: s.timing.maxBackoff, Steps: math.MaxInt}
	}
	restarts := fresh()
	delay := restarts.Step()
	for {
		if p != nil {
			select {
			case <-p.exited:
			case ctx := <-s.closeReq:
				s.shutdown(ctx, p)
				return
			}
			unanswered := s.reap(p)
			ran := time.Since(p.started)
			if ran >= s.timing.healthyAfter {
				restarts = fresh()
				delay = restarts.Step()
			}
			s.mu.Lock()
			reason := p.reason
			s.mu.Unlock()
			attrs := []any{"pid", p.pid, "exit", p.exitErr, "ran", ran.Round(time.Millisecond), "unanswered", unanswered, "restartIn", delay}
			if reason != nil {
				attrs = append(attrs, "reason", reason)
			}
			s.logger.Warn("plugin stopped; restarting it", attrs...)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-s.closeReq:
			t.Stop()
			return
		}
		delay = restarts.Step()
		np, err := s.start()
		s.mu.Lock()
		if err != nil {
			s.downErr = fmt.Errorf("starting %s: %w", s.argv[0], err)
			s.logger.Warn("plugin failed to start", "error", err, "retryIn", delay)
		} else {
			s.proc, s.downErr = np, nil
		}
		s.mu.Unlock()
		p = np
	}
}

// reap waits for p's goroutines (every answer it wrote has been read),
// closes its pipes and fails its unanswered events retryably. It returns
// how many there were.
func (s *Sink) reap(p *proc) int {
	p.wg.Wait()
	closeAll([]*os.File{p.stdout, p.stderr})
	s.mu.Lock()
	defer s.mu.Unlock()
	why := p.reasonLocked()
	if s.proc == p {
		s.proc, s.downErr = nil, why
	}
	err := fmt.Errorf("exec sink: unanswered: %w", why)
	n := 0
	for _, c := range s.pending {
		if c.proc == p {
			s.finishLocked(c, err)
			n++
		}
	}
	p.queue = nil
	return n
}

// shutdown is Close's work on the running plugin: close stdin, wait for the
// answers and the exit (bounded by ctx, and by exitGrace once everything
// is answered), then kill.
func (s *Sink) shutdown(ctx context.Context, p *proc) {
	s.mu.Lock()
	p.closeIn, p.stopping = true, true
	if p.reason == nil {
		p.reason = errClosed
	}
	answered := s.answered
	p.poke()
	s.mu.Unlock()
	exited := true
	select {
	case <-p.exited:
	case <-answered:
		t := time.NewTimer(s.timing.exitGrace)
		select {
		case <-p.exited:
		case <-ctx.Done():
			exited = false
		case <-t.C:
			exited = false
		}
		t.Stop()
	case <-ctx.Done():
		exited = false
	}
	if !exited {
		p.kill()
		<-p.exited
	}
	n := s.reap(p)
	switch {
	case n > 0:
		s.closeErr = fmt.Errorf("exec sink %q: the plugin was killed at shutdown with %d events unanswered", s.name, n)
		s.logger.Warn("plugin killed at shutdown with events unanswered (they are resent after a restart)", "pid", p.pid, "unanswered", n)
	case !exited:
		s.logger.Warn("plugin answered everything but did not exit after its stdin closed; killed", "pid", p.pid)
	default:
		s.logger.Info("plugin exited", "pid", p.pid, "exit", p.exitErr)
	}
}

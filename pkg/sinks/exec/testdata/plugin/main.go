// Command plugin is the exec sink's test plugin. It speaks
// kubebridge.exec/v1 by hand (not through pkg/plugin, so the sink's tests
// pin the wire format) and misbehaves on request.
//
// It keeps its files in $PLUGIN_DIR:
//
//	received.jsonl  every event it took, as received (the contract suite's remote)
//	trace           every event line it read: "<unixnano> <id>"
//	answers         every answer it wrote: "<unixnano> <id> <ok>"
//	starts          one line per start: its pid
//	env             its environment at start
//	eof             created when its stdin closed
//	control         written by the test: "<mode> [<subject>]"
//
// Modes: up (default: take and answer ok), down (answer ok:false), refuse
// (ok:false, permanent), throttle (ok:false, retryAfter $PLUGIN_RETRY_AFTER),
// hold (take, answer nothing until the mode changes, then answer the held
// events in reverse order). With a subject, the mode applies to that
// subject only; the others are up.
//
// Knobs, for its first run only (a restart behaves): PLUGIN_CRASH_AT=N exits
// with code 3 on reading its Nth event; PLUGIN_GARBAGE_AT=N answers its Nth
// event with a line that is not JSON; PLUGIN_CLOSE_STDOUT_AT=N closes its
// stdout on reading its Nth event and keeps running, answering nothing;
// PLUGIN_MUTE=1 reads events and answers none; PLUGIN_ESCAPE=1 starts a
// child in a session of its own (out of reach of a kill of the plugin's
// process group) that holds the plugin's stdin, writes the child's pid to
// escaped, and reads nothing. For every run: PLUGIN_DELAY=<duration> takes
// that long over each event, one after the other; PLUGIN_IGNORE_EOF=1 keeps
// running after stdin closes; PLUGIN_STDERR is written to stderr at start.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var dir = os.Getenv("PLUGIN_DIR")

func appendTo(name, line string) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
}

// control reads the control file once: the mode of each subject.
func control() func(subject string) string {
	data, _ := os.ReadFile(filepath.Join(dir, "control"))
	f := strings.Fields(string(data))
	return func(subject string) string { return modeOf(f, subject) }
}

func modeOf(f []string, subject string) string {
	switch {
	case len(f) == 0:
		return "up"
	case len(f) > 1 && f[1] != subject:
		return "up"
	}
	return f[0]
}

type ev struct {
	ID, Subject string
	line        []byte
}

func main() {
	if os.Getenv("PLUGIN_SLEEPER") != "" { // the escaped child: holds its stdin, reads nothing
		time.Sleep(time.Minute)
		return
	}
	appendTo("starts", strconv.Itoa(os.Getpid()))
	starts, _ := os.ReadFile(filepath.Join(dir, "starts"))
	first := strings.Count(string(starts), "\n") == 1
	_ = os.WriteFile(filepath.Join(dir, "env"), []byte(strings.Join(os.Environ(), "\n")), 0o644)
	if s := os.Getenv("PLUGIN_STDERR"); s != "" {
		fmt.Fprintln(os.Stderr, s)
	}
	if first && os.Getenv("PLUGIN_ESCAPE") != "" {
		child := exec.Command(os.Args[0])
		child.Env = append(os.Environ(), "PLUGIN_SLEEPER=1")
		child.Stdin = os.Stdin
		child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := child.Start(); err != nil {
			panic(err)
		}
		appendTo("escaped", strconv.Itoa(child.Process.Pid))
		time.Sleep(time.Hour) // reads nothing: the bridge's writes fill the pipe
	}
	crashAt, _ := strconv.Atoi(os.Getenv("PLUGIN_CRASH_AT"))
	garbageAt, _ := strconv.Atoi(os.Getenv("PLUGIN_GARBAGE_AT"))
	closeStdoutAt, _ := strconv.Atoi(os.Getenv("PLUGIN_CLOSE_STDOUT_AT"))
	mute := first && os.Getenv("PLUGIN_MUTE") != ""
	delay, _ := time.ParseDuration(os.Getenv("PLUGIN_DELAY"))

	lines := make(chan []byte)
	go func() {
		r := bufio.NewReaderSize(os.Stdin, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				lines <- line
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	answer := func(e ev, mode string) {
		a := map[string]any{"id": e.ID, "ok": true}
		switch mode {
		case "down":
			a = map[string]any{"id": e.ID, "ok": false, "error": "down for maintenance"}
		case "refuse":
			a = map[string]any{"id": e.ID, "ok": false, "error": "refused", "permanent": true}
		case "throttle":
			a = map[string]any{"id": e.ID, "ok": false, "error": "slow down", "retryAfter": os.Getenv("PLUGIN_RETRY_AFTER")}
		case "up":
			appendTo("received.jsonl", strings.TrimSpace(string(e.line)))
		}
		// Recorded before it is sent: once the sink has the answer, the
		// test finds it here.
		appendTo("answers", fmt.Sprintf("%d %s %v", time.Now().UnixNano(), e.ID, a["ok"]))
		b, _ := json.Marshal(a)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	var held []ev
	n := 0
	tick := time.NewTicker(5 * time.Millisecond)
	eof := false
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				eof, lines = true, nil
				appendTo("eof", "")
				break
			}
			n++
			var e ev
			if err := json.Unmarshal(line, &e); err != nil {
				fmt.Fprintln(os.Stderr, "bad event line:", err)
				os.Exit(2)
			}
			e.line = line
			appendTo("trace", fmt.Sprintf("%d %s", time.Now().UnixNano(), e.ID))
			if first && n == crashAt {
				os.Exit(3)
			}
			if first && n == garbageAt {
				out.WriteString("this is not an answer\n")
				out.Flush()
				continue
			}
			if first && n == closeStdoutAt {
				os.Stdout.Close()
				mute = true
			}
			if mute {
				continue
			}
			switch mode := control()(e.Subject); mode {
			case "hold":
				appendTo("received.jsonl", strings.TrimSpace(string(line)))
				held = append(held, e)
			default:
				time.Sleep(delay)
				answer(e, mode)
			}
		case <-tick.C:
		}
		var still []ev
		modes := control()
		for _, e := range slices.Backward(held) {
			if mode := modes(e.Subject); mode != "hold" {
				if mode == "up" {
					mode = "taken" // appended to received.jsonl already
				}
				answer(e, mode)
			} else {
				still = append([]ev{e}, still...)
			}
		}
		held = still
		if eof && len(held) == 0 && os.Getenv("PLUGIN_IGNORE_EOF") == "" {
			return
		}
	}
}

package testenv_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// A stalled proxy forwards nothing either way and keeps the connections;
// on Resume everything written meanwhile arrives, in order, with nothing
// lost (a client that wrote and closed during the stall included), and a
// connection made during the stall reaches the server only then.
func TestProxyStallsAndResumes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	p := testenv.StartProxy(t, ln.Addr().String())
	if _, err := testenv.NewProxy("10.1.2.3:4222"); err == nil {
		t.Error("a proxy to a non-loopback address was made")
	}

	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	accept := func(within time.Duration) net.Conn {
		select {
		case c := <-accepted:
			t.Cleanup(func() { c.Close() })
			return c
		case <-time.After(within):
			return nil
		}
	}
	write := func(c net.Conn, s string) {
		t.Helper()
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(c net.Conn, n int) string {
		t.Helper()
		buf := make([]byte, n)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatalf("reading %d bytes: %v", n, err)
		}
		return string(buf)
	}
	silent := func(c net.Conn, what string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		var b [1]byte
		if n, err := c.Read(b[:]); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: read %d bytes (%v) through a stalled link", what, n, err)
		}
	}

	client := dial()
	server := accept(10 * time.Second)
	if server == nil {
		t.Fatal("the proxy did not connect to the server")
	}
	write(client, "ping")
	if got := read(server, 4); got != "ping" {
		t.Fatalf("server read %q", got)
	}
	write(server, "pong")
	if got := read(client, 4); got != "pong" {
		t.Fatalf("client read %q", got)
	}

	p.Stall()
	if !p.Stalled() {
		t.Fatal("Stalled() = false after Stall")
	}
	// More than the socket buffers hold (Linux's loopback autotuning goes
	// up to 32 MiB received + 4 MiB sent): the writer is pushed back, and
	// every byte still arrives after Resume.
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20) // 64 MiB
	wrote := make(chan error, 1)
	go func() { _, err := client.Write(big); wrote <- err }()
	write(server, "late answer")
	testenv.Eventually(t, 10*time.Second, "the proxy to hold what the client wrote", func() bool { return p.Held() > 0 })
	silent(server, "server")
	silent(client, "client")
	select {
	case err := <-wrote:
		t.Fatalf("a 64 MiB write completed through a stalled link (%v): something buffered it away", err)
	default:
	}
	late := dial() // connected while stalled: not to the server yet
	if c := accept(300 * time.Millisecond); c != nil {
		t.Fatal("a connection made while stalled reached the server")
	}
	write(late, "hello")
	closing := dial() // ... and one whose client writes and closes meanwhile
	write(closing, "last words")
	closing.Close()

	p.Resume()
	if p.Stalled() {
		t.Fatal("Stalled() = true after Resume")
	}
	whole := make([]byte, len(big))
	_ = server.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(server, whole); err != nil || !bytes.Equal(whole, big) {
		t.Fatal("the server did not get the client's bytes whole and in order after Resume")
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the client's write: %v", err)
	}
	if got := read(client, len("late answer")); got != "late answer" {
		t.Fatalf("client read %q after Resume", got)
	}
	got := map[string]bool{}
	for range 2 {
		c := accept(10 * time.Second)
		if c == nil {
			t.Fatal("the connections made while stalled did not reach the server after Resume")
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var data []byte
		for string(data) != "hello" && string(data) != "last words" {
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			data = append(data, buf[:n]...)
			if err != nil {
				break
			}
		}
		got[string(data)] = true
	}
	if !got["hello"] || !got["last words"] {
		t.Fatalf("after Resume the server got %v from the connections made while stalled; want hello and last words", got)
	}
	if p.Held() != 0 {
		t.Errorf("Held() = %d after everything was forwarded", p.Held())
	}

	// Close ends the connections.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := client.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after Close the client's connection is open (read %d, %v)", n, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

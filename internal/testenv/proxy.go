package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy on 127.0.0.1 that a test owns, between its clients
// (e.g. one bridge replica) and one server (e.g. NATS): a link the test
// can partition. Stall stops forwarding in both directions and keeps every
// socket open; nothing is dropped: what a side wrote meanwhile waits (in
// the proxy's hands or the kernel's socket buffers, which then push back
// on the writer) and is delivered after Resume, as a partition that heals
// delivers what was in flight. A connection accepted while stalled is
// connected to the server only after Resume. Close ends every connection.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	resume  chan struct{} // closed while the link is up; a fresh one while stalled
	conns   map[net.Conn]struct{}
	closed  bool
	closing chan struct{} // closed by Close: stalled pumps give up
	wg      sync.WaitGroup

	held atomic.Int64 // bytes clients wrote that the proxy read and has not forwarded yet
}

// StartProxy starts a proxy to target (host:port) for one test, closed
// when it ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatalf("starting a proxy to %s: %v", target, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// NewProxy listens on a loopback port and forwards each connection to
// target, which must be a loopback address too. The caller must call Close.
func NewProxy(target string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, errors.New("testenv: the proxy forwards to loopback addresses only, not " + target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	up := make(chan struct{})
	close(up)
	p := &Proxy{ln: ln, target: target, resume: up, conns: map[net.Conn]struct{}{}, closing: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port, where clients connect.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall stops forwarding in both directions, keeping the sockets open.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.resume:
		p.resume = make(chan struct{})
	default: // stalled already
	}
}

// Resume forwards again, first what waited during the stall.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.resume:
	default:
		close(p.resume)
	}
}

// Stalled reports whether the link is stalled.
func (p *Proxy) Stalled() bool {
	select {
	case <-p.gate():
		return false
	default:
		return true
	}
}

// Held is how many bytes clients wrote that the proxy has read and not yet
// forwarded to the server: above 0 while stalled, a client connected
// before the stall wrote into the stalled link. (Beyond the first 32 KiB
// per connection, the rest waits in the kernel's socket buffers.)
func (p *Proxy) Held() int { return int(p.held.Load()) }

// Close stops listening and ends every connection, what waits in a stall
// included. Safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closing)
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resume
}

// wait blocks while the link is stalled; false once the proxy is closed.
func (p *Proxy) wait() bool {
	select {
	case <-p.gate():
		return true
	case <-p.closing:
		return false
	}
}

// track registers c so that Close ends it; false if closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(client) {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve connects client to the server (once the link is up) and forwards
// both ways until both sides have finished.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if !p.wait() {
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return // the client sees its connection closed, as a refused one
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pump(server, client, true) }()
	go func() { defer both.Done(); p.pump(client, server, false) }()
	both.Wait()
}

// pump copies src to dst. It reads whatever the link's state (at most one
// buffer, which it holds while stalled: the rest waits in the kernel and
// pushes back on the writer) and passes nothing on, data or end, until
// the link is up. At src's end it half-closes dst, so that what src sent
// before closing arrives first; on an error it ends both.
func (p *Proxy) pump(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if fromClient {
			p.held.Add(int64(n))
		}
		up := p.wait()
		if up && n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if fromClient {
			p.held.Add(-int64(n))
		}
		switch {
		case !up:
			return // closed
		case err == nil:
			continue
		case errors.Is(err, io.EOF):
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
				return
			}
		}
		_ = src.Close()
		_ = dst.Close()
		return
	}
}

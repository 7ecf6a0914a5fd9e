package framework

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Path is the network path between a client and an address: a TCP
// forwarder on loopback whose far end the test chooses, as whoever holds
// the network between them (a man in the middle) would. Route closes the
// connections forwarded so far, so the next request dials the new far
// end.
type Path struct {
	ln    net.Listener
	mu    sync.Mutex
	to    string
	conns []net.Conn
}

// NewPath listens on a free loopback port and forwards every connection
// to the address to; it stops when the test ends.
func NewPath(t testing.TB, to string) *Path {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Path{ln: ln, to: to}
	t.Cleanup(func() { _ = ln.Close(); p.Route("") })
	go p.serve()
	return p
}

// Addr is the host:port that clients dial.
func (p *Path) Addr() string { return p.ln.Addr().String() }

// Route sends the connections made from now on to the address to and
// closes the ones forwarded so far.
func (p *Path) Route(to string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.to = to
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *Path) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		to := p.to
		p.mu.Unlock()
		far, err := net.Dial("tcp", to)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, far)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(far, c); _ = far.Close() }()
		go func() { _, _ = io.Copy(c, far); _ = c.Close() }()
	}
}

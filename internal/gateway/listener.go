package gateway

import (
	"net"
	"net/netip"
	"sync"
)

// LimitPerIP wraps l so that one client holds at most n of its
// connections at once: a further one is closed as it is accepted. One
// client cannot take every connection the gateway allows (a slow
// client's request holds its connection). A client is an IPv4 address,
// or an IPv6 /64 (what one host is given).
func LimitPerIP(l net.Listener, n int) net.Listener {
	return &perIP{Listener: l, n: n, open: map[string]int{}}
}

type perIP struct {
	net.Listener
	n    int
	mu   sync.Mutex
	open map[string]int
}

func (l *perIP) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := client(c.RemoteAddr())
		l.mu.Lock()
		if l.open[ip] >= l.n {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

func (l *perIP) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
}

// countedConn gives its place back once, when it is closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// client is the client an address counts against: its IPv4 address, or
// its IPv6 /64.
func client(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

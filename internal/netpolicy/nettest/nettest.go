// Package nettest makes the loopback endpoints that the tests of R17 dial
// to prove that failures at private addresses look alike: a closed port,
// a host that accepts and never answers, and a TLS server whose
// certificate no client trusts.
package nettest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// ClosedAddr returns host:port of a loopback port nothing listens on.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// SilentAddr returns host:port of a loopback listener that accepts
// connections and never writes; it and its connections close with t.
func SilentAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// UntrustedURL returns the https URL of a loopback TLS server whose
// certificate no client of the test trusts; it closes with t.
func UntrustedURL(t testing.TB) string {
	t.Helper()
	s := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(s.Close)
	return s.URL
}

package gateway

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func TestLimitPerIP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := LimitPerIP(l, 2)
	defer ll.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ll.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b, c := dial(), dial(), dial()
	defer a.Close()
	defer b.Close()
	first, second := <-accepted, <-accepted
	// The third from the same address is closed at once.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a third connection from one address: %v, want it closed", err)
	}
	// One closed gives its place back.
	_ = first.Close()
	d := dial()
	defer d.Close()
	select {
	case got := <-accepted:
		_ = got.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a place given back was not taken")
	}
	_ = second.Close()
}

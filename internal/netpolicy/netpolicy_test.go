package netpolicy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
)

func TestCheck(t *testing.T) {
	kcp := netip.MustParseAddrPort("10.0.0.5:6443")
	p := New([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32")}, []netip.AddrPort{kcp, netip.MustParseAddrPort("[::ffff:127.0.0.1]:9443")})
	for _, tc := range []struct {
		addr  string
		allow bool
	}{
		{"93.184.216.34:443", true},            // public
		{"[2606:4700::1111]:443", true},        // public IPv6
		{"10.1.2.3:6443", true},                // allowed private range
		{"127.0.0.1:6443", true},               // allowed loopback address
		{"127.0.0.2:6443", false},              // loopback outside the allowed range
		{"[::1]:443", false},                   // IPv6 loopback not allowed
		{"192.168.1.1:443", false},             // private, not allowed
		{"172.16.0.1:443", false},              // private, not allowed
		{"100.64.0.1:443", false},              // shared (CGNAT), not allowed
		{"[fd12::1]:443", false},               // unique local, not allowed
		{"169.254.169.254:80", false},          // metadata
		{"[fd00:ec2::254]:80", false},          // AWS IPv6 metadata
		{"[fe80::1]:443", false},               // link-local
		{"[::ffff:169.254.169.254]:80", false}, // mapped metadata
		{"0.0.0.0:443", false},                 // unspecified
		{"[::]:443", false},                    // unspecified
		{"0.1.2.3:443", false},                 // this network
		{"224.0.0.1:443", false},               // multicast
		{"255.255.255.255:443", false},         // broadcast
		{"10.0.0.5:6443", false},               // reserved: kcp
		{"10.0.0.5:6444", true},                // same host, other port
		{"127.0.0.1:9443", false},              // reserved (given as a mapped address)
		{"[::ffff:10.0.0.5]:6443", false},      // reserved, mapped form
	} {
		err := p.Check(netip.MustParseAddrPort(tc.addr))
		if (err == nil) != tc.allow {
			t.Errorf("%s: %v, want allowed=%v", tc.addr, err, tc.allow)
		}
		if err != nil && !errors.Is(err, ErrDenied) {
			t.Errorf("%s: %v is not ErrDenied", tc.addr, err)
		}
	}
	var none *Policy
	if none.Check(netip.MustParseAddrPort("127.0.0.1:1")) == nil || none.Check(netip.MustParseAddrPort("8.8.8.8:53")) != nil {
		t.Error("a nil policy must allow public addresses only")
	}
}

func TestAllowsHost(t *testing.T) {
	p := New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	for host, want := range map[string]bool{"127.0.0.1": true, "localhost": true, "[::1]": false, "10.0.0.1": false, "pds.example.com": false, "127.0.0.1.nip.io": false} {
		if got := p.AllowsHost(host); got != want {
			t.Errorf("AllowsHost(%q) = %v, want %v", host, got, want)
		}
	}
	if (*Policy)(nil).AllowsHost("127.0.0.1") {
		t.Error("a nil policy allows no host")
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes(" 127.0.0.1, 10.0.0.0/8,192.168.0.0/16, fd00::/8 ,")
	if err != nil || len(got) != 4 || got[0].String() != "127.0.0.1/32" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"0.0.0.0/0", "169.254.0.0/16", "8.8.8.0/24", "10.0.0.0/7", "::/0", "not-an-ip", "127.0.0.1/33", "::ffff:10.0.0.0/104"} {
		if _, err := ParsePrefixes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDialerRefusesAtDialTime: a name that resolves to a refused address
// is refused after resolution (what DNS rebinding would exploit), and no
// connection reaches the listener.
func TestDialerRefusesAtDialTime(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	c := &http.Client{Transport: &http.Transport{DialContext: (*Policy)(nil).Dialer(0).DialContext}, CheckRedirect: NoRedirects}
	_, err := c.Get("http://localhost:" + port + "/")
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("dial of localhost: %v, want ErrDenied", err)
	}
	if hits.Load() != 0 {
		t.Fatal("a refused dial reached the listener")
	}
	allowed := New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	c.Transport = allowed.Transport()
	if resp, err := c.Get("http://localhost:" + port + "/"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if hits.Load() != 1 {
		t.Fatal("an allowed dial did not reach the listener")
	}
}

func TestResolve(t *testing.T) {
	got, err := Resolve(context.Background(), "https://127.0.0.1:6443/clusters/root")
	if err != nil || len(got) != 1 || got[0].String() != "127.0.0.1:6443" {
		t.Fatalf("%v %v", got, err)
	}
	if got, err = Resolve(context.Background(), "https://127.0.0.1"); err != nil || got[0].Port() != 443 {
		t.Fatalf("%v %v", got, err)
	}
	got, err = Resolve(context.Background(), "0.0.0.0:9443")
	if err != nil || len(got) < 2 || got[0].String() != "127.0.0.1:9443" {
		t.Fatalf("unspecified: %v %v", got, err)
	}
}

func TestPrivate(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "10.1.2.3": true, "192.168.0.1": true, "100.64.0.1": true, "::1": true, "fd00::1": true,
		"::ffff:10.0.0.1": true, "64:ff9b::a00:1": true, // IPv4-mapped, NAT64 of 10.0.0.1
		"8.8.8.8": false, "2001:4860:4860::8888": false,
	} {
		if got := Private(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Private(%s) = %v, want %v", addr, got, want)
		}
	}
}

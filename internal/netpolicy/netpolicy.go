// Package netpolicy is the one address policy every outbound connection of
// knotless passes (rule R18): tenant apiservers reached by the mount proxy,
// PDSes and firehoses reached by the provider. It is checked at dial time
// (net.Dialer.Control), after name resolution, so a DNS name that resolves
// to a forbidden address (DNS rebinding) is refused as well.
//
// Always refused: unspecified, multicast, broadcast and link-local
// addresses (which include cloud metadata endpoints such as
// 169.254.169.254), the "this network" range, the IPv6 metadata address of
// AWS (fd00:ec2::254), and the addresses the operator reserved (kcp's,
// kcp-front-proxy's and the mount proxy's own). Loopback, private
// (RFC 1918, fc00::/7) and shared (100.64.0.0/10) addresses are refused
// unless the operator allowed a range that contains them. Every other
// (public) address is allowed.
package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrDenied is wrapped by every refusal of the policy.
var ErrDenied = errors.New("address not allowed")

// DeniedError is a refused address. Its message names only the address
// the caller dialled (which the caller chose): which rule refused it
// (Reason, for the operator's logs) would tell a tenant where kcp, the
// shim or the allowed ranges are (R17).
type DeniedError struct {
	Addr   netip.AddrPort
	Reason string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("address %s is not allowed by the operator's address policy", e.Addr)
}

func (e *DeniedError) Unwrap() error { return ErrDenied }

// Policy decides which addresses may be dialled. The zero value allows
// public addresses only. A Policy is immutable and safe for concurrent use.
type Policy struct {
	allowed []netip.Prefix
	// reserved are exact addresses.
	reserved []netip.AddrPort
}

// New returns a policy that also allows the loopback, private and shared
// addresses inside allowed, and refuses the reserved addresses.
func New(allowed []netip.Prefix, reserved []netip.AddrPort) *Policy {
	p := &Policy{}
	for _, a := range allowed {
		p.allowed = append(p.allowed, a.Masked())
	}
	for _, r := range reserved {
		p.reserved = append(p.reserved, netip.AddrPortFrom(r.Addr().Unmap(), r.Port()))
	}
	return p
}

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	shared      = netip.MustParsePrefix("100.64.0.0/10")
	broadcast   = netip.MustParseAddr("255.255.255.255")
	// never are special-purpose ranges no outbound connection of knotless
	// has a reason to reach: IANA's special-purpose IPv4 ranges, and cloud
	// metadata endpoints outside link-local (AWS IPv6, Azure WireServer,
	// Alibaba, which sits inside the shared range an operator may allow).
	never = []netip.Prefix{
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("198.18.0.0/15"),
		netip.MustParsePrefix("198.51.100.0/24"),
		netip.MustParsePrefix("203.0.113.0/24"),
		netip.MustParsePrefix("240.0.0.0/4"),
		netip.MustParsePrefix("fd00:ec2::254/128"),
		netip.MustParsePrefix("168.63.129.16/32"),
		netip.MustParsePrefix("100.100.100.200/32"),
	}
	// embedding are IPv6 ranges that carry an IPv4 address in their last
	// 32 bits (NAT64, IPv4-compatible); 6to4 carries it in bits 16-47.
	embedding = []netip.Prefix{
		netip.MustParsePrefix("64:ff9b::/96"),
		netip.MustParsePrefix("64:ff9b:1::/48"),
		netip.MustParsePrefix("::/96"),
	}
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// embedded returns the IPv4 address an IPv6 address carries (NAT64,
// IPv4-compatible, 6to4), so that the IPv4 rules apply to it.
func embedded(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() || ip.Is4In6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	for _, p := range embedding {
		if p.Contains(ip) && !ip.IsUnspecified() && !ip.IsLoopback() {
			return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
		}
	}
	if sixToFour.Contains(ip) {
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// Check returns a *DeniedError when addr may not be dialled.
func (p *Policy) Check(addr netip.AddrPort) error {
	ip := addr.Addr().Unmap()
	addr = netip.AddrPortFrom(ip, addr.Port())
	deny := func(reason string) error { return &DeniedError{Addr: addr, Reason: reason} }
	if v4, ok := embedded(ip); ok {
		if err := p.Check(netip.AddrPortFrom(v4, addr.Port())); err != nil {
			return deny("an IPv6 address that embeds a refused IPv4 address")
		}
		ip = v4
	}
	switch {
	case !ip.IsValid():
		return deny("not an IP address")
	case ip.IsUnspecified(), thisNetwork.Contains(ip), ip == broadcast, ip.IsMulticast():
		return deny("unspecified, broadcast or multicast addresses are never dialled")
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return deny("link-local and metadata addresses are never dialled")
	}
	for _, n := range never {
		if n.Contains(ip) {
			return deny("special-purpose and metadata addresses are never dialled")
		}
	}
	if p == nil {
		p = &Policy{}
	}
	for _, r := range p.reserved {
		if r == addr {
			return deny("the address is reserved by the operator")
		}
	}
	if Private(ip) {
		for _, a := range p.allowed {
			if a.Contains(ip) {
				return nil
			}
		}
		return deny("loopback and private addresses are allowed only in ranges the operator allows")
	}
	return nil
}

// TracePrivate returns ctx with an HTTP client trace that sets private
// when a request made with it attempts a connection to a Private address
// or is sent on a kept-alive connection to one: a caller may then report
// its failure without the detail that would tell a closed port, a silent
// host, a bad certificate and a server's answer apart (R17).
func TracePrivate(ctx context.Context, private *atomic.Bool) context.Context {
	mark := func(addr string) {
		if ap, err := netip.ParseAddrPort(addr); err == nil && Private(ap.Addr()) {
			private.Store(true)
		}
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(_, addr string) { mark(addr) },
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Conn != nil && info.Conn.RemoteAddr() != nil {
				mark(info.Conn.RemoteAddr().String())
			}
		},
	})
}

// Private reports whether addr is a loopback, private or shared address
// (or an IPv6 address that embeds one): an address knotless reaches only
// because the operator allowed its range. What a connection to it found
// (refused, no answer, which certificate) is the operator's to know, not a
// caller's (R17).
func Private(addr netip.Addr) bool {
	ip := addr.Unmap()
	if v4, ok := embedded(ip); ok {
		ip = v4
	}
	return ip.IsLoopback() || ip.IsPrivate() || shared.Contains(ip)
}

// AllowsHost reports whether host (an IP literal, or "localhost") lies in a
// range the operator allowed; names other than localhost are never
// "allowed hosts". It decides whether plain http may carry credentials to
// a host (R19).
func (p *Policy) AllowsHost(host string) bool {
	if p == nil {
		return false
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	var ips []netip.Addr
	if host == "localhost" {
		ips = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	} else if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	}
	for _, ip := range ips {
		for _, a := range p.allowed {
			if a.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// Control is a net.Dialer.Control function that enforces the policy on
// the resolved address of every connection attempt.
func (p *Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &DeniedError{Reason: "not an IP address and port: " + address}
	}
	return p.Check(ap)
}

// Dialer returns a dialer that enforces the policy.
func (p *Policy) Dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second, Control: p.Control}
}

// Transport returns a clone of http.DefaultTransport that dials through
// the policy and takes no proxy from the environment (a proxy would dial
// for it).
func (p *Policy) Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = p.Dialer(10 * time.Second).DialContext
	return tr
}

// ParsePrefixes parses a comma-separated list of CIDR ranges or single IP
// addresses (an operator flag); only loopback, private and shared ranges
// make sense there, and others are refused so a typo cannot open the
// policy to link-local or metadata addresses.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pr, err := netip.ParsePrefix(f)
		if err != nil {
			ip, ierr := netip.ParseAddr(f)
			if ierr != nil {
				return nil, fmt.Errorf("%q is neither a CIDR range nor an IP address", f)
			}
			pr = netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())
		}
		if pr.Addr().Is4In6() {
			return nil, fmt.Errorf("%q: write IPv4 ranges as IPv4 (addresses are checked unmapped)", f)
		}
		ip := pr.Masked().Addr()
		if !(ip.IsLoopback() || ip.IsPrivate() || shared.Contains(ip)) || pr.Bits() < minBits(ip) {
			return nil, fmt.Errorf("%q: only loopback, private and shared ranges (inside 127.0.0.0/8, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, ::1, fc00::/7) can be allowed", f)
		}
		out = append(out, pr.Masked())
	}
	return out, nil
}

// minBits is the widest range of ip's kind that may be allowed.
func minBits(ip netip.Addr) int {
	switch {
	case ip.Is6() && ip.IsLoopback():
		return 128
	case ip.Is6():
		return 7
	case ip.IsLoopback(), ip.As4()[0] == 10:
		return 8
	case ip.As4()[0] == 172:
		return 12
	case ip.As4()[0] == 100:
		return 10
	}
	return 16
}

// Resolve returns the addresses of a URL's or host:port's host with its
// port (the scheme's default when the URL has none), for reserving them.
// An unspecified host (a listener on 0.0.0.0 or ::) stands for every
// address of this machine's interfaces.
func Resolve(ctx context.Context, target string) ([]netip.AddrPort, error) {
	host, port := target, ""
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		host, port = u.Hostname(), u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443", "ws": "80", "wss": "443"}[u.Scheme]
		}
	} else if h, p, err := net.SplitHostPort(target); err == nil {
		host, port = h, p
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%q has no port", target)
	}
	if ip, err := netip.ParseAddr(host); err == nil && !ip.IsUnspecified() {
		return []netip.AddrPort{netip.AddrPortFrom(ip.Unmap(), uint16(pn))}, nil
	}
	if host == "" || strings.Trim(host, "[]:0.") == "" {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, err
		}
		out := []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(pn)), netip.AddrPortFrom(netip.IPv6Loopback(), uint16(pn))}
		for _, a := range addrs {
			if pr, err := netip.ParsePrefix(a.String()); err == nil {
				out = append(out, netip.AddrPortFrom(pr.Addr().Unmap(), uint16(pn)))
			}
		}
		return out, nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", host, err)
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(pn)))
	}
	return out, nil
}

// NoRedirects is an http.Client CheckRedirect function: no client of
// knotless follows a redirect (R18); the 3xx response itself is returned.
func NoRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

package mountproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// fixture is a running shim with its CAs, a requestheader client (what
// kcp-front-proxy presents) and a recording tenant.
type fixture struct {
	t        *testing.T
	dir      string
	servingC *framework.CA
	headerCA *framework.CA
	tenantCA *framework.CA
	registry *Registry
	addr     string
	proxy    tls.Certificate // kcp-front-proxy's client certificate
	tenant   *recordingTenant
}

type recordingTenant struct {
	srv *http.Server
	url *url.URL
	mu  sync.Mutex
	got []*http.Request
}

func (rt *recordingTenant) requests() []*http.Request {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return append([]*http.Request(nil), rt.got...)
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) writeServing(ca *framework.CA) {
	f.t.Helper()
	c, err := ca.Issue("mountproxy", "127.0.0.1")
	if err != nil {
		f.t.Fatal(err)
	}
	cp, kp, err := framework.PEMs(c)
	if err != nil {
		f.t.Fatal(err)
	}
	writeFile(f.t, filepath.Join(f.dir, "serving.crt"), cp)
	writeFile(f.t, filepath.Join(f.dir, "serving.key"), kp)
}

func newCA(t *testing.T, name string) *framework.CA {
	t.Helper()
	ca, err := framework.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *framework.CA, name string, hosts ...string) tls.Certificate {
	t.Helper()
	c, err := ca.Issue(name, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startTenant serves handler over TLS with a certificate from ca and
// records every request.
func startTenant(t *testing.T, ca *framework.CA, handler http.HandlerFunc) *recordingTenant {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rt := &recordingTenant{url: &url.URL{Scheme: "https", Host: ln.Addr().String()}}
	cert := issue(t, ca, "tenant", "127.0.0.1")
	rt.srv = &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rt.mu.Lock()
			rt.got = append(rt.got, r.Clone(context.Background()))
			rt.mu.Unlock()
			handler(w, r)
		}),
	}
	go func() { _ = rt.srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = rt.srv.Close() })
	return rt
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "query": r.URL.RawQuery, "user": r.Header.Get("Impersonate-User")})
}

func pool(ca *framework.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func newFixture(t *testing.T, handler http.HandlerFunc) *fixture {
	t.Helper()
	return newFixtureWith(t, handler, func(*Options) {})
}

// newFixtureWith lets the test change the shim's options.
func newFixtureWith(t *testing.T, handler http.HandlerFunc, change func(*Options)) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), servingC: newCA(t, "serving"), headerCA: newCA(t, "requestheader"), tenantCA: newCA(t, "tenant")}
	f.writeServing(f.servingC)
	writeFile(t, filepath.Join(f.dir, "requestheader-ca.crt"), f.headerCA.PEM)
	f.proxy = issue(t, f.headerCA, "kcp-front-proxy")
	f.tenant = startTenant(t, f.tenantCA, handler)
	opts := Options{
		Files:        Files{ServingCert: filepath.Join(f.dir, "serving.crt"), ServingKey: filepath.Join(f.dir, "serving.key"), RequestHeaderCA: filepath.Join(f.dir, "requestheader-ca.crt")},
		AllowedNames: []string{"kcp-front-proxy"},
		Registry:     NewRegistry(t.Context(), RegistryOptions{Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)}),
		Authorizer:   enterIfNotMallory,
		Headers:      Headers{User: testUser, Group: testGroup, ExtraPrefix: testExtra},
		ReloadEvery:  10 * time.Millisecond,
	}
	change(&opts)
	f.registry = opts.Registry
	if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: f.tenant.url, CA: pool(f.tenantCA), Credential: mount.Credential{Token: "tenant-token"}}); err != nil {
		t.Fatal(err)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// client returns an HTTP client that trusts the shim's serving CA and
// presents cert (none when nil).
func (f *fixture) client(cert *tls.Certificate, servingCA *framework.CA) *http.Client {
	cfg := &tls.Config{RootCAs: pool(servingCA)}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

func (f *fixture) get(c *http.Client, path string, header http.Header) (*http.Response, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://"+f.addr+path, nil)
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The fixture's identity header names (what kcp-front-proxy's mapping and
// the shim share).
const (
	testUser  = "X-Knotless-0123456789abcdef-User"
	testGroup = "X-Knotless-fedcba9876543210-Group"
	testExtra = "X-Knotless-a1b2c3d4e5f60718-Extra-"
)

func alice() http.Header {
	return http.Header{testUser: {"alice"}, testGroup: {"devs", "system:authenticated"}}
}

// enterIfNotMallory lets everyone but mallory enter every workspace.
var enterIfNotMallory = AuthorizerFunc(func(_ context.Context, _ string, c *Caller) (bool, error) {
	return c.User != "mallory", nil
})

func TestOnlyTheProxyCertificateMayAssertAnIdentity(t *testing.T) {
	f := newFixture(t, echoHandler)
	other := newCA(t, "other")
	otherCert := issue(t, other, "kcp-front-proxy")
	stranger := issue(t, f.headerCA, "someone-else")
	for _, tc := range []struct {
		name   string
		cert   *tls.Certificate
		header http.Header
		path   string
		code   int
		reason string
	}{
		{"no client certificate, spoofed X-Remote-User", nil, alice(), "/tenants/ws-a/shop/api", 401, ReasonNoClientCertificate},
		{"certificate from another CA", &otherCert, alice(), "/tenants/ws-a/shop/api", 401, ReasonUntrustedClient},
		{"requestheader CA but a name not allowed", &stranger, alice(), "/tenants/ws-a/shop/api", 403, ReasonNameNotAllowed},
		{"no identity", &f.proxy, nil, "/tenants/ws-a/shop/api", 401, ReasonNoIdentity},
		{"another workspace's path", &f.proxy, alice(), "/tenants/ws-b/shop/api", 404, ReasonUnknownTenant},
		{"not a tenant path", &f.proxy, alice(), "/api/v1/namespaces", 404, ReasonUnknownPath},
		{"path traversal", &f.proxy, alice(), "/tenants/ws-a/shop/../../ws-b/shop", 404, ReasonUnknownPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.get(f.client(tc.cert, f.servingC), tc.path, tc.header)
			if resp.StatusCode != tc.code || resp.Header.Get(ReasonHeader) != tc.reason || !strings.Contains(body, tc.reason) {
				t.Fatalf("got %d %q: %s; want %d %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body, tc.code, tc.reason)
			}
		})
	}
	if n := len(f.tenant.requests()); n != 0 {
		t.Fatalf("%d refused requests reached the tenant", n)
	}
}

func TestForwardsAsTheCallerWithNoCallerCredentials(t *testing.T) {
	f := newFixture(t, echoHandler)
	h := alice()
	h.Set("Authorization", "Bearer caller-token")
	h.Set("Impersonate-User", "system:admin")
	h.Add("Impersonate-Group", "system:masters")
	h.Set(testExtra+"Scopes", "read")
	h.Set("X-Remote-Extra-Spoofed", "yes")
	resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/api/v1/namespaces?watch=true&limit=5", h)
	if resp.StatusCode != 200 || resp.Header.Get(ReasonHeader) != "" {
		t.Fatalf("got %d: %s", resp.StatusCode, body)
	}
	reqs := f.tenant.requests()
	if len(reqs) != 1 {
		t.Fatalf("tenant got %d requests", len(reqs))
	}
	got := reqs[0]
	if got.URL.Path != "/api/v1/namespaces" || got.URL.RawQuery != "watch=true&limit=5" {
		t.Fatalf("tenant saw %s?%s", got.URL.Path, got.URL.RawQuery)
	}
	if a := got.Header.Get("Authorization"); a != "Bearer tenant-token" {
		t.Fatalf("Authorization at the tenant %q, want the tenant credential only", a)
	}
	if u, g := got.Header.Get("Impersonate-User"), got.Header.Values("Impersonate-Group"); u != "alice" || strings.Join(g, ",") != "devs,system:authenticated" {
		t.Fatalf("impersonating %q %v, want alice and her groups", u, g)
	}
	if e := got.Header.Get("Impersonate-Extra-Scopes"); e != "read" {
		t.Fatalf("extra %q", e)
	}
	for name := range got.Header {
		if strings.HasPrefix(http.CanonicalHeaderKey(name), "X-Remote-") {
			t.Fatalf("header %s reached the tenant", name)
		}
	}
}

// TestTenantCertificateIsVerifiedAgainstItsCAOnly: nothing reaches a
// tenant whose certificate does not verify against its CA bundle.
func TestTenantCertificateIsVerifiedAgainstItsCAOnly(t *testing.T) {
	f := newFixture(t, echoHandler)
	impostor := startTenant(t, newCA(t, "impostor"), echoHandler)
	if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: impostor.url, CA: pool(f.tenantCA), Credential: mount.Credential{Token: "t"}}); err != nil {
		t.Fatal(err)
	}
	resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/version", alice())
	if resp.StatusCode != 502 {
		t.Fatalf("got %d %s: %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body)
	}
	if len(impostor.requests()) != 0 {
		t.Fatal("a request reached a tenant whose certificate did not verify")
	}
}

// TestPrivateTenantFailuresLookAlike (issue 27 item 6, R17): for a tenant
// at a private address (here loopback, which the fixture's operator
// allows) a certificate that does not verify, a listener that does not
// speak TLS and a closed port are one answer, TenantUnreachable with one
// message, so a TenantCluster cannot scan the operator's networks; the
// distinction is kept for public addresses (ClassifyForwardError).
func TestPrivateTenantFailuresLookAlike(t *testing.T) {
	f := newFixture(t, echoHandler)
	impostor := startTenant(t, newCA(t, "impostor"), echoHandler)
	plain := httptest.NewServer(http.HandlerFunc(echoHandler))
	t.Cleanup(plain.Close)
	closed := httptest.NewServer(http.HandlerFunc(echoHandler))
	closed.Close()
	answers := map[string]string{}
	for name, u := range map[string]string{"bad certificate": impostor.url.String(), "not TLS": plain.URL, "closed port": closed.URL} {
		tu, _ := url.Parse(strings.Replace(u, "http://", "https://", 1))
		if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: tu, CA: pool(f.tenantCA), Credential: mount.Credential{Token: "t"}}); err != nil {
			t.Fatal(err)
		}
		resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/version", alice())
		answers[name] = fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body)
		if resp.Header.Get(ReasonHeader) != ReasonTenantUnreachable {
			t.Errorf("%s: %s, want TenantUnreachable", name, answers[name])
		}
	}
	if a, b, c := answers["bad certificate"], answers["not TLS"], answers["closed port"]; a != b || b != c {
		t.Errorf("the answers differ:\n%s\n%s\n%s", a, b, c)
	}
	if hidePrivate(ReasonTenantRedirect) != ReasonTenantRedirect || hidePrivate(ReasonAddressNotAllowed) != ReasonAddressNotAllowed {
		t.Error("hidePrivate changes a reason that is not about reaching the tenant")
	}
}

func TestWatchStreamsAndRevocationEndsIt(t *testing.T) {
	f := newFixture(t, streaming)
	req, _ := http.NewRequest(http.MethodGet, "https://"+f.addr+"/tenants/ws-a/shop/api/v1/namespaces?watch=true", nil)
	req.Header = alice()
	resp, err := f.client(&f.proxy, f.servingC).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for i := range 3 { // events arrive while the tenant streams
		line, err := rd.ReadString('\n')
		if err != nil || !strings.Contains(line, fmt.Sprintf(`"n":%d`, i)) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
	}
	f.registry.Delete("ws-a", "shop")
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, rd); close(ended) }()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch went on after the tenant was revoked")
	}
	resp2, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/api", alice())
	if resp2.StatusCode != 404 || resp2.Header.Get(ReasonHeader) != ReasonUnknownTenant {
		t.Fatalf("after revocation: %d %s", resp2.StatusCode, body)
	}
}

func TestUpgradedStreamsPassThrough(t *testing.T) {
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "SPDY/3.1" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	})
	// A client that offers h2 first, as kcp-front-proxy's transport does:
	// the shim answers HTTP/1.1, on which an upgrade is possible.
	cfg := &tls.Config{RootCAs: pool(f.servingC), Certificates: []tls.Certificate{f.proxy}, NextProtos: []string{"h2", "http/1.1"}}
	conn, err := tls.Dial("tcp", f.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Fatalf("negotiated %q, want http/1.1", p)
	}
	fmt.Fprintf(conn, "POST /tenants/ws-a/shop/api/v1/namespaces/default/pods/p/exec?command=sh HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"+testUser+": alice\r\nContent-Length: 0\r\n\r\n")
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprintf(conn, "hello\n")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := rd.ReadString('\n')
	if err != nil || line != "echo hello\n" {
		t.Fatalf("through the upgraded stream: %q %v", line, err)
	}
}

func TestCertificatesRotateWithoutRestart(t *testing.T) {
	f := newFixture(t, echoHandler)
	// A client kept connected across the rotation.
	kept := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(f.servingC), Certificates: []tls.Certificate{f.proxy}}}}
	if resp, body := f.get(kept, "/tenants/ws-a/shop/version", alice()); resp.StatusCode != 200 {
		t.Fatalf("before: %d %s", resp.StatusCode, body)
	}
	// New serving certificate from a new CA, new requestheader CA.
	newServing, newHeader := newCA(t, "serving-2"), newCA(t, "requestheader-2")
	f.writeServing(newServing)
	writeFile(t, filepath.Join(f.dir, "requestheader-ca.crt"), newHeader.PEM)
	newProxy := issue(t, newHeader, "kcp-front-proxy")
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := f.client(&newProxy, newServing)
		req, _ := http.NewRequest(http.MethodGet, "https://"+f.addr+"/tenants/ws-a/shop/version", nil)
		req.Header = alice()
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new certificates were not picked up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The old proxy certificate is refused now.
	resp, _ := f.get(f.client(&f.proxy, newServing), "/tenants/ws-a/shop/version", alice())
	if resp.StatusCode != 401 || resp.Header.Get(ReasonHeader) != ReasonUntrustedClient {
		t.Fatalf("old client certificate: %d %s", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
	// The tenant's CA rotates too: the registry entry is replaced.
	newTenantCA := newCA(t, "tenant-2")
	moved := startTenant(t, newTenantCA, echoHandler)
	if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: moved.url, CA: pool(newTenantCA), Credential: mount.Credential{Token: "t"}}); err != nil {
		t.Fatal(err)
	}
	if resp, body := f.get(f.client(&newProxy, newServing), "/tenants/ws-a/shop/version", alice()); resp.StatusCode != 200 || len(moved.requests()) != 1 {
		t.Fatalf("after the tenant CA rotation: %d %s", resp.StatusCode, body)
	}
}

func TestRegistryRefusesUnsafeTenants(t *testing.T) {
	r := NewRegistry(t.Context(), RegistryOptions{})
	u := &url.URL{Scheme: "https", Host: "127.0.0.1:1"}
	for _, tc := range []mount.Tenant{
		{LogicalCluster: "ws", Name: "t", URL: u, Credential: mount.Credential{Token: "x"}},                                                           // no CA
		{LogicalCluster: "ws", Name: "t", URL: &url.URL{Scheme: "http", Host: "h"}, CA: x509.NewCertPool(), Credential: mount.Credential{Token: "x"}}, // plain http
		{LogicalCluster: "ws", Name: "t", URL: u, CA: x509.NewCertPool()},                                                                             // no credential
		{LogicalCluster: "WS", Name: "t", URL: u, CA: x509.NewCertPool(), Credential: mount.Credential{Token: "x"}},                                   // bad name
	} {
		if err := r.Set(tc); err == nil {
			t.Fatalf("accepted %+v", tc)
		}
	}
	if _, ok := r.lookup("ws", "t"); ok {
		t.Fatal("a refused tenant was registered")
	}
	_ = errors.New
}

func TestHeaderNameErrorsSuggestAFittingName(t *testing.T) {
	for what, want := range map[string]string{
		"--requestheader-username-headers":     "-User",
		"--requestheader-group-headers":        "-Group",
		"--requestheader-extra-headers-prefix": "-Extra-",
	} {
		for _, name := range []string{"", "X-Knotless-not-random-enough"} {
			err := ValidateHeaderName(what, name)
			if err == nil || !strings.Contains(err.Error(), want+" (") && !strings.HasSuffix(err.Error(), want) {
				t.Errorf("%s %q: %v, want an example ending in %s", what, name, err, want)
			}
		}
	}
}

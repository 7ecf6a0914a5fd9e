package mountproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// noConfigIn fails when a refusal names a configured header, a standard
// identity header or the tenant's address (R17).
func noConfigIn(t *testing.T, body string, tenant *url.URL) {
	t.Helper()
	for _, secret := range []string{testUser, testGroup, testExtra, "X-Knotless-", "X-Remote", tenant.Host, "tenant-token"} {
		if strings.Contains(strings.ToLower(body), strings.ToLower(secret)) {
			t.Errorf("refusal reveals %q: %s", secret, body)
		}
	}
}

func TestRefusalsNameNoConfiguration(t *testing.T) {
	f := newFixture(t, echoHandler)
	for _, tc := range []struct {
		name   string
		header http.Header
		reason string
	}{
		{"no identity", nil, ReasonNoIdentity},
		{"standard names only", http.Header{"X-Remote-User": {"alice"}, "X-Remote-Group": {"system:masters"}}, ReasonNoIdentity},
		{"two user headers", http.Header{testUser: {"alice", "mallory"}}, ReasonNoIdentity},
	} {
		resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/api", tc.header)
		if resp.Header.Get(ReasonHeader) != tc.reason {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		noConfigIn(t, body, f.tenant.url)
	}
	resp, body := f.get(f.client(nil, f.servingC), "/tenants/ws-a/shop/api", alice())
	if resp.Header.Get(ReasonHeader) != ReasonNoClientCertificate {
		t.Errorf("no certificate: %d %s", resp.StatusCode, body)
	}
	noConfigIn(t, body, f.tenant.url)
}

// TestAuthorizationBeforeForwarding: kcp decides who enters the workspace;
// a refused caller learns nothing about the tenant (not even whether it
// exists) and nothing reaches it.
func TestAuthorizationBeforeForwarding(t *testing.T) {
	var asked atomic.Int32
	var lastLC atomic.Value
	f := newFixtureWith(t, echoHandler, func(o *Options) {
		o.Authorizer = AuthorizerFunc(func(ctx context.Context, lc string, c *Caller) (bool, error) {
			asked.Add(1)
			lastLC.Store(lc)
			switch c.User {
			case "mallory":
				return false, nil
			case "kcp-down":
				return false, errors.New("connection refused to https://10.0.0.1:6443")
			}
			return true, nil
		})
	})
	c := f.client(&f.proxy, f.servingC)
	mallory := http.Header{testUser: {"mallory"}, testGroup: {"system:authenticated"}}
	for _, tc := range []struct {
		name   string
		header http.Header
		path   string
		code   int
		reason string
	}{
		{"refused by kcp", mallory, "/tenants/ws-a/shop/api", 403, ReasonNotAuthorized},
		{"refused by kcp, unknown tenant", mallory, "/tenants/ws-b/nothing/api", 403, ReasonNotAuthorized},
		{"kcp cannot be asked", http.Header{testUser: {"kcp-down"}}, "/tenants/ws-a/shop/api", 503, ReasonAuthorizationUnavailable},
		{"a kcp ServiceAccount", http.Header{testUser: {"system:serviceaccount:default:ci"}, testGroup: {"system:serviceaccounts"}}, "/tenants/ws-a/shop/api", 403, ReasonServiceAccount},
		{"system:masters", http.Header{testUser: {"anyone"}, testGroup: {"system:masters"}}, "/tenants/ws-a/shop/api", 403, ReasonPrivilegedGroup},
		{"a system user", http.Header{testUser: {"system:node:worker-1"}, testGroup: {"system:nodes"}}, "/tenants/ws-a/shop/api", 403, ReasonSystemUser},
		{"a user named like a DID", http.Header{testUser: {"did:plc:ewvi7nxzyoun6zhxrhs64oiz"}}, "/tenants/ws-a/shop/api", 403, ReasonDIDUser},
	} {
		resp, body := f.get(c, tc.path, tc.header)
		if resp.StatusCode != tc.code || resp.Header.Get(ReasonHeader) != tc.reason {
			t.Errorf("%s: %d %s: %s, want %d %s", tc.name, resp.StatusCode, resp.Header.Get(ReasonHeader), body, tc.code, tc.reason)
		}
		noConfigIn(t, body, f.tenant.url)
		if strings.Contains(body, "10.0.0.1") {
			t.Errorf("%s: the authorizer's error reached the caller: %s", tc.name, body)
		}
	}
	if n := len(f.tenant.requests()); n != 0 {
		t.Fatalf("%d refused requests reached the tenant", n)
	}
	h := alice()
	h.Add(testGroup, "system:nodes")
	h.Add(testGroup, "system:bootstrappers:kubeadm:default-node-token")
	if resp, body := f.get(c, "/tenants/ws-a/shop/api", h); resp.StatusCode != 200 {
		t.Fatalf("alice: %d %s", resp.StatusCode, body)
	}
	// kcp decided on the whole identity; the tenant gets no system: group
	// but system:authenticated.
	if got := f.tenant.requests()[0].Header.Values("Impersonate-Group"); strings.Join(got, ",") != "devs,system:authenticated" {
		t.Fatalf("groups at the tenant: %v", got)
	}
	if lastLC.Load() != "ws-a" {
		t.Fatalf("authorized in %v, want the tenant's workspace ws-a", lastLC.Load())
	}
}

// TestProbeCertificateOnlyProbes: the provider's probe certificate may
// assert only the probe user and only read /version (its answers are not
// authorized against kcp, so it must not be a way around authorization).
func TestProbeCertificateOnlyProbes(t *testing.T) {
	var asked atomic.Int32
	f := newFixtureWith(t, echoHandler, func(o *Options) {
		o.AllowedNames = append(o.AllowedNames, "knotless-probe")
		o.ProbeNames = []string{"knotless-probe"}
		o.Authorizer = AuthorizerFunc(func(context.Context, string, *Caller) (bool, error) { asked.Add(1); return true, nil })
	})
	probe := issue(t, f.headerCA, "knotless-probe")
	c := f.client(&probe, f.servingC)
	if resp, body := f.get(c, "/tenants/ws-a/shop/version", http.Header{testUser: {mount.ProbeUser}, testGroup: {"system:masters"}, testExtra + "Scope": {"all"}}); resp.StatusCode != 200 {
		t.Fatalf("probe: %d %s", resp.StatusCode, body)
	}
	// The probe is impersonated as itself and nothing more.
	if got := f.tenant.requests()[0].Header; strings.Join(got.Values("Impersonate-Group"), ",") != "system:authenticated" || got.Get("Impersonate-Extra-Scope") != "" {
		t.Fatalf("the probe at the tenant: %v", got)
	}
	for _, tc := range []struct {
		path string
		user string
	}{{"/tenants/ws-a/shop/api/v1/secrets", mount.ProbeUser}, {"/tenants/ws-a/shop/version", "alice"}} {
		if resp, body := f.get(c, tc.path, http.Header{testUser: {tc.user}, testGroup: {"system:masters"}}); resp.Header.Get(ReasonHeader) != ReasonProbeNotAllowed {
			t.Errorf("probe certificate as %s on %s: %d %s", tc.user, tc.path, resp.StatusCode, body)
		}
	}
	if n := len(f.tenant.requests()); n != 1 {
		t.Fatalf("the tenant got %d requests, want the probe's one", n)
	}
	if asked.Load() != 0 {
		t.Fatal("the probe user was authorized against kcp")
	}
}

// TestTenantRedirectsAreNotPassedOn: a tenant's 3xx becomes the shim's 502
// TenantRedirect; the Location never reaches the caller.
func TestTenantRedirectsAreNotPassedOn(t *testing.T) {
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://front-proxy.example/clusters/root:other/api/v1/secrets", http.StatusTemporaryRedirect)
	})
	resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/api/v1/namespaces", alice())
	if resp.StatusCode != 502 || resp.Header.Get(ReasonHeader) != ReasonTenantRedirect || resp.Header.Get("Location") != "" || strings.Contains(body, "root:other") {
		t.Fatalf("got %d %s Location %q: %s", resp.StatusCode, resp.Header.Get(ReasonHeader), resp.Header.Get("Location"), body)
	}
}

// TestNoRequestPassesTheShimTwice: a tenant URL that is the shim's own
// tenant path comes back with the hop marker and is refused at once; the
// shim sees exactly two requests, not an endless chain.
func TestNoRequestPassesTheShimTwice(t *testing.T) {
	var seen atomic.Int32
	f := newFixture(t, echoHandler)
	loop := &url.URL{Scheme: "https", Host: f.addr, Path: "/tenants/ws-a/loop"}
	// The shim trusts its own serving CA as the tenant's and forwards
	// with kcp-front-proxy's certificate and alice's identity headers.
	if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "loop", URL: loop, CA: pool(f.servingC), Credential: mount.Credential{ClientCert: &f.proxy}}); err != nil {
		t.Fatal(err)
	}
	counting := f.client(&f.proxy, f.servingC)
	base := counting.Transport
	counting.Transport = roundTripperFunc(func(r *http.Request) (*http.Response, error) { seen.Add(1); return base.RoundTrip(r) })
	h := alice()
	resp, body := f.get(counting, "/tenants/ws-a/loop/api", h)
	if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(body, ReasonLoop) {
		t.Fatalf("got %d %s: %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body)
	}
	if n := seen.Load(); n != 1 {
		t.Fatalf("the client sent %d requests", n)
	}
	if n := len(f.tenant.requests()); n != 0 {
		t.Fatalf("the looping request reached a tenant %d times", n)
	}
}

// TestTenantAddressPolicy: an address the policy refuses is never dialled
// and the refusal has its own reason.
func TestTenantAddressPolicy(t *testing.T) {
	tenantCA := newCA(t, "tenant")
	tenant := startTenant(t, tenantCA, echoHandler)
	tenantAddr := netip.MustParseAddrPort(tenant.url.Host)
	for _, tc := range []struct {
		name   string
		policy *netpolicy.Policy
	}{
		{"loopback not allowed", nil},
		{"the tenant address reserved", netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, []netip.AddrPort{tenantAddr})},
	} {
		f := newFixtureWith(t, echoHandler, func(o *Options) { o.Registry = NewRegistry(t.Context(), RegistryOptions{Policy: tc.policy}) })
		if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: tenant.url, CA: pool(tenantCA), Credential: mount.Credential{Token: "t"}}); err != nil {
			t.Fatal(err)
		}
		resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/version", alice())
		if resp.StatusCode != 502 || resp.Header.Get(ReasonHeader) != ReasonAddressNotAllowed {
			t.Errorf("%s: %d %s: %s", tc.name, resp.StatusCode, resp.Header.Get(ReasonHeader), body)
		}
		noConfigIn(t, body, tenant.url)
	}
	if n := len(tenant.requests()); n != 0 {
		t.Fatalf("%d requests reached a refused address", n)
	}
}

func TestHeaderNamesAreValidated(t *testing.T) {
	good := Headers{User: testUser, Group: testGroup, ExtraPrefix: testExtra}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]Headers{
		"missing":                 {Group: testGroup, ExtraPrefix: testExtra},
		"standard user":           {User: "X-Remote-User", Group: testGroup, ExtraPrefix: testExtra},
		"standard group":          {User: testUser, Group: "x-remote-group", ExtraPrefix: testExtra},
		"standard extra":          {User: testUser, Group: testGroup, ExtraPrefix: "X-Remote-Extra-"},
		"impersonation":           {User: "Impersonate-User-0123456789", Group: testGroup, ExtraPrefix: testExtra},
		"authorization":           {User: "Authorization", Group: testGroup, ExtraPrefix: testExtra},
		"guessable":               {User: "X-Internal-User", Group: testGroup, ExtraPrefix: testExtra},
		"long but not random":     {User: "X-Knotless-Mount-User-Name", Group: testGroup, ExtraPrefix: testExtra},
		"same user and group":     {User: testUser, Group: testUser, ExtraPrefix: testExtra},
		"user under extra prefix": {User: testExtra + "User", Group: testGroup, ExtraPrefix: testExtra},
		"bad characters":          {User: "X-Knotless-0123456789abcdef:User", Group: testGroup, ExtraPrefix: testExtra},
	} {
		if err := h.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, h)
		}
	}
	if _, err := New(Options{Registry: NewRegistry(t.Context(), RegistryOptions{}), Authorizer: enterIfNotMallory, Headers: Headers{User: "X-Remote-User", Group: "X-Remote-Group", ExtraPrefix: "X-Remote-Extra-"}}); err == nil {
		t.Fatal("New accepted the standard header names")
	}
	if _, err := New(Options{Registry: NewRegistry(t.Context(), RegistryOptions{}), Headers: good}); err == nil {
		t.Fatal("New accepted no authorizer")
	}
}

// TestSARCache: answers are reused until they expire, concurrent checks of
// one caller share a review, errors are not cached, and the cache is
// bounded.
func TestSARCache(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	var reviews atomic.Int32
	fail := atomic.Bool{}
	release := make(chan struct{})
	a := newSARAuthorizer(func(_ context.Context, lc string, sar *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error) {
		reviews.Add(1)
		if sar.Spec.User == "slow" {
			<-release
		}
		if fail.Load() {
			return nil, errors.New("kcp is down")
		}
		if sar.Spec.NonResourceAttributes == nil || sar.Spec.NonResourceAttributes.Verb != EnterVerb || sar.Spec.NonResourceAttributes.Path != EnterPath {
			return nil, fmt.Errorf("unexpected review %+v", sar.Spec)
		}
		sar.Status.Allowed = sar.Spec.User == "alice" && lc == "ws-a"
		return sar, nil
	}, SAROptions{AllowTTL: 10 * time.Second, DenyTTL: 5 * time.Second, Size: 3, Clock: clock})
	ctx := t.Context()
	alice := &Caller{User: "alice", Groups: []string{"b", "a"}}
	check := func(lc string, c *Caller, want bool, wantReviews int32) {
		t.Helper()
		got, err := a.Authorize(ctx, lc, c)
		if err != nil || got != want || reviews.Load() != wantReviews {
			t.Fatalf("%s in %s: %v %v after %d reviews, want %v after %d", c.User, lc, got, err, reviews.Load(), want, wantReviews)
		}
	}
	check("ws-a", alice, true, 1)                                                   // miss
	check("ws-a", &Caller{User: "alice", Groups: []string{"a", "b"}}, true, 1)      // hit (group order does not matter)
	check("ws-b", alice, false, 2)                                                  // another workspace is another answer
	check("ws-a", &Caller{User: "alice", Groups: []string{"a", "b", "x"}}, true, 3) // other groups: another answer
	clock.Step(6 * time.Second)
	check("ws-b", alice, false, 4) // the refusal expired (5 s)
	check("ws-a", alice, true, 4)  // the permission did not (10 s)
	clock.Step(5 * time.Second)
	check("ws-a", alice, true, 5) // now it did
	// Bound: 3 answers; older ones are evicted.
	for i := range 5 {
		check(fmt.Sprintf("ws-%d", i), alice, false, int32(6+i))
	}
	check("ws-a", alice, true, 11)
	// Errors are not cached.
	fail.Store(true)
	if _, err := a.Authorize(ctx, "ws-z", alice); err == nil {
		t.Fatal("no error from a failing review")
	}
	fail.Store(false)
	check("ws-z", alice, false, 13)
	// Concurrent checks of one caller share one review.
	slow := &Caller{User: "slow"}
	done := make(chan struct{})
	for range 10 {
		go func() { _, _ = a.Authorize(ctx, "ws-a", slow); done <- struct{}{} }()
	}
	time.Sleep(100 * time.Millisecond)
	close(release)
	for range 10 {
		<-done
	}
	if n := reviews.Load(); n != 14 {
		t.Fatalf("10 concurrent checks made %d reviews, want 1", n-13)
	}
}

// TestIdleAndSlowConnectionsAreClosed: a caller that sends no headers, or
// keeps a connection idle after a refusal, is disconnected.
func TestIdleAndSlowConnectionsAreClosed(t *testing.T) {
	f := newFixtureWith(t, echoHandler, func(o *Options) {
		o.ReadHeaderTimeout, o.IdleTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	closedWithin := func(name string, conn *tls.Conn) {
		t.Helper()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		_, err := io.Copy(io.Discard, conn)
		if err != nil || time.Since(start) > 3*time.Second {
			t.Errorf("%s: connection not closed by the shim (%v after %s)", name, err, time.Since(start))
		}
	}
	dial := func(cert *tls.Certificate) *tls.Conn {
		cfg := &tls.Config{RootCAs: pool(f.servingC)}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		conn, err := tls.Dial("tcp", f.addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	closedWithin("no request headers", dial(&f.proxy))
	conn := dial(nil)
	fmt.Fprintf(conn, "GET /tenants/ws-a/shop/version HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.Header.Get(ReasonHeader) != ReasonNoClientCertificate {
		t.Fatalf("refusal: %v %v", resp, err)
	}
	closedWithin("idle after a refusal", conn)
}

// TestSlowTenantHeadersTimeOut: a tenant that never sends response headers
// does not hold the caller (and the shim's connection) forever.
func TestSlowTenantHeadersTimeOut(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	f := newFixtureWith(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, func(o *Options) {
		o.Registry = NewRegistry(t.Context(), RegistryOptions{ResponseHeaderTimeout: 200 * time.Millisecond, Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)})
	})
	start := time.Now()
	resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/api/v1/namespaces", alice())
	if resp.StatusCode != 502 || time.Since(start) > 5*time.Second {
		t.Fatalf("got %d %s after %s: %s", resp.StatusCode, resp.Header.Get(ReasonHeader), time.Since(start), body)
	}
}

package mountproxy

import (
	"bufio"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/knotless-dev/knotless/internal/mount"
)

// streaming answers /version, and every other request with an endless
// watch.
func streaming(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/version" {
		echoHandler(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	for i := 0; ; i++ {
		if _, err := fmt.Fprintf(w, "{\"type\":\"ADDED\",\"n\":%d}\n", i); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// openWatch starts a watch through the shim and returns a channel that is
// closed when the stream ends.
func openWatch(t *testing.T, f *fixture) <-chan struct{} {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://"+f.addr+"/tenants/ws-a/shop/api/v1/namespaces?watch=true", nil)
	req.Header = alice()
	resp, err := f.client(&f.proxy, f.servingC).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "ADDED") {
		t.Fatalf("first event: %q %v", line, err)
	}
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, rd); close(ended) }()
	return ended
}

func isOpen(ended <-chan struct{}, d time.Duration) bool {
	select {
	case <-ended:
		return false
	case <-time.After(d):
		return true
	}
}

func TestRegistryReplacementEndsStreamsOnlyForANewTarget(t *testing.T) {
	f := newFixture(t, streaming)
	base := mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: f.tenant.url, CA: pool(f.tenantCA), Credential: mount.Credential{Token: "tenant-token"}}
	ended := openWatch(t, f)

	// The same registration again (every reconcile does this): nothing.
	if err := f.registry.Set(base); err != nil {
		t.Fatal(err)
	}
	if !isOpen(ended, 200*time.Millisecond) {
		t.Fatal("setting an unchanged tenant ended its stream")
	}
	// A rotated CA bundle (another CA added): streams go on.
	rotated := base
	rotated.CA = x509.NewCertPool()
	rotated.CA.AddCert(newCA(t, "next").Cert)
	rotated.CA.AddCert(f.tenantCA.Cert)
	if err := f.registry.Set(rotated); err != nil {
		t.Fatal(err)
	}
	if !isOpen(ended, 200*time.Millisecond) {
		t.Fatal("a CA rotation ended the stream")
	}
	if resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/version", alice()); resp.StatusCode != 200 {
		t.Fatalf("a new request after the CA rotation: %d %s", resp.StatusCode, body[:min(len(body), 200)])
	}
	// A new credential: the streams opened with the old one end.
	recredentialed := rotated
	recredentialed.Credential = mount.Credential{Token: "new-token"}
	if err := f.registry.Set(recredentialed); err != nil {
		t.Fatal(err)
	}
	if isOpen(ended, 5*time.Second) {
		t.Fatal("the stream went on after the credential changed")
	}
}

func TestRevokedTenantIsRefusedWithItsReason(t *testing.T) {
	f := newFixture(t, streaming)
	ended := openWatch(t, f)
	f.registry.Revoke("ws-a", "shop")
	if isOpen(ended, 5*time.Second) {
		t.Fatal("the stream went on after the tenant was revoked")
	}
	resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/api", alice())
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get(ReasonHeader) != ReasonRevoked {
		t.Fatalf("revoked tenant: %d %s %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body)
	}
	// Registered again: served again.
	if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: f.tenant.url, CA: pool(f.tenantCA), Credential: mount.Credential{Token: "t"}}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/version", alice()); resp.StatusCode != 200 {
		t.Fatalf("after registering again: %d", resp.StatusCode)
	}
}

// TestConfiguredIdentityHeaders: with header names of its own, the shim
// reads only those; the standard X-Remote-* a caller adds (kcp v0.28.1's
// front proxy passes them on) neither authenticate nor reach the tenant.
func TestConfiguredIdentityHeaders(t *testing.T) {
	f := newFixtureWith(t, echoHandler, func(o *Options) {
		o.Headers = Headers{User: "X-Knotless-99aa88bb77cc66dd-User", Group: "X-Knotless-55ee44ff33001122-Group", ExtraPrefix: "X-Knotless-0a1b2c3d4e5f6a7b-Extra-"}
	})
	c := f.client(&f.proxy, f.servingC)
	if resp, _ := f.get(c, "/tenants/ws-a/shop/version", alice()); resp.StatusCode != 401 || resp.Header.Get(ReasonHeader) != ReasonNoIdentity {
		t.Fatalf("other names only: %d %s", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
	h := http.Header{
		"X-Knotless-99aa88bb77cc66dd-User":        {"alice"},
		"X-Knotless-55ee44ff33001122-Group":       {"devs"},
		"X-Knotless-0a1b2c3d4e5f6a7b-Extra-Scope": {"shop"},
		"X-Remote-User":                           {"mallory"},
		"X-Remote-Group":                          {"system:masters"},
		"X-Remote-Extra-Spoofed":                  {"yes"},
	}
	if resp, body := f.get(c, "/tenants/ws-a/shop/version", h); resp.StatusCode != 200 {
		t.Fatalf("configured headers: %d %s", resp.StatusCode, body)
	}
	got := f.tenant.requests()[0].Header
	if got.Get("Impersonate-User") != "alice" || strings.Join(got.Values("Impersonate-Group"), ",") != "devs" || got.Get("Impersonate-Extra-Scope") != "shop" {
		t.Fatalf("impersonation at the tenant: %v", got)
	}
	for name := range got {
		if strings.HasPrefix(name, "X-Remote-") || strings.HasPrefix(name, "X-Knotless-") && name != HopHeader || name == "Impersonate-Extra-Spoofed" {
			t.Errorf("%s reached the tenant", name)
		}
	}
	// Two user headers (one added by a caller) are refused.
	h.Add("X-Knotless-99aa88bb77cc66dd-User", "mallory")
	if resp, _ := f.get(c, "/tenants/ws-a/shop/version", h); resp.StatusCode != 401 || resp.Header.Get(ReasonHeader) != ReasonNoIdentity {
		t.Fatalf("two user headers: %d %s", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
}

// TestTenantCannotAnswerWithTheShimsReason: a tenant's own reason header
// is removed, so a probe cannot be told "unreachable" by the tenant.
func TestTenantCannotAnswerWithTheShimsReason(t *testing.T) {
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(ReasonHeader, ReasonTenantUnreachable)
		echoHandler(w, r)
	})
	resp, body := f.get(f.client(&f.proxy, f.servingC), "/tenants/ws-a/shop/version", alice())
	if resp.StatusCode != 200 || resp.Header.Get(ReasonHeader) != "" {
		t.Fatalf("%d %q: %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body)
	}
}

func TestRequestsAreCountedByOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, echoHandler, func(o *Options) { o.Registerer = reg })
	c := f.client(&f.proxy, f.servingC)
	f.get(c, "/tenants/ws-a/shop/version", alice())
	f.get(c, "/tenants/ws-a/other/version", alice())
	f.get(f.client(nil, f.servingC), "/tenants/ws-a/shop/version", alice())
	want := `
# HELP knotless_mountproxy_requests_total Requests by outcome, each counted once: Forwarded (the tenant answered), or the reason the shim answered with (refusals, forwarding errors).
# TYPE knotless_mountproxy_requests_total counter
knotless_mountproxy_requests_total{outcome="Forwarded"} 1
knotless_mountproxy_requests_total{outcome="NoClientCertificate"} 1
knotless_mountproxy_requests_total{outcome="UnknownTenant"} 1
# HELP knotless_mountproxy_tenants Tenants registered (usable TenantClusters).
# TYPE knotless_mountproxy_tenants gauge
knotless_mountproxy_tenants 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "knotless_mountproxy_requests_total", "knotless_mountproxy_tenants"); err != nil {
		t.Fatal(err)
	}
	// The latency histogram observed each request once, by the same
	// outcome.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range families {
		if mf.GetName() != "knotless_mountproxy_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	if want := map[string]uint64{OutcomeForwarded: 1, "NoClientCertificate": 1, ReasonUnknownTenant: 1}; !maps.Equal(counts, want) {
		t.Errorf("request_duration_seconds samples by outcome %v, want %v", counts, want)
	}
}

package mountproxy

import (
	"context"
	"net/http"
	"testing"
)

// TestSpoofedDIDUsers pins: whitespace around a kcp user "did:..." is
// trimmed on the wire (Go's textproto), so it is refused as a DID; an
// upper-case "DID:" is forwarded verbatim (a different, case-sensitive
// Kubernetes user, never the DID).
func TestSpoofedDIDUsers(t *testing.T) {
	f := newFixtureWith(t, echoHandler, func(o *Options) {
		o.Authorizer = AuthorizerFunc(func(context.Context, string, *Caller) (bool, error) { return true, nil })
	})
	c := f.client(&f.proxy, f.servingC)
	for _, u := range []string{" did:plc:ewvi7nxzyoun6zhxrhs64oiz", "\tdid:plc:ewvi7nxzyoun6zhxrhs64oiz", "did:plc:ewvi7nxzyoun6zhxrhs64oiz "} {
		resp, body := f.get(c, "/tenants/ws-a/shop/api", http.Header{testUser: {u}})
		if resp.StatusCode != 403 || resp.Header.Get(ReasonHeader) != ReasonDIDUser {
			t.Errorf("user %q: %d %s %s, want 403 %s", u, resp.StatusCode, resp.Header.Get(ReasonHeader), body, ReasonDIDUser)
		}
	}
	if n := len(f.tenant.requests()); n != 0 {
		t.Fatalf("%d requests reached the tenant", n)
	}
	resp, _ := f.get(c, "/tenants/ws-a/shop/api", http.Header{testUser: {"DID:plc:ewvi7nxzyoun6zhxrhs64oiz"}})
	if resp.StatusCode != 200 {
		t.Fatalf("upper-case DID user: %d", resp.StatusCode)
	}
	if got := f.tenant.requests()[0].Header.Get("Impersonate-User"); got != "DID:plc:ewvi7nxzyoun6zhxrhs64oiz" {
		t.Fatalf("impersonated %q", got)
	}
}

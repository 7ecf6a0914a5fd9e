package tenantreach

import (
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// The client of a tenant follows no redirect (the token would go along),
// takes no proxy from the environment, and dials through the policy.
func TestTenantClientFollowsNoRedirectAndNoProxy(t *testing.T) {
	var elsewhere, reached atomic.Int32
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer target.Close()
	tenant := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer tenant.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tenant.Certificate().Raw})
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
	loopback := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	cs, err := Client(deal.Tenant{Endpoint: tenant.URL, CA: ca}, "secret-token", loopback)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(t.Context(), "x", metav1.GetOptions{}); err == nil {
		t.Fatal("a redirect was taken for an answer")
	}
	if reached.Load() == 0 || elsewhere.Load() != 0 {
		t.Fatalf("the tenant was asked %d times (not through the proxy: more than 0), the redirect target %d (0)", reached.Load(), elsewhere.Load())
	}
	// The policy refuses what the operator did not allow.
	cs, err = Client(deal.Tenant{Endpoint: tenant.URL, CA: ca}, "secret-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(t.Context(), "x", metav1.GetOptions{}); !errors.Is(err, netpolicy.ErrDenied) {
		t.Fatalf("a loopback tenant without an allowed range: %v", err)
	}
}

// A contract's reach is found only in its own workspace and by its UID.
func TestRegistryKeysByWorkspaceAndUID(t *testing.T) {
	var r Registry
	r.Put("ws-a", types.UID("u1"), Reach{Tenant: deal.Tenant{Endpoint: "https://a"}})
	if got, ok := r.Get("ws-a", "u1"); !ok || got.Tenant.Endpoint != "https://a" {
		t.Fatalf("Get(ws-a, u1) = %v, %v", got, ok)
	}
	for _, k := range [][2]string{{"ws-b", "u1"}, {"ws-a", "u2"}, {"ws-a/u1", ""}} {
		if _, ok := r.Get(k[0], types.UID(k[1])); ok {
			t.Fatalf("Get(%q, %q) found a reach", k[0], k[1])
		}
	}
	r.Delete("ws-a", "u1")
	if _, ok := r.Get("ws-a", "u1"); ok {
		t.Fatal("a deleted reach is found")
	}
	var none *Registry
	if _, ok := none.Get("ws-a", "u1"); ok {
		t.Fatal("a nil registry found a reach")
	}
}

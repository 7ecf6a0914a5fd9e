package marketrequester

import (
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

func TestAccessKeyNamesTheListInAnyOrder(t *testing.T) {
	a := []marketv1alpha1.TenantAccess{{DID: "did:plc:a", Role: marketv1alpha1.AccessView}, {DID: "did:plc:b", Role: marketv1alpha1.AccessEdit}}
	b := []marketv1alpha1.TenantAccess{a[1], a[0]}
	if accessKey(nil) != "" || accessKey(a) == "" || accessKey(a) != accessKey(b) {
		t.Fatalf("keys %q %q %q", accessKey(nil), accessKey(a), accessKey(b))
	}
	c := []marketv1alpha1.TenantAccess{{DID: "did:plc:a", Role: marketv1alpha1.AccessAdmin}, a[1]}
	if accessKey(a) == accessKey(c) {
		t.Fatal("another role has the same key")
	}
	for _, r := range accessRules(marketv1alpha1.AccessEdit) {
		for _, v := range r.Verbs {
			if v == "*" || v == "impersonate" || v == "bind" || v == "escalate" {
				t.Fatalf("edit has %q", v)
			}
		}
	}
}

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
	cs, err := tenantClient(deal.Tenant{Endpoint: tenant.URL, CA: ca}, "secret-token", loopback)
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
	cs, err = tenantClient(deal.Tenant{Endpoint: tenant.URL, CA: ca}, "secret-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(t.Context(), "x", metav1.GetOptions{}); !errors.Is(err, netpolicy.ErrDenied) {
		t.Fatalf("a loopback tenant without an allowed range: %v", err)
	}
}

package mountproxy

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/e2e/framework"
)

// TestShimOverhead prints GET latency (p50, p99, sequential) and requests/s
// (16 concurrent clients) straight to a trivial TLS tenant and through the
// shim, same client settings, same run, with the ratios: the shim's own
// cost, the worst case for the ratio. Run with KNOTLESS_MOUNTPROXY_BENCH=N
// (make bench-mountproxy-unit); make bench-mountproxy measures against a
// real tenant apiserver.
func TestShimOverhead(t *testing.T) {
	if os.Getenv("KNOTLESS_MOUNTPROXY_BENCH") == "" {
		t.Skip("set KNOTLESS_MOUNTPROXY_BENCH=N (make bench-mountproxy) to run")
	}
	var n int
	_, _ = fmt.Sscan(os.Getenv("KNOTLESS_MOUNTPROXY_BENCH"), &n) // not a number: the minimum
	n = max(n, 200)
	body := []byte(`{"kind":"NamespaceList","apiVersion":"v1","items":[]}`)
	f := newFixture(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	transport := func(cfg *tls.Config) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 64}}
	}
	direct := transport(&tls.Config{RootCAs: pool(f.tenantCA)})
	shim := transport(&tls.Config{RootCAs: pool(f.servingC), Certificates: []tls.Certificate{f.proxy}})
	directURL := f.tenant.url.String() + "/api/v1/namespaces"
	shimURL := "https://" + f.addr + "/tenants/ws-a/shop/api/v1/namespaces"
	targets := []framework.Target{
		{Name: "direct", Client: direct, URL: directURL, Header: http.Header{"Authorization": {"Bearer tenant-token"}}},
		{Name: "through the shim", Client: shim, URL: shimURL, Header: alice()},
	}
	figures, err := framework.MeasureGET(n, targets...)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range framework.CompareGET(targets, figures) {
		t.Log("FIGURE " + line)
	}
}

package mountproxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestShimOverhead prints GET latency (p50, p99, sequential) and requests/s
// (16 concurrent clients) straight to a TLS tenant and through the shim,
// same client settings, same run, with the ratios. Run with
// KNOTLESS_MOUNTPROXY_BENCH=N (make bench-mountproxy).
func TestShimOverhead(t *testing.T) {
	if os.Getenv("KNOTLESS_MOUNTPROXY_BENCH") == "" {
		t.Skip("set KNOTLESS_MOUNTPROXY_BENCH=N (make bench-mountproxy) to run")
	}
	var n int
	fmt.Sscan(os.Getenv("KNOTLESS_MOUNTPROXY_BENCH"), &n)
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
	get := func(c *http.Client, u string, hdr http.Header) {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header = hdr.Clone()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", u, resp.StatusCode)
		}
	}
	latency := func(c *http.Client, u string, hdr http.Header) (p50, p99 time.Duration) {
		for range 50 { // warm connections
			get(c, u, hdr)
		}
		d := make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			get(c, u, hdr)
			d[i] = time.Since(start)
		}
		slices.Sort(d)
		return d[n/2], d[n*99/100]
	}
	throughput := func(c *http.Client, u string, hdr http.Header) float64 {
		const clients = 16
		start := time.Now()
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for range n / clients {
					get(c, u, hdr)
				}
			})
		}
		wg.Wait()
		return float64(n/clients*clients) / time.Since(start).Seconds()
	}
	tokenHdr := http.Header{"Authorization": {"Bearer tenant-token"}}
	d50, d99 := latency(direct, directURL, tokenHdr)
	s50, s99 := latency(shim, shimURL, alice())
	dr := throughput(direct, directURL, tokenHdr)
	sr := throughput(shim, shimURL, alice())
	t.Logf("FIGURE GET latency p50: direct %s, through the shim %s (%.2fx)", d50, s50, float64(s50)/float64(d50))
	t.Logf("FIGURE GET latency p99: direct %s, through the shim %s (%.2fx)", d99, s99, float64(s99)/float64(d99))
	t.Logf("FIGURE GET requests/s (16 clients): direct %.0f, through the shim %.0f (%.2fx)", dr, sr, sr/dr)
}

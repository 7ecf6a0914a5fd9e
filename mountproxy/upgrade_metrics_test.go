package mountproxy

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestUpgradeMismatchCountedOnce: a tenant answers an upgrade request
// with 101 for another protocol, so ReverseProxy calls ErrorHandler after
// ModifyResponse saw the tenant's answer: the request is still counted
// and timed once (from review: it was counted and observed twice, a
// tenant could inflate the figures at will).
func TestUpgradeMismatchCountedOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, func(w http.ResponseWriter, _ *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: bogus\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
	}, func(o *Options) { o.Registerer = reg })
	c := f.client(&f.proxy, f.servingC)
	h := alice()
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", "websocket")
	resp, body := f.get(c, "/tenants/ws-a/shop/api", h)
	t.Logf("status %d reason %q body %s", resp.StatusCode, resp.Header.Get(ReasonHeader), body)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var samples, requests uint64
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "knotless_mountproxy_request_duration_seconds":
				t.Logf("latency %v: %d", m.GetLabel()[0].GetValue(), m.GetHistogram().GetSampleCount())
				samples += m.GetHistogram().GetSampleCount()
			case "knotless_mountproxy_requests_total":
				t.Logf("requests %v: %v", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
				requests += uint64(m.GetCounter().GetValue())
			}
		}
	}
	if samples != 1 {
		t.Errorf("one request, %d latency samples", samples)
	}
	if requests != 1 {
		t.Errorf("one request, counted %d times", requests)
	}
}

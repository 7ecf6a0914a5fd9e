package gateway

import (
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// TestProbe: through a real TLS server standing for a gateway: an answer
// without the gateway's reason is the Service's (Serving, whatever its
// status); the gateway's refusals are named, a reason it does not send
// is not repeated; a redirect is not followed; a certificate the
// provider does not trust, and an address the policy does not allow,
// are GatewayUnreachable without quoting the server.
func TestProbe(t *testing.T) {
	var answer func(w http.ResponseWriter)
	hits := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		if r.Host != "shop.example.com" && !strings.HasPrefix(r.Host, "shop.example.com:") {
			w.WriteHeader(http.StatusMisdirectedRequest)
			return
		}
		answer(w)
	}))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	addr := strings.TrimPrefix(srv.URL, "https://")
	loopback := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)
	// httptest's certificate is for example.com and its subdomains.
	const host = "shop.example.com"
	for _, c := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		want   string
	}{
		{"the Service answers", func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }, gatewayv1alpha1.ReasonServing},
		{"the Service answers 500", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }, gatewayv1alpha1.ReasonServing},
		{"no route yet", refuse(http.StatusNotFound, gateway.ReasonNoRoute), gatewayv1alpha1.ReasonWaiting},
		{"no ready endpoint", refuse(http.StatusServiceUnavailable, gateway.ReasonNoReadyEndpoint), gatewayv1alpha1.ReasonNoReadyEndpoint},
		{"no Service", refuse(http.StatusServiceUnavailable, gateway.ReasonServiceNotFound), gatewayv1alpha1.ReasonServiceNotFound},
		{"upstream", refuse(http.StatusBadGateway, gateway.ReasonUpstreamFailed), gatewayv1alpha1.ReasonUpstreamFailed},
		{"a reason the gateway does not send", refuse(http.StatusServiceUnavailable, "<script>Evil"), gatewayv1alpha1.ReasonWaiting},
		{"a redirect", func(w http.ResponseWriter) {
			w.Header().Set("Location", "https://169.254.169.254/")
			w.WriteHeader(http.StatusFound)
		}, gatewayv1alpha1.ReasonServing},
	} {
		answer = c.answer
		p := Probe(t.Context(), loopback, roots, addr, host)
		if p.Reason != c.want || strings.Contains(p.Message, "Evil") {
			t.Errorf("%s: %+v, want %s", c.name, p, c.want)
		}
	}
	answer = func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }
	before := hits
	// At a loopback (private) address every failure reads the same: a
	// certificate not trusted, one for another name, an address the
	// policy denies, a closed port (R17).
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	var msgs []string
	for name, p := range map[string]Probed{
		"untrusted certificate": Probe(t.Context(), loopback, x509.NewCertPool(), addr, host),
		"another name":          Probe(t.Context(), loopback, roots, addr, "shop.elsewhere.test"),
		"denied by the policy":  Probe(t.Context(), netpolicy.New(nil, nil), roots, addr, host),
		"a closed port":         Probe(t.Context(), loopback, roots, closedAddr, host),
	} {
		if p.Reason != gatewayv1alpha1.ReasonGatewayUnreachable || !strings.Contains(p.Message, "did not answer for") {
			t.Errorf("%s: %+v", name, p)
		}
		msgs = append(msgs, strings.NewReplacer(closedAddr, "ADDR", addr, "ADDR", "shop.elsewhere.test", "HOST", host, "HOST").Replace(p.Message))
	}
	for _, m := range msgs[1:] {
		if m != msgs[0] {
			t.Errorf("failures at a private address read apart: %q", msgs)
			break
		}
	}
	if hits != before {
		t.Errorf("%d requests reached the server over TLS it should not have", hits-before)
	}
}

func refuse(code int, reason string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set(gateway.ReasonHeader, reason)
		w.WriteHeader(code)
	}
}

package tenantcluster

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/mountproxy"
)

// hostileShim is a TLS server on loopback, trusted as the shim, that
// answers every probe with handler.
func hostileShim(t *testing.T, handler http.HandlerFunc) *Prober {
	t.Helper()
	ca, err := framework.NewCA("shim")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Issue("shim", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.IssueUser("provider")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := framework.PEMs(client)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ca.crt": ca.PEM, "tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	files, err := mountproxy.NewClientTLS(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt"), 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(handler)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serving}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &Prober{ShimURL: srv.URL, TLS: files, UserHeader: "X-Test-User", GroupHeader: "X-Test-Group", Timeout: 20 * time.Second}
}

// R21: a tenant (or whatever answers as the shim) that sends an endless
// /version answer costs the probe at most maxProbeBody: the probe ends at
// once with TenantError saying the answer is too large, instead of reading
// on or reading a cut document.
func TestProbeRefusesAHugeVersionAnswer(t *testing.T) {
	p := hostileShim(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"gitVersion":"v1.32.0","padding":"`))
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 4096 { // 256 MiB
			if _, err := w.Write(chunk); err != nil || r.Context().Err() != nil {
				return
			}
		}
	})
	start := time.Now()
	res := p.Probe(context.Background(), "lc", "tenant")
	if res.Reason != computev1alpha1.ReasonTenantError || !strings.Contains(res.Message, "larger than 64 KiB") {
		t.Fatalf("probe = %+v, want TenantError saying the answer is too large", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the probe took %s", d)
	}
}

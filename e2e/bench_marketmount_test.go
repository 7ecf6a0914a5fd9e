package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// TestMarketMountThroughput (make bench-mountproxy): GET latency and
// requests/s on a market tenant, which authenticates the requester's DID
// with the agent's TokenReview webhook: straight to the tenant with the
// mount's service-auth token, impersonating alice as the shim does, and
// through kcp-front-proxy and the shim as alice. TestMountProxyThroughput
// in the same run gives a tenant that takes a static token.
func TestMarketMountThroughput(t *testing.T) {
	if os.Getenv("KNOTLESS_E2E_MOUNT_BENCH") == "" {
		t.Skip("set KNOTLESS_E2E_MOUNT_BENCH=N (make bench-mountproxy) to run")
	}
	var n int
	_, _ = fmt.Sscan(os.Getenv("KNOTLESS_E2E_MOUNT_BENCH"), &n) // not a number: the minimum
	n = max(n, 200)
	defer failWithLogs(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	d, _, _ := tenantDeal(ctx, t, "mbench", "acme")
	d.bidder(ctx, t, "acme", offerOf("small", 1000, 1024, 30, 1))
	spec := requesterSpec("buyer", 1000, 1024, 50, 5)
	spec.TenantAdmins.Users = []string{"alice"}
	d.requester(ctx, t, "vms", spec)
	rc := contractOf(ctx, t, d.app, "vms", "the contract Active (the tenant mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	sec := &corev1.Secret{}
	if err := d.app.Get(ctx, client.ObjectKey{Namespace: "default", Name: rc.Name + "-tenant"}, sec); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(sec.Data[computev1alpha1.MountCredentialCAKey])
	direct := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 64}}
	cfg, err := env.frontProxy.UserConfig("alice", root.Join(d.appWS).Join(rc.Name).String())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const object = "/api/v1/namespaces/default"
	targets := []framework.Target{
		{Name: "direct (the mount's DID token)", Client: direct, URL: string(sec.Data[computev1alpha1.MountCredentialURLKey]) + object, Header: http.Header{
			"Authorization": {"Bearer " + mountTokenOf(ctx, t, env.home(), d.app, rc.Name)}, "Impersonate-User": {"alice"},
		}},
		{Name: "through kcp-front-proxy and the shim (DID token)", Client: &http.Client{Timeout: 30 * time.Second, Transport: rt}, URL: cfg.Host + object},
	}
	figures, err := framework.MeasureGET(n, targets...)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range framework.CompareGET(targets, figures) {
		t.Log("FIGURE market tenant: " + line)
	}
}

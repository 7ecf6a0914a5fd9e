package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/mountproxy"
)

// fpClient calls kcp-front-proxy with the given client certificate (none:
// an anonymous caller).
func fpClient(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	ca, err := os.ReadFile(env.certs.FPServingCAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cfg := &tls.Config{RootCAs: pool}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// do sends one GET and returns status, the shim's reason and the body.
func do(ctx context.Context, t *testing.T, c *http.Client, url string, header map[string][]string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(mountproxy.ReasonHeader), string(b)
}

// headerName finds an identity header name in a refusal: any
// X-Remote-*/X-Knotless-* name.
var headerName = regexp.MustCompile(`(?i)x-(remote|knotless)-[a-z0-9-]+`)

// TestMountAuthorization: through the real kcp-front-proxy, which passes a
// request without a client certificate on with the caller's headers, a
// caller can neither spoof an identity with the standard names nor enter a
// workspace kcp does not let them into; refusals name no header; a user
// kcp lets in gets through, and loses access soon after kcp takes it away.
func TestMountAuthorization(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	rt := newReadyTenant(ctx, t, env.prefix+"-mount-authz")
	tenantPath := env.frontProxy.URL + "/tenants/" + rt.lc + "/tenant/api/v1/namespaces"
	mountPath := env.frontProxy.URL + "/clusters/" + root.Join(rt.ws).Join("tenant").String() + "/api/v1/namespaces"
	anonymous := fpClient(t, nil)
	user, group := env.certs.UserHeader, env.certs.GroupHeader
	for _, tc := range []struct {
		name   string
		header map[string][]string
		code   int
		reason string
	}{
		{"anonymous, standard names as alice in system:masters", map[string][]string{"X-Remote-User": {"alice"}, "X-Remote-Group": {"system:masters"}, "Impersonate-User": {"alice"}}, 401, mountproxy.ReasonNoIdentity},
		{"anonymous, configured names as mallory", map[string][]string{user: {"mallory"}, group: {"system:authenticated"}}, 403, mountproxy.ReasonNotAuthorized},
		{"anonymous, configured names in system:masters", map[string][]string{user: {"anyone"}, group: {"system:masters"}}, 403, mountproxy.ReasonPrivilegedGroup},
		{"anonymous, configured names as a kcp ServiceAccount", map[string][]string{user: {"system:serviceaccount:default:default"}, group: {"system:serviceaccounts"}}, 403, mountproxy.ReasonServiceAccount},
	} {
		code, reason, body := do(ctx, t, anonymous, tenantPath, tc.header)
		if code != tc.code || reason != tc.reason {
			t.Errorf("%s: %d %s: %s, want %d %s", tc.name, code, reason, body, tc.code, tc.reason)
		}
		if m := headerName.FindString(body); m != "" || strings.Contains(body, user) || strings.Contains(body, group) {
			t.Errorf("%s: the refusal names a header (%q): %s", tc.name, m, body)
		}
	}

	// bob is a kcp user (a client certificate kcp-front-proxy verifies)
	// without access to the workspace.
	bobCert, err := env.certs.UserCA.IssueUser("bob")
	if err != nil {
		t.Fatal(err)
	}
	aliceCert, err := env.certs.UserCA.IssueUser("alice")
	if err != nil {
		t.Fatal(err)
	}
	// alice may enter; wait until kcp-front-proxy routes the mount (its
	// index answers 503 until the mount workspace is Ready there).
	start := time.Now()
	if err := framework.Eventually(ctx, time.Minute, "alice through the mount", func(ctx context.Context) (bool, string, error) {
		code, reason, body := do(ctx, t, fpClient(t, &aliceCert), mountPath, nil)
		return code == 200, fmt.Sprintf("%d %s: %s", code, reason, body), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("alice through the mount (authorized by kcp) after %s", time.Since(start).Round(time.Millisecond))
	for _, url := range []string{mountPath, tenantPath} {
		if code, reason, body := do(ctx, t, fpClient(t, &bobCert), url, map[string][]string{user: {"alice"}}); code != 403 || reason != mountproxy.ReasonNotAuthorized {
			t.Errorf("bob at %s: %d %s: %s, want 403 %s", url, code, reason, body, mountproxy.ReasonNotAuthorized)
		}
	}

	// kcp takes alice's access away: the shim refuses her within its
	// cache's lifetime (10 s by default).
	if err := rt.c.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e:enter:alice"}}); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	if err := framework.Eventually(ctx, 45*time.Second, "the shim to refuse alice", func(ctx context.Context) (bool, string, error) {
		code, reason, _ := do(ctx, t, fpClient(t, &aliceCert), mountPath, nil)
		return code == 403 && reason == mountproxy.ReasonNotAuthorized, fmt.Sprintf("%d %s", code, reason), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("alice refused %s after her binding was deleted", time.Since(removed).Round(time.Millisecond))
}

// hitCounter is a listener that counts the requests it gets (plain HTTP
// and TLS), the target a redirect points at.
type hitCounter struct {
	*httptest.Server
	hits atomic.Int32
}

func newHitCounter(t *testing.T, tlsServer bool) *hitCounter {
	h := &hitCounter{}
	h.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		t.Logf("the redirect target got %s %s with headers %v", r.Method, r.URL, r.Header)
	}))
	if tlsServer {
		h.StartTLS()
	} else {
		h.Start()
	}
	t.Cleanup(h.Close)
	return h
}

// TestMountRedirects: a tenant that redirects /version and API requests
// (to another server, and to another workspace on kcp-front-proxy): the
// probe does not follow, kcp's clients get the shim's 502 TenantRedirect
// and never the Location, and nothing reaches the redirect target.
func TestMountRedirects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.frontProxy == nil {
		t.Skip("no mount topology: the suite starts one with its own kcp; for an existing kcp set KNOTLESS_E2E_FRONT_PROXY_URL and the shim's settings (e2e/framework/external.go)")
	}
	target, plain := newHitCounter(t, true), newHitCounter(t, false)
	var redirectVersion atomic.Bool
	tenant := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			if redirectVersion.Load() {
				http.Redirect(w, r, plain.URL+"/version", http.StatusFound)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"major":"1","minor":"32","gitVersion":"v1.32.0-redirector"}`)
			return
		}
		// Another workspace behind the same kcp-front-proxy (client-go
		// would follow it with the caller's certificate and body), or
		// another server.
		if r.Method == http.MethodPost {
			http.Redirect(w, r, env.frontProxy.URL+"/clusters/root/api/v1/namespaces", http.StatusTemporaryRedirect)
			return
		}
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusMovedPermanently)
	}))
	t.Cleanup(tenant.Close)
	c, cfg, hc := mountTestServer(ctx, t, tenant, env.prefix+"-mount-redirect", "redirector")
	// A client that follows redirects, as client-go does. kcp-front-proxy
	// routes the mount once the mount workspace is Ready.
	send := func(ctx context.Context, method, path string) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(ctx, method, cfg.Host+path, strings.NewReader(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}`))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	if err := framework.Eventually(ctx, time.Minute, "kcp-front-proxy to route the mount", func(ctx context.Context) (bool, string, error) {
		resp, body := send(ctx, http.MethodGet, "/version")
		return resp.StatusCode == 200, resp.Status + " " + body, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		resp, body := send(ctx, method, "/api/v1/namespaces")
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(mountproxy.ReasonHeader) != mountproxy.ReasonTenantRedirect || resp.Header.Get("Location") != "" {
			t.Errorf("%s through the mount: %d %s Location %q: %s", method, resp.StatusCode, resp.Header.Get(mountproxy.ReasonHeader), resp.Header.Get("Location"), body)
		}
	}
	// The tenant now redirects the probe's /version: the probe does not
	// follow and reports it.
	redirectVersion.Store(true)
	tc := waitTenant(ctx, t, c, "redirector", computev1alpha1.ReasonTenantRedirect, time.Minute)
	t.Logf("TenantCluster after /version redirects: phase %s", tc.Status.Phase)
	time.Sleep(3 * time.Second) // another probe
	if n := target.hits.Load() + plain.hits.Load(); n != 0 {
		t.Fatalf("the redirect targets got %d requests", n)
	}
}

// TestMountLoop: a TenantCluster whose URL is kcp-front-proxy's own
// /tenants/ path (with a kcp user's certificate as its credential) is
// refused at dial time, without a loop: the shim sees one request per
// probe, not a chain.
func TestMountLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.frontProxy == nil {
		t.Skip("no mount topology: the suite starts one with its own kcp; for an existing kcp set KNOTLESS_E2E_FRONT_PROXY_URL and the shim's settings (e2e/framework/external.go)")
	}
	shop := env.prefix + "-mount-loop"
	c, lc := appWorkspace(ctx, t, shop)
	grantEnter(ctx, t, c, "alice")
	alice, err := env.certs.UserCA.IssueUser("alice")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := framework.PEMs(alice)
	if err != nil {
		t.Fatal(err)
	}
	fpCA, err := os.ReadFile(env.certs.FPServingCAFile)
	if err != nil {
		t.Fatal(err)
	}
	loopURL := env.frontProxy.URL + "/tenants/" + lc + "/loop"
	create(ctx, t, c,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "loop-ca", Namespace: "default"}, Data: map[string]string{"ca.crt": string(fpCA)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "loop-credential", Namespace: "default", Labels: map[string]string{computev1alpha1.LabelMountCredential: "loop"}},
			Data: map[string][]byte{"tls.crt": crt, "tls.key": key, computev1alpha1.MountCredentialCAKey: fpCA, computev1alpha1.MountCredentialURLKey: []byte(loopURL)}},
		&computev1alpha1.TenantCluster{
			ObjectMeta: metav1.ObjectMeta{Name: "loop"},
			Spec: computev1alpha1.TenantClusterSpec{
				URL:        loopURL,
				CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "loop-ca", Key: "ca.crt"},
				Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "loop-credential"}},
			},
		})
	tc := waitTenant(ctx, t, c, "loop", computev1alpha1.ReasonAddressNotAllowed, 2*time.Minute)
	cond := ""
	for _, cd := range tc.Status.Conditions {
		cond += cd.Message
	}
	t.Logf("TenantCluster loop: phase %s: %s", tc.Status.Phase, cond)
	before := shimRequests(t)
	const wait = 8 * time.Second // four probe intervals
	time.Sleep(wait)
	after := shimRequests(t)
	t.Logf("the shim saw %d requests in %s with the looping TenantCluster (probe interval 2s)", after-before, wait)
	// Every other mount test's probes run too; a loop would make hundreds.
	if after-before > 40 {
		t.Fatalf("the shim saw %d requests in %s: a forwarding loop", after-before, wait)
	}
	metrics, err := env.mountProxy.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `outcome="AddressNotAllowed"`) {
		t.Error("no AddressNotAllowed outcome in the shim's metrics")
	}
}

// shimRequests sums knotless_mountproxy_requests_total over outcomes.
func shimRequests(t *testing.T) int {
	t.Helper()
	m, err := env.mountProxy.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return int(framework.MetricSum(m, "knotless_mountproxy_requests_total"))
}

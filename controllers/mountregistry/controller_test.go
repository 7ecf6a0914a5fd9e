package mountregistry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/mountproxy"
)

const (
	lc          = "2x7uf0bml0q9ms3b"
	userHeader  = "X-Knotless-0123456789abcdef-User"
	groupHeader = "X-Knotless-0123456789abcdef-Group"
	extraPrefix = "X-Knotless-0123456789abcdef-Extra-"
)

// tenantServer is a tenant apiserver over TLS that records the
// Authorization header of every request.
type tenantServer struct {
	*httptest.Server
	ca   *framework.CA
	mu   sync.Mutex
	auth []string
}

func startTenant(t *testing.T) *tenantServer {
	t.Helper()
	ts := &tenantServer{ca: newCA(t, "tenant")}
	cert, err := ts.ca.Issue("tenant", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ts.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.mu.Lock()
		ts.auth = append(ts.auth, r.Header.Get("Authorization"))
		ts.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"APIVersions"}`))
	}))
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts
}

func (ts *tenantServer) authorizations() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.auth...)
}

func newCA(t *testing.T, name string) *framework.CA {
	t.Helper()
	ca, err := framework.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// shim is a mount proxy on the registry, called in-process as
// kcp-front-proxy would call it.
type shim struct {
	t     *testing.T
	srv   *mountproxy.Server
	proxy *x509.Certificate // kcp-front-proxy's client certificate
}

func newShim(t *testing.T, reg *mountproxy.Registry) *shim {
	t.Helper()
	dir := t.TempDir()
	serving, header := newCA(t, "serving"), newCA(t, "requestheader")
	cert, err := serving.Issue("mountproxy", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := framework.PEMs(cert)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"serving.crt": crt, "serving.key": key, "requestheader-ca.crt": header.PEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	proxy, err := header.Issue("kcp-front-proxy")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mountproxy.New(mountproxy.Options{
		Files:        mountproxy.Files{ServingCert: filepath.Join(dir, "serving.crt"), ServingKey: filepath.Join(dir, "serving.key"), RequestHeaderCA: filepath.Join(dir, "requestheader-ca.crt")},
		AllowedNames: []string{"kcp-front-proxy"},
		Registry:     reg,
		Authorizer:   mountproxy.AuthorizerFunc(func(context.Context, string, *mountproxy.Caller) (bool, error) { return true, nil }),
		Headers:      mountproxy.Headers{User: userHeader, Group: groupHeader, ExtraPrefix: extraPrefix},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &shim{t: t, srv: srv, proxy: proxy.Leaf}
}

// get requests path of the tenant through the shim as alice and returns
// the status and the shim's reason header.
func (s *shim) get(path string) (int, string) {
	s.t.Helper()
	req := httptest.NewRequest(http.MethodGet, "https://mountproxy/tenants/"+lc+"/tenant"+path, nil)
	req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{s.proxy}}
	req.Header.Set(userHeader, "alice")
	w := httptest.NewRecorder()
	s.srv.ServeHTTP(w, req)
	return w.Code, w.Header().Get(mountproxy.ReasonHeader)
}

type fixture struct {
	r      *Reconciler
	ws     *clustertest.Cluster
	reg    *mountproxy.Registry
	tenant *tenantServer
	shim   *shim
}

// newFixture is a workspace with a TenantCluster of a running tenant, its
// CA ConfigMap and token Secret, and an empty registry.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	ts := startTenant(t)
	tc := &computev1alpha1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant", UID: "tc-uid"},
		Spec: computev1alpha1.TenantClusterSpec{
			URL:        ts.URL,
			CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "ca", Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "cred"}},
		},
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ca"}, Data: map[string]string{"ca.crt": string(ts.ca.PEM)}}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cred", Labels: map[string]string{computev1alpha1.LabelMountCredential: "tenant"}},
		Data: map[string][]byte{"token": []byte("tenant-token"), computev1alpha1.MountCredentialCAKey: ts.ca.PEM, computev1alpha1.MountCredentialURLKey: []byte(ts.URL)}}
	ws := clustertest.New(tc, cm, sec)
	reg := mountproxy.NewRegistry(t.Context(), mountproxy.RegistryOptions{Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)})
	return &fixture{
		r:  &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}), Registry: reg},
		ws: ws, reg: reg, tenant: ts, shim: newShim(t, reg),
	}
}

func (f *fixture) reconcile(t *testing.T) {
	t.Helper()
	res, err := f.r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: "tenant"}}})
	if err != nil || res != (reconcile.Result{}) {
		t.Fatalf("Reconcile: %+v, %v", res, err)
	}
}

// registered checks that the tenant is registered with its URL, CA and
// token: a request through the shim reaches it with the token.
func (f *fixture) registered(t *testing.T) {
	t.Helper()
	if n := f.reg.Len(); n != 1 {
		t.Fatalf("%d tenants registered, want 1", n)
	}
	before := len(f.tenant.authorizations())
	if code, reason := f.shim.get("/api"); code != http.StatusOK || reason != "" {
		t.Fatalf("request through the shim: %d %s", code, reason)
	}
	got := f.tenant.authorizations()
	if len(got) != before+1 || got[len(got)-1] != "Bearer tenant-token" {
		t.Fatalf("the tenant saw Authorization %q, want the TenantCluster's token", got)
	}
}

// revoked checks that the shim refuses the tenant as revoked.
func (f *fixture) revoked(t *testing.T) {
	t.Helper()
	if n := f.reg.Len(); n != 0 {
		t.Fatalf("%d tenants registered, want 0", n)
	}
	before := len(f.tenant.authorizations())
	if code, reason := f.shim.get("/api"); code != http.StatusForbidden || reason != mountproxy.ReasonRevoked {
		t.Fatalf("request through the shim: %d %s, want 403 %s", code, reason, mountproxy.ReasonRevoked)
	}
	if len(f.tenant.authorizations()) != before {
		t.Fatal("a request reached the revoked tenant")
	}
}

// A TenantCluster with its CA and token becomes a tenant of the shim;
// deleting its Secret revokes it, and restoring the Secret registers it
// again.
func TestTenantClusterIsRegisteredAndRevokedWithItsSecret(t *testing.T) {
	f := newFixture(t)
	if code, reason := f.shim.get("/api"); code != http.StatusNotFound || reason != mountproxy.ReasonUnknownTenant {
		t.Fatalf("before the reconcile: %d %s, want 404 %s", code, reason, mountproxy.ReasonUnknownTenant)
	}
	f.reconcile(t)
	f.registered(t)

	ctx := context.Background()
	sec := &corev1.Secret{}
	if err := f.ws.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "cred"}, sec); err != nil {
		t.Fatal(err)
	}
	if err := f.ws.Client.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	f.revoked(t)

	sec.ResourceVersion = ""
	if err := f.ws.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	f.registered(t)
}

// A deleted TenantCluster, or one being deleted, is revoked.
func TestDeletedTenantClusterIsRevoked(t *testing.T) {
	for _, tc := range []struct {
		name       string
		finalizers []string
	}{
		{"gone", nil},
		{"being deleted", []string{"compute.knotless.dev/mount"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.reconcile(t)
			f.registered(t)
			ctx := context.Background()
			obj := &computev1alpha1.TenantCluster{}
			if err := f.ws.Client.Get(ctx, client.ObjectKey{Name: "tenant"}, obj); err != nil {
				t.Fatal(err)
			}
			if tc.finalizers != nil {
				obj.Finalizers = tc.finalizers
				if err := f.ws.Client.Update(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.ws.Client.Delete(ctx, obj); err != nil {
				t.Fatal(err)
			}
			f.reconcile(t)
			f.revoked(t)
		})
	}
}

// A workspace the getter does not know is an error (retried) and
// registers nothing.
func TestUnknownWorkspaceIsAnError(t *testing.T) {
	f := newFixture(t)
	_, err := f.r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: "other", Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: "tenant"}}})
	if err == nil {
		t.Fatal("a workspace the getter does not know reconciled without error")
	}
	if f.reg.Len() != 0 {
		t.Fatal("registered a tenant of an unknown workspace")
	}
}

// TestCAIsBoundToTheCredential (R22, from review): mallory, a member who
// may update TenantClusters and create ConfigMaps but not read Secrets,
// keeps the contract's TenantCluster's spec.url (so the credential Secret,
// bound to that URL, still matches) and points spec.caBundle at a
// ConfigMap of her own CA. Holding the network path to the tenant's
// address, her TLS server then passes for the tenant. The CA that
// verifies the tenant is the one bound in the credential Secret (its key
// ca.crt), so the shim refuses the tenant and her server never sees an
// Authorization header; the tenant's condition names neither the Secret
// nor its keys.
func TestCAIsBoundToTheCredential(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	mitm := startTenant(t) // mallory's server, with a certificate of her CA
	path := framework.NewPath(t, f.tenant.Listener.Addr().String())
	url := "https://" + path.Addr()

	// The contract's mount as the market writes it: the CA bound in the
	// credential Secret beside the token and the URL.
	tc := &computev1alpha1.TenantCluster{}
	if err := f.ws.Client.Get(ctx, client.ObjectKey{Name: "tenant"}, tc); err != nil {
		t.Fatal(err)
	}
	tc.Spec.URL = url
	tc.Spec.CABundle = computev1alpha1.KeyRef{Kind: "Secret", Namespace: "default", Name: "cred", Key: "ca.crt"}
	if err := f.ws.Client.Update(ctx, tc); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := f.ws.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "cred"}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data[computev1alpha1.MountCredentialURLKey] = []byte(url)
	sec.Data[computev1alpha1.MountCredentialCAKey] = f.tenant.ca.PEM
	if err := f.ws.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	f.registered(t)

	// mallory takes the network path and swaps the CA, keeping the URL.
	path.Route(mitm.Listener.Addr().String())
	if err := f.ws.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine"}, Data: map[string]string{"ca.crt": string(mitm.ca.PEM)}}); err != nil {
		t.Fatal(err)
	}
	if err := f.ws.Client.Get(ctx, client.ObjectKey{Name: "tenant"}, tc); err != nil {
		t.Fatal(err)
	}
	tc.Spec.CABundle = computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "mine", Key: "ca.crt"}
	if err := f.ws.Client.Update(ctx, tc); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	for range 3 {
		f.shim.get("/api")
	}
	if got := mitm.authorizations(); len(got) != 0 {
		t.Fatalf("mallory's server saw Authorization %q: the token was sent to a server her CA verifies", got)
	}
	f.revoked(t)

	_, err := tenant.Resolve(ctx, f.ws.Client, nil, lc, tc)
	var ce *conditions.Error
	if !errors.As(err, &ce) || ce.Reason != computev1alpha1.ReasonCABundleNotBound {
		t.Fatalf("Resolve: %v, want reason %s", err, computev1alpha1.ReasonCABundleNotBound)
	}
	if strings.Contains(ce.Message, "default/cred") || strings.Contains(ce.Message, computev1alpha1.MountCredentialCAKey) {
		t.Errorf("the condition names the credential Secret: %s", ce.Message)
	}
}

// A market contract's mount is registered with the credential the
// provider keeps for it, follows its renewal, and is revoked when it goes;
// a change of it is a change of its TenantCluster.
func TestMarketMountUsesTheProvidersCredential(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tc := &computev1alpha1.TenantCluster{}
	if err := f.ws.Client.Get(ctx, types.NamespacedName{Name: "tenant"}, tc); err != nil {
		t.Fatal(err)
	}
	tc.Spec.Credential.Market = true
	if err := f.ws.Client.Update(ctx, tc); err != nil {
		t.Fatal(err)
	}
	// The workspace's Secret holds the URL and CA alone.
	ws := &corev1.Secret{}
	if err := f.ws.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "cred"}, ws); err != nil {
		t.Fatal(err)
	}
	delete(ws.Data, "token")
	if err := f.ws.Client.Update(ctx, ws); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	f.revoked(t) // no credential kept for it yet
	cred := tenant.MarketCredential{LogicalCluster: lc, Name: "tenant", URL: f.tenant.URL, CA: f.tenant.ca.PEM, Token: "tenant-token", Users: []string{"alice"}}
	market := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(cred.Secret()).Build()
	f.r.Market = market
	f.reconcile(t)
	f.registered(t)

	sec := cred.Secret()
	if got := marketToTenant(ctx, sec); len(got) != 1 || got[0].ClusterName != lc || got[0].Name != "tenant" {
		t.Fatalf("a change of the credential maps to %+v", got)
	}
	cred.Token = "renewed"
	if err := market.Update(ctx, cred.Secret()); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	if code, _ := f.shim.get("/api"); code != http.StatusOK || f.tenant.authorizations()[len(f.tenant.authorizations())-1] != "Bearer renewed" {
		t.Fatalf("after the renewal: %d %v", code, f.tenant.authorizations())
	}
	if err := market.Delete(ctx, cred.Secret()); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	f.revoked(t)
}

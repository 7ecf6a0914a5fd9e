package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/mountproxy"
)

var (
	tenantOnce sync.Once
	tenantKCP  *framework.KCP
	tenantErr  error
)

// sharedTenant starts the tenant apiserver (a second `kcp start` with its
// own self-signed CA) once for the mount tests, lets user alice list and
// watch namespaces on it, and lets token user bob (the shim's credential)
// impersonate.
func sharedTenant(ctx context.Context, t *testing.T) *framework.KCP {
	t.Helper()
	if env.frontProxy == nil {
		t.Skip("no mount topology: the suite starts one with its own kcp; for an existing kcp set KNOTLESS_E2E_FRONT_PROXY_URL and the shim's settings (e2e/framework/external.go)")
	}
	tenantOnce.Do(func() {
		start := time.Now()
		if tenantKCP, tenantErr = framework.StartTenantKCP(ctx, env.group, env.kcpBin, env.dir); tenantErr != nil {
			return
		}
		t.Logf("tenant kcp ready in %s at %s", time.Since(start).Round(time.Millisecond), tenantKCP.BaseURL)
		var c client.Client
		cfg, err := tenantKCP.Config()
		if err != nil {
			tenantErr = err
			return
		}
		if c, tenantErr = framework.ClientFor(cfg, root); tenantErr != nil {
			return
		}
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e:namespace-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}}},
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e:namespace-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}},
		}
		impersonator := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e:impersonator"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}},
				// Extra keys contain a slash (authentication.kubernetes.io/credential-id).
				{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"impersonate"}},
			},
		}
		shim := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e:impersonator"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: impersonator.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "bob"}},
		}
		for _, o := range []client.Object{role, binding, impersonator, shim} {
			if tenantErr = c.Create(ctx, o); tenantErr != nil {
				return
			}
		}
	})
	if tenantErr != nil {
		t.Fatalf("tenant kcp: %v", tenantErr)
	}
	return tenantKCP
}

// tenantAccess returns the tenant's CA bundle and the token the shim uses
// on it (user bob, who may impersonate in root and do nothing else; the
// token survives a restart of the tenant).
func tenantAccess(t *testing.T, k *framework.KCP) (caPEM []byte, token string) {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(filepath.Dir(k.Kubeconfig), "apiserver.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return ca, k.Tokens["bob"]
}

// tenantCluster creates the CA ConfigMap, the credential Secret (bound to
// url and the CA) and the TenantCluster in a workspace, and lets alice enter the workspace (the
// shim forwards only callers kcp lets in).
func tenantCluster(ctx context.Context, t *testing.T, c client.Client, name, url string, caPEM []byte, token string) {
	t.Helper()
	grantEnter(ctx, t, c, "alice")
	create(ctx, t, c,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-ca", Namespace: "default"}, Data: map[string]string{"ca.crt": string(caPEM)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-credential", Namespace: "default", Labels: map[string]string{computev1alpha1.LabelMountCredential: name}},
			Data: map[string][]byte{"token": []byte(token), computev1alpha1.MountCredentialCAKey: caPEM, computev1alpha1.MountCredentialURLKey: []byte(url)}},
		&computev1alpha1.TenantCluster{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: computev1alpha1.TenantClusterSpec{
				URL:        url,
				CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: name + "-ca", Key: "ca.crt"},
				Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: name + "-credential"}},
			},
		})
}

// grantEnter lets user enter the workspace of c (verb access on /, what
// kcp checks and the shim asks kcp about), once per workspace.
func grantEnter(ctx context.Context, t *testing.T, c client.Client, user string) {
	t.Helper()
	name := "e2e:enter:" + user
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{mountproxy.EnterPath}, Verbs: []string{mountproxy.EnterVerb}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// frontProxyCert is kcp-front-proxy's client certificate towards the shim.
func frontProxyCert(t *testing.T) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(env.certs.FPToShim.Cert, env.certs.FPToShim.Key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitTenant waits until the TenantCluster's Ready condition has reason.
func waitTenant(ctx context.Context, t *testing.T, c client.Client, name, reason string, timeout time.Duration) *computev1alpha1.TenantCluster {
	t.Helper()
	tc := &computev1alpha1.TenantCluster{}
	last := ""
	err := framework.Eventually(ctx, timeout, "TenantCluster "+name+" "+reason, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, tc); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(tc.Status.Conditions, computev1alpha1.ConditionReady)
		if cond == nil {
			return false, "no Ready condition", nil
		}
		last = fmt.Sprintf("phase %s, Ready %s/%s: %s", tc.Status.Phase, cond.Status, cond.Reason, cond.Message)
		return cond.Reason == reason, last, nil
	})
	if err != nil {
		failWithLogs(t)
		t.Fatal(err)
	}
	return tc
}

// readyTenant is a workspace with a Ready TenantCluster "tenant" on the
// shared tenant kcp.
type readyTenant struct {
	kcp   *framework.KCP
	caPEM []byte
	token string
	c     client.Client
	ws    string // the workspace's name in root
	lc    string // and its logical cluster
}

func newReadyTenant(ctx context.Context, t *testing.T, ws string) *readyTenant {
	t.Helper()
	rt := &readyTenant{kcp: sharedTenant(ctx, t), ws: ws}
	rt.caPEM, rt.token = tenantAccess(t, rt.kcp)
	rt.c, rt.lc = appWorkspace(ctx, t, ws)
	tenantCluster(ctx, t, rt.c, "tenant", rt.kcp.BaseURL+"/clusters/root", rt.caPEM, rt.token)
	waitTenant(ctx, t, rt.c, "tenant", computev1alpha1.ReasonReady, 2*time.Minute)
	return rt
}

// shimClient calls the shim directly with the given client certificate
// (none when nil).
func shimClient(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.certs.ShimServingCA.PEM)
	cfg := &tls.Config{RootCAs: pool}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

func TestMountedTenant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	tenant := sharedTenant(ctx, t)
	caPEM, token := tenantAccess(t, tenant)
	shop := env.prefix + "-mount-shop"
	c, lc := appWorkspace(ctx, t, shop)

	start := time.Now()
	tenantCluster(ctx, t, c, "tenant", tenant.BaseURL+"/clusters/root", caPEM, token)
	tc := waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonReady, 2*time.Minute)
	t.Logf("TenantCluster Ready in %s: phase %s, URL %s, tenant %s", time.Since(start).Round(time.Millisecond), tc.Status.Phase, tc.Status.URL, tc.Status.TenantVersion)
	if want := env.frontProxy.URL + "/tenants/" + lc + "/tenant"; tc.Status.URL != want || tc.Status.Phase != computev1alpha1.PhaseReady {
		t.Fatalf("status.URL %q phase %q, want %q Ready", tc.Status.URL, tc.Status.Phase, want)
	}
	if m := meta.FindStatusCondition(tc.Status.Conditions, computev1alpha1.ConditionMounted); m == nil || m.Status != metav1.ConditionTrue {
		t.Fatalf("Mounted condition: %+v", m)
	}
	// R05: the status has one writer.
	managers := statusManagers(t, tc.ManagedFields)
	if len(managers) != 1 || len(managers["knotless-tenantcluster"]) == 0 {
		t.Fatalf("status writers of the TenantCluster: %v, want only knotless-tenantcluster", managers)
	}

	// kcp's mounts controller makes the child workspace Ready and routable.
	pc, err := framework.ClientFor(env.admin, root.Join(shop))
	if err != nil {
		t.Fatal(err)
	}
	ws := &tenancyv1alpha1.Workspace{}
	if err := framework.Eventually(ctx, 2*time.Minute, "workspace tenant Ready", func(ctx context.Context) (bool, string, error) {
		if err := pc.Get(ctx, client.ObjectKey{Name: "tenant"}, ws); err != nil {
			return false, err.Error(), nil
		}
		return ws.Status.Phase == "Ready" && ws.Spec.URL == tc.Status.URL, fmt.Sprintf("phase %s URL %s", ws.Status.Phase, ws.Spec.URL), nil
	}); err != nil {
		t.Fatal(err)
	}
	if ws.Spec.Mount == nil || ws.Spec.Mount.Reference.Kind != "TenantCluster" || ws.Spec.Mount.Reference.Name != "tenant" {
		t.Fatalf("workspace tenant does not mount the TenantCluster: %+v", ws.Spec.Mount)
	}
	if ws.Annotations[tenancyv1alpha1.ExperimentalWorkspaceOwnerAnnotationKey] == "" {
		t.Error("the mount workspace has no owner annotation (R15)")
	}
	if ref := metav1.GetControllerOf(ws); ref == nil || ref.UID != tc.UID || ref.Kind != "TenantCluster" {
		t.Errorf("the mount workspace's controller reference is %+v, want the TenantCluster (R07)", ref)
	}

	// alice, through kcp-front-proxy, at the mounted workspace's kcp path.
	mounted := root.Join(shop).Join("tenant").String()
	cfg, err := env.frontProxy.UserConfig("alice", mounted)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	var nss *corev1.NamespaceList
	if err := framework.Eventually(ctx, time.Minute, "namespaces through the mount", func(ctx context.Context) (bool, string, error) {
		nss, err = cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range nss.Items {
		names = append(names, ns.Name)
	}
	if !slices.Contains(names, "default") {
		t.Fatalf("namespaces through the mount: %v, want the tenant's default", names)
	}
	t.Logf("namespaces of the tenant through kcp: %v", names)

	// A watch through the mount sees a namespace created on the tenant.
	w, err := cs.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{ResourceVersion: nss.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { w.Stop() }()
	tcfg, _ := tenant.Config()
	tcs := kubernetes.NewForConfigOrDie(tcfg)
	created := time.Now()
	if _, err := tcs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "made-on-tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch through the mount closed")
			}
			if ns, isNS := ev.Object.(*corev1.Namespace); isNS && ev.Type == watch.Added && ns.Name == "made-on-tenant" {
				seen = true
				t.Logf("watch event through the mount %s after the create on the tenant", time.Since(created).Round(time.Millisecond))
			}
		case <-timeout:
			t.Fatal("no watch event for the namespace created on the tenant")
		}
	}

	// whoami (what kubectl auth whoami asks) through the mount: the tenant
	// sees the kcp user, not the shim's credential.
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("whoami through the mount: %s %v", review.Status.UserInfo.Username, review.Status.UserInfo.Groups)
	if review.Status.UserInfo.Username != "alice" || !slices.Contains(review.Status.UserInfo.Groups, "system:authenticated") {
		t.Fatalf("the tenant sees %+v, want alice", review.Status.UserInfo)
	}

	// Direct requests to the shim that must be refused by the shim itself.
	probe, err := tls.LoadX509KeyPair(env.certs.Probe.Cert, env.certs.Probe.Key)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := env.certs.UserCA.Issue("kcp-front-proxy")
	if err != nil {
		t.Fatal(err)
	}
	fp := frontProxyCert(t)
	_, otherLC := appWorkspace(ctx, t, env.prefix+"-mount-other")
	path := "/tenants/" + lc + "/tenant/api/v1/namespaces"
	user := env.certs.UserHeader
	for _, tt := range []struct {
		name   string
		cert   *tls.Certificate
		path   string
		header map[string]string
		code   int
		reason string
	}{
		{"no client certificate, spoofed identity", nil, path, map[string]string{user: "alice", "X-Remote-User": "alice"}, 401, mountproxy.ReasonNoClientCertificate},
		{"certificate of another CA", &stranger, path, map[string]string{user: "alice"}, 401, mountproxy.ReasonUntrustedClient},
		{"trusted certificate, no identity", &fp, path, nil, 401, mountproxy.ReasonNoIdentity},
		{"trusted certificate, only the standard X-Remote-User", &fp, path, map[string]string{"X-Remote-User": "alice"}, 401, mountproxy.ReasonNoIdentity},
		{"another workspace's path, which alice may not enter", &fp, "/tenants/" + otherLC + "/tenant/api/v1/namespaces", map[string]string{user: "alice"}, 403, mountproxy.ReasonNotAuthorized},
		{"the probe's certificate as alice", &probe, path, map[string]string{user: "alice"}, 403, mountproxy.ReasonProbeNotAllowed},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+env.mountProxy.Addr+tt.path, nil)
		for k, v := range tt.header {
			req.Header.Set(k, v)
		}
		resp, err := shimClient(t, tt.cert).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || resp.Header.Get(mountproxy.ReasonHeader) != tt.reason {
			t.Errorf("%s: %d %s (%s), want %d %s", tt.name, resp.StatusCode, resp.Header.Get(mountproxy.ReasonHeader), body, tt.code, tt.reason)
		}
	}

	// Revocation: deleting the credential makes the shim refuse the tenant
	// at once (refused by the shim, not the tenant) and the TenantCluster
	// report Revoked.
	if err := c.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tenant-credential", Namespace: "default"}}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if err := framework.Eventually(ctx, 30*time.Second, "the shim to refuse the revoked tenant", func(ctx context.Context) (bool, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+env.mountProxy.Addr+path, nil)
		req.Header.Set(user, "alice")
		resp, err := shimClient(t, &fp).Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.Header.Get(mountproxy.ReasonHeader) == mountproxy.ReasonRevoked, resp.Status + " " + resp.Header.Get(mountproxy.ReasonHeader), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("shim refuses the tenant %s after its credential was deleted", time.Since(revoked).Round(time.Millisecond))
	metrics, err := env.mountProxy.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`knotless_mountproxy_requests_total{outcome="Forwarded"}`, `knotless_mountproxy_requests_total{outcome="Revoked"}`, `knotless_mountproxy_requests_total{outcome="NoClientCertificate"}`, "knotless_mountproxy_tenants "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("the shim's metrics have no %s", want)
		}
	}
	tc = waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonRevoked, time.Minute)
	if tc.Status.Phase != computev1alpha1.PhaseInitializing {
		t.Errorf("revoked TenantCluster phase %s, want Initializing", tc.Status.Phase)
	}
	// It stays Revoked over the next probes (2 s apart).
	time.Sleep(5 * time.Second)
	if err := c.Get(ctx, client.ObjectKeyFromObject(tc), tc); err != nil {
		t.Fatal(err)
	}
	if r := meta.FindStatusCondition(tc.Status.Conditions, computev1alpha1.ConditionReady); r == nil || r.Reason != computev1alpha1.ReasonRevoked {
		t.Errorf("5 s after the revocation: %+v, want Revoked", r)
	}
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("namespaces listed through the mount after revocation")
	}

	// Deleting the TenantCluster deletes its mount workspace.
	if err := c.Delete(ctx, tc); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, time.Minute, "the mount workspace to go", func(ctx context.Context) (bool, string, error) {
		ws := &tenancyv1alpha1.Workspace{}
		err := pc.Get(ctx, client.ObjectKey{Name: "tenant"}, ws)
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, fmt.Sprintf("%v: deletion %v finalizers %v phase %s conditions %+v", err, ws.DeletionTimestamp, ws.Finalizers, ws.Status.Phase, ws.Status.Conditions), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// recordingTenant is a TLS server standing in for a tenant apiserver that
// records the headers of every request it gets.
type recordingTenant struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newRecordingTenant(t *testing.T) *recordingTenant {
	rt := &recordingTenant{}
	rt.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt.mu.Lock()
		rt.headers = append(rt.headers, r.Header.Clone())
		rt.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/version" {
			fmt.Fprint(w, `{"major":"1","minor":"32","gitVersion":"v1.32.0-recording"}`)
			return
		}
		fmt.Fprint(w, `{"kind":"NamespaceList","apiVersion":"v1","metadata":{},"items":[]}`)
	}))
	t.Cleanup(rt.Close)
	return rt
}

func (rt *recordingTenant) last() http.Header {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.headers[len(rt.headers)-1]
}

// mountTestServer mounts a TLS test server as TenantCluster name (token
// "tenant-credential-token") in a new workspace ws, waits until it is
// Ready, and returns the workspace's client, alice's config for the mount
// workspace through kcp-front-proxy and an HTTP client with it.
func mountTestServer(ctx context.Context, t *testing.T, srv *httptest.Server, ws, name string) (client.Client, *rest.Config, *http.Client) {
	t.Helper()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	c, _ := appWorkspace(ctx, t, ws)
	tenantCluster(ctx, t, c, name, srv.URL, caPEM, "tenant-credential-token")
	waitTenant(ctx, t, c, name, computev1alpha1.ReasonReady, 2*time.Minute)
	cfg, err := env.frontProxy.UserConfig("alice", root.Join(ws).Join(name).String())
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	if hc.Transport, err = rest.TransportFor(cfg); err != nil {
		t.Fatal(err)
	}
	return c, cfg, hc
}

// TestMountHeaders sends a request with every kind of credential and
// identity header through kcp-front-proxy and the shim to a recording
// tenant: only the tenant credential and the impersonation of the kcp user
// arrive.
func TestMountHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.frontProxy == nil {
		t.Skip("no mount topology: the suite starts one with its own kcp; for an existing kcp set KNOTLESS_E2E_FRONT_PROXY_URL and the shim's settings (e2e/framework/external.go)")
	}
	rt := newRecordingTenant(t)
	_, cfg, hc := mountTestServer(ctx, t, rt.Server, env.prefix+"-mount-headers", "recorder")
	if err := framework.Eventually(ctx, time.Minute, "a request through the mount to reach the recorder", func(ctx context.Context) (bool, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/api/v1/namespaces", nil)
		for k, v := range map[string]string{
			"Authorization":           "Bearer caller-token",
			"Impersonate-User":        "system:admin",
			"Impersonate-Group":       "system:masters",
			"Impersonate-Extra-Scope": "everything",
			"X-Remote-Extra-Spoofed":  "yes",
		} {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && resp.Header.Get(mountproxy.ReasonHeader) == "", resp.Status, nil
	}); err != nil {
		t.Fatal(err)
	}
	h := rt.last()
	t.Logf("headers at the tenant: %v", h)
	if got := h.Get("Authorization"); got != "Bearer tenant-credential-token" {
		t.Errorf("Authorization at the tenant %q, want the tenant credential", got)
	}
	if got := h.Values("Impersonate-User"); len(got) != 1 || got[0] != "alice" {
		t.Errorf("Impersonate-User at the tenant %v, want [alice]", got)
	}
	for name, values := range h {
		if strings.HasPrefix(name, "X-Remote-") {
			t.Errorf("%s reached the tenant: %v", name, values)
		}
		if strings.HasPrefix(name, "Impersonate-") && slices.ContainsFunc(values, func(v string) bool {
			return v == "system:admin" || v == "system:masters" || v == "everything" || v == "yes" || v == "mallory"
		}) {
			t.Errorf("a caller's value reached the tenant in %s: %v", name, values)
		}
	}
}

// TestMountHealth: the probe's reasons for a tenant that stops and starts
// again, a tenant whose certificate is not issued by the TenantCluster's
// CA, and a credential the tenant rejects.
func TestMountHealth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	tenant := sharedTenant(ctx, t)
	caPEM, token := tenantAccess(t, tenant)
	c, lc := appWorkspace(ctx, t, env.prefix+"-mount-health")
	url := tenant.BaseURL + "/clusters/root"
	tenantCluster(ctx, t, c, "tenant", url, caPEM, token)
	tenantCluster(ctx, t, c, "wrong-ca", url, env.certs.ShimServingCA.PEM, token)
	tenantCluster(ctx, t, c, "bad-token", url, caPEM, "not-a-token")
	tenantCluster(ctx, t, c, "not-pem", url, []byte("not a certificate"), token)
	waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonReady, 2*time.Minute)
	tc := waitTenant(ctx, t, c, "not-pem", computev1alpha1.ReasonInvalidSpec, time.Minute)
	if tc.Status.Phase != computev1alpha1.PhaseInitializing {
		t.Errorf("a CA bundle without a certificate: phase %s, want Initializing", tc.Status.Phase)
	}
	// The tenant is on loopback, a private address: a certificate that
	// does not verify reads like no answer (issue 27 item 6).
	tc = waitTenant(ctx, t, c, "wrong-ca", computev1alpha1.ReasonTenantUnreachable, time.Minute)
	t.Logf("wrong CA: phase %s, %s", tc.Status.Phase, meta.FindStatusCondition(tc.Status.Conditions, computev1alpha1.ConditionReady).Message)
	tc = waitTenant(ctx, t, c, "bad-token", computev1alpha1.ReasonCredentialRejected, time.Minute)
	t.Logf("bad token: phase %s, %s", tc.Status.Phase, meta.FindStatusCondition(tc.Status.Conditions, computev1alpha1.ConditionReady).Message)

	tenant.Process.Stop(30 * time.Second)
	stopped := time.Now()
	tc = waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonTenantUnreachable, time.Minute)
	t.Logf("tenant stopped: %s after %s (probe interval 2s), phase %s", computev1alpha1.ReasonTenantUnreachable, time.Since(stopped).Round(time.Millisecond), tc.Status.Phase)
	if tc.Status.Phase != computev1alpha1.PhaseUnknown {
		t.Errorf("phase %s after the tenant stopped, want Unknown", tc.Status.Phase)
	}
	if err := tenant.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	tc = waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonReady, time.Minute)
	t.Logf("tenant started: Ready %s after it was ready, phase %s", time.Since(restarted).Round(time.Millisecond), tc.Status.Phase)

	// Deleting the TenantCluster revokes it at the shim at once.
	fp := frontProxyCert(t)
	shimGet := func() (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+env.mountProxy.Addr+"/tenants/"+lc+"/tenant/version", nil)
		req.Header.Set(env.certs.UserHeader, "alice")
		resp, err := shimClient(t, &fp).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(mountproxy.ReasonHeader)
	}
	if code, reason := shimGet(); code != 200 || reason != "" {
		t.Fatalf("before the deletion: %d %s", code, reason)
	}
	if err := c.Delete(ctx, tc); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := framework.Eventually(ctx, 30*time.Second, "the shim to refuse the deleted tenant", func(ctx context.Context) (bool, string, error) {
		code, reason := shimGet()
		return code == http.StatusForbidden && reason == mountproxy.ReasonRevoked, fmt.Sprintf("%d %s", code, reason), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("shim refuses the tenant %s after its TenantCluster was deleted", time.Since(deleted).Round(time.Millisecond))
}

// TestMountRotation replaces the shim's serving certificate and the
// tenant's CA bundle while a watch through the mount stays connected; new
// requests succeed and no process restarts.
func TestMountRotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.certs.External {
		t.Skip("rotates the serving certificate of the suite's own shim; an existing kcp's shim has its own")
	}
	rt := newReadyTenant(ctx, t, env.prefix+"-mount-rotation")
	tenant, caPEM, c, shop := rt.kcp, rt.caPEM, rt.c, rt.ws
	cfg, err := env.frontProxy.UserConfig("alice", root.Join(shop).Join("tenant").String())
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	var nss *corev1.NamespaceList
	if err := framework.Eventually(ctx, time.Minute, "namespaces through the mount", func(ctx context.Context) (bool, string, error) {
		nss, err = cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{ResourceVersion: nss.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	tcfg, err := tenant.Config()
	if err != nil {
		t.Fatal(err)
	}
	tcs := kubernetes.NewForConfigOrDie(tcfg)
	// expectEvent creates a namespace on the tenant and waits for it on
	// the watch (opened before any rotation; again after the tenant's CA
	// bundle changed).
	expectEvent := func(name string) {
		t.Helper()
		if _, err := tcs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatalf("the watch through the mount closed before %s", name)
				}
				if ns, isNS := ev.Object.(*corev1.Namespace); isNS && ns.Name == name {
					return
				}
			case <-timeout:
				t.Fatalf("no event for %s on the kept watch", name)
			}
		}
	}
	expectEvent(env.prefix + "-before-rotation")

	// The shim's serving certificate.
	servedSerial := func() string {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(env.certs.ShimServingCA.PEM)
		conn, err := tls.Dial("tcp", env.mountProxy.Addr, &tls.Config{RootCAs: pool})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := servedSerial()
	rotated, err := env.certs.RotateShimServing()
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 20*time.Second, "the shim to serve the new certificate", func(ctx context.Context) (bool, string, error) {
		got := servedSerial()
		return got == rotated.Leaf.SerialNumber.String(), "serving " + got, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("shim serving certificate %s replaced by %s without a restart", before, rotated.Leaf.SerialNumber)
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list through the mount after the shim's certificate rotated: %v", err)
	}
	expectEvent(env.prefix + "-after-serving-rotation")

	// The tenant's CA bundle: a new bundle that also holds another CA.
	other, err := framework.NewCA("e2e-other-tenant-ca")
	if err != nil {
		t.Fatal(err)
	}
	// The CA bundle is bound in the credential Secret (ca.crt) and must be
	// the one spec.caBundle names (R22, CABundleNotBound otherwise): whoever
	// rotates it writes both, the Secret first.
	setBundle := func(pemBytes []byte) {
		t.Helper()
		sec := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "tenant-credential"}, sec); err != nil {
			t.Fatal(err)
		}
		sec.Data[computev1alpha1.MountCredentialCAKey] = pemBytes
		if err := c.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "tenant-ca"}, cm); err != nil {
			t.Fatal(err)
		}
		cm.Data["ca.crt"] = string(pemBytes)
		if err := c.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	setBundle(append(append([]byte{}, other.PEM...), caPEM...))
	// The shim's registry follows the Secret and the ConfigMap. Between
	// the two writes the tenant is not used (CABundleNotBound), which ends
	// its requests: the kept watch may close here (unlike across the
	// shim's own rotation above), so a client watches again.
	if err := framework.Eventually(ctx, time.Minute, "a list through the mount after the tenant CA bundle changed", func(ctx context.Context) (bool, string, error) {
		nss, err = cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	w.Stop()
	if w, err = cs.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{ResourceVersion: nss.ResourceVersion}); err != nil {
		t.Fatal(err)
	}
	expectEvent(env.prefix + "-after-ca-rotation")
	// The new bundle is the one in use: without the tenant's CA the
	// tenant's certificate no longer verifies (TenantUnreachable, as for
	// any failed handshake with a tenant at a private address).
	setBundle(other.PEM)
	waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonTenantUnreachable, time.Minute)
	setBundle(caPEM)
	waitTenant(ctx, t, c, "tenant", computev1alpha1.ReasonReady, time.Minute)
}

// TestMountProxyThroughput prints GET latency and requests/s of one
// namespace on the real tenant apiserver (a `kcp start`): straight to the
// tenant, through the shim, and through kcp-front-proxy and the shim, same
// client, same run, with the ratios. The direct client sends what the shim
// sends (the tenant credential and the impersonation headers), so both
// sides cost the tenant the same. Run with KNOTLESS_E2E_MOUNT_BENCH=N
// (make bench-mountproxy).
func TestMountProxyThroughput(t *testing.T) {
	if os.Getenv("KNOTLESS_E2E_MOUNT_BENCH") == "" {
		t.Skip("set KNOTLESS_E2E_MOUNT_BENCH=N (make bench-mountproxy) to run")
	}
	var n int
	_, _ = fmt.Sscan(os.Getenv("KNOTLESS_E2E_MOUNT_BENCH"), &n) // not a number: the minimum
	n = max(n, 200)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.mountProxy == nil || env.mountProxy.Process == nil {
		t.Skip("measures the CPU of the suite's own shim process")
	}
	ready := newReadyTenant(ctx, t, env.prefix+"-mount-bench")
	tenant, caPEM, token, shop, lc := ready.kcp, ready.caPEM, ready.token, ready.ws, ready.lc

	client := func(roots []byte, cert *tls.Certificate) *http.Client {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(roots)
		cfg := &tls.Config{RootCAs: pool}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 64}}
	}
	const object = "/api/v1/namespaces/default"
	// The shim authorizes every request (a SubjectAccessReview, cached).
	fp := frontProxyCert(t)
	cfg, err := env.frontProxy.UserConfig("alice", root.Join(shop).Join("tenant").String())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	targets := []framework.Target{
		{Name: "direct", Client: client(caPEM, nil), URL: tenant.BaseURL + "/clusters/root" + object, Header: http.Header{
			"Authorization": {"Bearer " + token}, "Impersonate-User": {"alice"}, "Impersonate-Group": {"system:authenticated"},
		}},
		{Name: "through the shim", Client: client(env.certs.ShimServingCA.PEM, &fp), URL: "https://" + env.mountProxy.Addr + "/tenants/" + lc + "/tenant" + object, Header: http.Header{
			env.certs.UserHeader: {"alice"}, env.certs.GroupHeader: {"system:authenticated"},
		}},
		{Name: "through kcp-front-proxy and the shim", Client: &http.Client{Timeout: 30 * time.Second, Transport: rt}, URL: cfg.Host + object},
	}
	figures, err := framework.MeasureGET(n, targets...)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range framework.CompareGET(targets, figures) {
		t.Log("FIGURE " + line)
	}
	// Where the CPU goes at full load (all on the same cores): the
	// tenant's and the shim's CPU time per request.
	for _, target := range targets[:2] {
		tenantBefore, err1 := tenant.Process.CPU()
		shimBefore, err2 := env.mountProxy.CPU()
		perSec, err3 := framework.Throughput(target, n)
		tenantAfter, err4 := tenant.Process.CPU()
		shimAfter, err5 := env.mountProxy.CPU()
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			t.Fatal(err)
		}
		per := func(d time.Duration) time.Duration { return (d / time.Duration(n/16*16)).Round(time.Microsecond) }
		t.Logf("FIGURE CPU per request %s: tenant kcp %s, shim %s (%.0f requests/s)", target.Name, per(tenantAfter-tenantBefore), per(shimAfter-shimBefore), perSec)
	}
}

// TestMountProxyBadFlags: knotless-mountproxy with unusable flags exits 1
// with one line naming the problem.
func TestMountProxyBadFlags(t *testing.T) {
	if env.mountProxy == nil || env.mountProxy.Process == nil {
		t.Skip("runs the shim binary the suite built (a kcp the suite starts)")
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.crt")
	if err := os.WriteFile(junk, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := env.certs
	tlsFiles := []string{"--kubeconfig", env.kcp.Kubeconfig, "--tls-cert-file", m.ShimServing.Cert, "--tls-private-key-file", m.ShimServing.Key, "--requestheader-client-ca-file", m.ShimRequestCAFile}
	headers := []string{"--requestheader-username-headers", m.UserHeader, "--requestheader-group-headers", m.GroupHeader, "--requestheader-extra-headers-prefix", m.ExtraHeaderPrefix}
	with := func(base []string, more ...string) []string {
		return append(append(slices.Clone(base), headers...), more...)
	}
	expectBadFlags(t, env.mountProxy.Bin, []string{"--bind-address", "127.0.0.1:0", "--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, []badFlags{
		{"no TLS files", []string{"--kubeconfig", env.kcp.Kubeconfig}, "are required"},
		{"no identity header names", tlsFiles, "is required"},
		{"the standard identity header names", append(slices.Clone(tlsFiles), "--requestheader-username-headers", "X-Remote-User", "--requestheader-group-headers", "X-Remote-Group", "--requestheader-extra-headers-prefix", "X-Remote-Extra-"), "standard name"},
		{"a guessable user header", append(slices.Clone(tlsFiles), "--requestheader-username-headers", "X-User", "--requestheader-group-headers", m.GroupHeader, "--requestheader-extra-headers-prefix", m.ExtraHeaderPrefix), "shorter than"},
		{"Impersonate-User as the user header", append(slices.Clone(tlsFiles), "--requestheader-username-headers", "Impersonate-User-0123456789abcdef", "--requestheader-group-headers", m.GroupHeader, "--requestheader-extra-headers-prefix", m.ExtraHeaderPrefix), "standard name"},
		{"metadata range allowed", with(tlsFiles, "--allow-private-networks", "169.254.0.0/16"), "only loopback, private and shared ranges"},
		{"unresolvable reserved address", with(tlsFiles, "--reserved-addresses", "front-proxy.invalid:443"), "--reserved-addresses"},
		{"no authorization cache", with(tlsFiles, "--authorization-cache-size", "0"), "must be positive"},
		{"serving certificate is not a certificate", with([]string{"--kubeconfig", env.kcp.Kubeconfig, "--tls-cert-file", junk, "--tls-private-key-file", m.ShimServing.Key, "--requestheader-client-ca-file", m.ShimRequestCAFile}), "certificate"},
		{"requestheader CA is not a certificate", with([]string{"--kubeconfig", env.kcp.Kubeconfig, "--tls-cert-file", m.ShimServing.Cert, "--tls-private-key-file", m.ShimServing.Key, "--requestheader-client-ca-file", junk}), "no PEM certificate"},
		{"path prefix without slashes", with(tlsFiles, "--path-prefix", "tenants"), "must start and end with /"},
		{"invalid workspace path", []string{"--kubeconfig", env.kcp.Kubeconfig, "--workspace", "root:Not_Valid"}, "not a valid workspace path"},
	})
}

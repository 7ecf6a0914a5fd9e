package e2e

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// authRecorder is a hostile tenant on loopback: it records the
// Authorization header of every request and answers /version.
type authRecorder struct {
	*httptest.Server
	mu    sync.Mutex
	auth  []string
	conns int
}

func newAuthRecorder(t *testing.T) *authRecorder {
	a := &authRecorder{}
	a.Server = httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

// newAuthRecorderOf is an authRecorder whose serving certificate (for
// 127.0.0.1) ca issued; it also counts the connections it accepts.
func newAuthRecorderOf(t *testing.T, ca *framework.CA) *authRecorder {
	t.Helper()
	cert, err := ca.Issue("tenant", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	a := &authRecorder{}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	a.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	a.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			a.mu.Lock()
			a.conns++
			a.mu.Unlock()
		}
	}
	a.StartTLS()
	t.Cleanup(a.Close)
	return a
}

func (a *authRecorder) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.auth = append(a.auth, r.Header.Get("Authorization"))
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"major":"1","minor":"32","gitVersion":"v1.32.0-hostile"}`)
}

// connections is how many connections an authRecorderOf accepted.
func (a *authRecorder) connections() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns
}

func (a *authRecorder) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.auth)
}

// TestMountCredentialReferences (R22, R16, R17): mallory, a member of the
// workspace who may create and update TenantClusters and ConfigMaps but
// not read Secrets, points TenantClusters at her own server on loopback
// (her CA in a ConfigMap) and names Secrets she cannot read: one of
// another namespace, one without the mount label, one labelled for
// another TenantCluster. She also updates the contract's TenantCluster,
// Ready on its own server with the Secret labelled for it, to her URL and
// CA. Through the real kcp, provider and mount proxy, none resolves
// (InvalidSpec / CredentialNotFound, for the contract Revoked, the
// message naming only what she wrote) and her server never receives
// their tokens: the contract's Secret is bound to its URL, not only to
// the TenantCluster's name. A Secret labelled for a TenantCluster and
// bound to its URL is sent to that server (the controls: the recording
// works).
func TestMountCredentialReferences(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.frontProxy == nil {
		t.Skip("no mount topology: the suite starts one with its own kcp; for an existing kcp set KNOTLESS_E2E_FRONT_PROXY_URL and the shim's settings (e2e/framework/external.go)")
	}
	hostile, own := newAuthRecorder(t), newAuthRecorder(t)
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hostile.Certificate().Raw}))
	ownCA := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: own.Certificate().Raw}))
	ws := env.prefix + "-mount-cred"
	c, _ := appWorkspace(ctx, t, ws)
	mallory := malloryClient(ctx, t, c, ws)

	// The victims' namespace: credentials of other mounts (and of a
	// market contract), which mallory may not read.
	secret := func(name, token, url string, labels map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "victims", Name: name, Labels: labels},
			Data: map[string][]byte{"token": []byte(token), computev1alpha1.MountCredentialURLKey: []byte(url), computev1alpha1.MountCredentialCAKey: []byte(caPEM)}}
	}
	create(ctx, t, c,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "victims"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mallory"}},
		secret("unlabelled", "token-unlabelled", hostile.URL, nil),
		secret("contract-tenant", "token-of-the-contract", own.URL, map[string]string{computev1alpha1.LabelMountCredential: "contract"}),
		secret("control", "token-control", hostile.URL, map[string]string{computev1alpha1.LabelMountCredential: "control"}),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "victims", Name: "contract-ca"}, Data: map[string]string{"ca.crt": ownCA}},
	)
	if err := mallory.Get(ctx, client.ObjectKey{Namespace: "victims", Name: "unlabelled"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Fatalf("mallory reads a Secret (%v): the test's premise is wrong", err)
	}
	tc := func(name, ns, cred string) *computev1alpha1.TenantCluster {
		return &computev1alpha1.TenantCluster{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: computev1alpha1.TenantClusterSpec{
				URL:        hostile.URL,
				CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: ns, Name: "mallory-ca", Key: "ca.crt"},
				Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "victims", Name: cred}},
			},
		}
	}
	for _, ns := range []string{"victims", "mallory"} {
		create(ctx, t, mallory, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mallory-ca"}, Data: map[string]string{"ca.crt": caPEM}})
	}
	create(ctx, t, mallory,
		tc("steal-foreign", "mallory", "unlabelled"),
		tc("steal-unlabelled", "victims", "unlabelled"),
		tc("steal-contract", "victims", "contract-tenant"),
	)
	// The control, made by the workspace's admin for its own Secret, and
	// the contract's TenantCluster on its own server.
	contract := tc("contract", "victims", "contract-tenant")
	contract.Spec.URL, contract.Spec.CABundle.Name = own.URL, "contract-ca"
	create(ctx, t, c, tc("control", "victims", "control"), contract)
	waitTenant(ctx, t, c, "contract", computev1alpha1.ReasonReady, 2*time.Minute)
	if !slices.Contains(own.seen(), "Bearer token-of-the-contract") {
		t.Fatalf("the contract's token never reached its own server (%q)", own.seen())
	}
	// mallory moves the contract's TenantCluster to her server and CA.
	editAsMallory(ctx, t, mallory, "contract", func(tc *computev1alpha1.TenantCluster) {
		tc.Spec.URL, tc.Spec.CABundle.Name = hostile.URL, "mallory-ca"
	})
	// It was Ready, so the credential it no longer resolves is a
	// revocation (the message a missing Secret's).
	got := waitTenant(ctx, t, c, "contract", computev1alpha1.ReasonRevoked, time.Minute)
	t.Logf("TenantCluster contract after mallory's update: phase %s, %s", got.Status.Phase, readyText(got))

	// The control is Ready: the provider's probe and the shim reach the
	// hostile server. Three more probe intervals for the others.
	waitTenant(ctx, t, c, "control", computev1alpha1.ReasonReady, 2*time.Minute)
	time.Sleep(6 * time.Second)
	seen := hostile.seen()
	t.Logf("the hostile server got %d requests", len(seen))
	for _, a := range seen {
		if a != "Bearer token-control" {
			t.Errorf("the hostile server got Authorization %q", a)
		}
	}
	if !slices.Contains(seen, "Bearer token-control") {
		t.Fatalf("the control's token never arrived (%q): the recording does not work", seen)
	}
	for name, reason := range map[string]string{
		"steal-foreign":    computev1alpha1.ReasonInvalidSpec,
		"steal-unlabelled": computev1alpha1.ReasonCredentialNotFound,
		"steal-contract":   computev1alpha1.ReasonCredentialNotFound,
	} {
		got := waitTenant(ctx, t, c, name, reason, 30*time.Second)
		t.Logf("TenantCluster %s: phase %s, %s", name, got.Status.Phase, readyText(got))
	}
}

// TestMountCASwapIsRefused (R22, from review): mallory, a member who may
// update TenantClusters and create ConfigMaps but not read Secrets, holds
// the network path to the address of the contract's Ready TenantCluster
// (a forwarder on loopback that she routes to her TLS server). Her server
// does not pass the tenant's CA, so she keeps spec.url (the credential
// Secret stays bound to it) and points spec.caBundle at a ConfigMap of her
// own CA. Through the real kcp, provider and mount proxy, the TenantCluster
// becomes CABundleNotBound (the CA that verifies a tenant is the one bound
// in its credential Secret, key ca.crt) and her server, which the shim and
// the probe do reach, never sees an Authorization header.
func TestMountCASwapIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer failWithLogs(t)
	if env.frontProxy == nil {
		t.Skip("no mount topology: the suite starts one with its own kcp; for an existing kcp set KNOTLESS_E2E_FRONT_PROXY_URL and the shim's settings (e2e/framework/external.go)")
	}
	tenantCA, err := framework.NewCA("tenant")
	if err != nil {
		t.Fatal(err)
	}
	malloryCA, err := framework.NewCA("mallory")
	if err != nil {
		t.Fatal(err)
	}
	own, hostile := newAuthRecorderOf(t, tenantCA), newAuthRecorderOf(t, malloryCA)
	path := framework.NewPath(t, own.Listener.Addr().String())
	url := "https://" + path.Addr()
	ws := env.prefix + "-mount-ca"
	c, _ := appWorkspace(ctx, t, ws)
	mallory := malloryClient(ctx, t, c, ws)

	// The contract's mount as the market writes it (deliver): the token,
	// the URL and the CA in one Secret labelled for the TenantCluster.
	create(ctx, t, c,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "contract-tenant", Labels: map[string]string{computev1alpha1.LabelMountCredential: "contract"}},
			Data: map[string][]byte{"token": []byte("token-of-the-contract"), computev1alpha1.MountCredentialURLKey: []byte(url), computev1alpha1.MountCredentialCAKey: tenantCA.PEM}},
		&computev1alpha1.TenantCluster{
			ObjectMeta: metav1.ObjectMeta{Name: "contract"},
			Spec: computev1alpha1.TenantClusterSpec{
				URL:        url,
				CABundle:   computev1alpha1.KeyRef{Kind: "Secret", Namespace: "default", Name: "contract-tenant", Key: computev1alpha1.MountCredentialCAKey},
				Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "contract-tenant"}},
			},
		})
	waitTenant(ctx, t, c, "contract", computev1alpha1.ReasonReady, 2*time.Minute)
	if !slices.Contains(own.seen(), "Bearer token-of-the-contract") {
		t.Fatalf("the contract's token never reached its own server (%q)", own.seen())
	}

	// mallory takes the path: the probe reaches her server, whose
	// certificate the tenant's CA does not verify.
	path.Route(hostile.Listener.Addr().String())
	if err := framework.Eventually(ctx, time.Minute, "a connection to mallory's server", func(context.Context) (bool, string, error) {
		n := hostile.connections()
		return n > 0, fmt.Sprint(n), nil
	}); err != nil {
		t.Fatal(err)
	}
	// She swaps the CA and keeps the URL.
	create(ctx, t, mallory, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mallory-ca"}, Data: map[string]string{"ca.crt": string(malloryCA.PEM)}})
	editAsMallory(ctx, t, mallory, "contract", func(tc *computev1alpha1.TenantCluster) {
		tc.Spec.CABundle = computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "mallory-ca", Key: "ca.crt"}
	})
	before := hostile.connections()
	var got *computev1alpha1.TenantCluster
	err = framework.Eventually(ctx, time.Minute, "TenantCluster contract "+computev1alpha1.ReasonCABundleNotBound, func(ctx context.Context) (bool, string, error) {
		if a := hostile.seen(); len(a) > 0 {
			return false, "", fmt.Errorf("mallory's server got Authorization %q", a)
		}
		got = &computev1alpha1.TenantCluster{}
		if err := c.Get(ctx, client.ObjectKey{Name: "contract"}, got); err != nil {
			return false, err.Error(), nil
		}
		return strings.HasPrefix(readyText(got), computev1alpha1.ReasonCABundleNotBound+":"), readyText(got), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TenantCluster contract after mallory's CA swap: phase %s, %s", got.Status.Phase, readyText(got))
	if strings.Contains(readyText(got), "contract-tenant") {
		t.Errorf("the condition names the credential Secret: %s", readyText(got))
	}
	// Three more probe intervals.
	time.Sleep(6 * time.Second)
	t.Logf("mallory's server: %d connections (%d after the swap), Authorization headers %q", hostile.connections(), hostile.connections()-before, hostile.seen())
	if a := hostile.seen(); len(a) > 0 {
		t.Errorf("mallory's server got Authorization %q", a)
	}
}

// editAsMallory makes mallory's change to the TenantCluster name, read
// again on a conflict: the provider writes its status at every probe, so
// her read can be stale by the time she writes.
func editAsMallory(ctx context.Context, t *testing.T, mallory client.Client, name string, change func(*computev1alpha1.TenantCluster)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		tc := &computev1alpha1.TenantCluster{}
		if err := mallory.Get(ctx, client.ObjectKey{Name: name}, tc); err != nil {
			return err
		}
		change(tc)
		return mallory.Update(ctx, tc)
	}); err != nil {
		t.Fatalf("mallory updates TenantCluster %s: %v", name, err)
	}
}

// readyText is a TenantCluster's Ready condition as text.
func readyText(tc *computev1alpha1.TenantCluster) string {
	for _, c := range tc.Status.Conditions {
		if c.Type == computev1alpha1.ConditionReady {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// malloryClient is a client of the workspace ws (admin client c) as the
// user mallory, who may enter it, create and update TenantClusters and
// create ConfigMaps, and nothing else (no Secrets).
func malloryClient(ctx context.Context, t *testing.T, c client.Client, ws string) client.Client {
	t.Helper()
	grantEnter(ctx, t, c, "mallory")
	create(ctx, t, c,
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e:mallory"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{computev1alpha1.GroupVersion.Group}, Resources: []string{"tenantclusters"}, Verbs: []string{"create", "get", "list", "watch", "update"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e:mallory"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e:mallory"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "mallory"}}},
	)
	cfg := rest.CopyConfig(env.admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "mallory", Groups: []string{"system:authenticated"}}
	mc, err := framework.ClientFor(cfg, root.Join(ws))
	if err != nil {
		t.Fatal(err)
	}
	// RBAC reaches kcp's authorizer shortly after it is written.
	if err := framework.Eventually(ctx, 30*time.Second, "mallory may list TenantClusters", func(ctx context.Context) (bool, string, error) {
		err := mc.List(ctx, &computev1alpha1.TenantClusterList{})
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	return mc
}

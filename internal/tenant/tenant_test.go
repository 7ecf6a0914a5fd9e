package tenant

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/knotless-dev/knotless/apis"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/mount"
)

func TestResolve(t *testing.T) {
	ca, err := framework.NewCA("tenant")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("knotless-shim")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := framework.PEMs(pair)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(data string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ca"}, Data: map[string]string{"ca.crt": data}}
	}
	const tenantURL = "https://127.0.0.1:6443/clusters/root"
	// secretFor is a Secret labelled for the TenantCluster, bound to url.
	secretFor := func(url string, data map[string][]byte) *corev1.Secret {
		d := map[string][]byte{computev1alpha1.MountCredentialURLKey: []byte(url), computev1alpha1.MountCredentialCAKey: ca.PEM}
		for k, v := range data {
			d[k] = v
		}
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cred", Labels: map[string]string{computev1alpha1.LabelMountCredential: "tenant"}}, Data: d}
	}
	secret := func(data map[string][]byte) *corev1.Secret { return secretFor(tenantURL, data) }
	tc := &computev1alpha1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant"},
		Spec: computev1alpha1.TenantClusterSpec{
			URL:        tenantURL,
			CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "ca", Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "cred"}},
		},
	}
	badURL := tc.DeepCopy()
	badURL.Spec.URL = "http://127.0.0.1:6443"
	caSecret := tc.DeepCopy()
	caSecret.Spec.CABundle = computev1alpha1.KeyRef{Kind: "Secret", Namespace: "default", Name: "cred", Key: "ca.crt"}
	token := map[string][]byte{"token": []byte("t")}
	other, err := framework.NewCA("mallory")
	if err != nil {
		t.Fatal(err)
	}
	legacyCA := tc.DeepCopy()
	legacyCA.Spec.CABundle = computev1alpha1.KeyRef{Kind: "Secret", Namespace: "default", Name: "cred", Key: "ca.pem"}
	withCA := map[string][]byte{"token": []byte("t"), "ca.crt": ca.PEM}
	for _, tt := range []struct {
		name   string
		tc     *computev1alpha1.TenantCluster
		objs   []client.Object
		reason string // "" = resolves
		check  func(*testing.T, mount.Tenant)
	}{
		{"token", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"token": []byte("t")})}, "", func(t *testing.T, got mount.Tenant) {
			if got.Credential.Token != "t" || got.URL.Path != "/clusters/root" || got.LogicalCluster != "lc" || got.Name != "tenant" {
				t.Errorf("resolved %+v", got)
			}
		}},
		{"client certificate", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"tls.crt": crt, "tls.key": key})}, "", func(t *testing.T, got mount.Tenant) {
			if got.Credential.ClientCert == nil {
				t.Error("no client certificate")
			}
		}},
		{"no CA object", tc, []client.Object{secret(map[string][]byte{"token": []byte("t")})}, computev1alpha1.ReasonCABundleNotFound, nil},
		{"CA is not PEM", tc, []client.Object{cm("nope"), secret(map[string][]byte{"token": []byte("t")})}, computev1alpha1.ReasonInvalidSpec, nil},
		{"no credential", tc, []client.Object{cm(string(ca.PEM))}, computev1alpha1.ReasonCredentialNotFound, nil},
		{"token and certificate", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"token": []byte("t"), "tls.crt": crt, "tls.key": key})}, computev1alpha1.ReasonInvalidSpec, nil},
		{"key does not match", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"tls.crt": crt, "tls.key": []byte("x")})}, computev1alpha1.ReasonInvalidSpec, nil},
		{"plain http", badURL, nil, computev1alpha1.ReasonInvalidSpec, nil},
		{"CA and credential in one labelled Secret", caSecret, []client.Object{secret(withCA)}, "", nil},
		{"CA Secret not labelled", caSecret, []client.Object{relabel(secret(withCA), nil)}, computev1alpha1.ReasonCABundleNotFound, nil},
		{"CA Secret without the key", caSecret, []client.Object{withoutCA(secret(token))}, computev1alpha1.ReasonCABundleNotFound, nil},
		{"credential without a URL", tc, []client.Object{cm(string(ca.PEM)), unbound(secret(token))}, computev1alpha1.ReasonCredentialNotFound, nil},
		{"credential for the URL with a slash more", tc, []client.Object{cm(string(ca.PEM)), secretFor(tenantURL+"/", token)}, computev1alpha1.ReasonCredentialNotFound, nil},
		{"CA ConfigMap of another CA than the bound one", tc, []client.Object{cm(string(other.PEM)), secret(token)}, computev1alpha1.ReasonCABundleNotBound, nil},
		{"CA ConfigMap of the bound CA and another", tc, []client.Object{cm(string(ca.PEM) + string(other.PEM)), secret(token)}, computev1alpha1.ReasonCABundleNotBound, nil},
		{"CA ConfigMap of the bound CA, written otherwise", tc, []client.Object{cm("# the tenant's CA\n" + string(ca.PEM) + "\n\n"), secret(token)}, "", nil},
		{"credential binds no CA, CA in a ConfigMap", tc, []client.Object{cm(string(ca.PEM)), withoutCA(secret(token))}, computev1alpha1.ReasonCABundleNotBound, nil},
		{"credential binds no CA, CA in the bound Secret", legacyCA, []client.Object{withoutCA(secret(map[string][]byte{"token": []byte("t"), "ca.pem": ca.PEM}))}, "", nil},
		{"CA Secret for another URL", caSecret, []client.Object{secretFor("https://127.0.0.1:6444/clusters/root", withCA)}, computev1alpha1.ReasonCABundleNotFound, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(tt.objs...).Build()
			got, err := Resolve(context.Background(), c, nil, "lc", tt.tc)
			var te *conditions.Error
			switch {
			case tt.reason == "" && err != nil:
				t.Fatalf("error %v", err)
			case tt.reason != "" && (!errors.As(err, &te) || te.Reason != tt.reason):
				t.Fatalf("error %v, want reason %s", err, tt.reason)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
}

// unbound returns s without the key that binds it to a URL.
func unbound(s *corev1.Secret) *corev1.Secret {
	delete(s.Data, computev1alpha1.MountCredentialURLKey)
	return s
}

// withoutCA returns s without the CA bundle bound in it.
func withoutCA(s *corev1.Secret) *corev1.Secret {
	delete(s.Data, computev1alpha1.MountCredentialCAKey)
	return s
}

// relabel returns s with the given labels.
func relabel(s *corev1.Secret, labels map[string]string) *corev1.Secret {
	s.Labels = labels
	return s
}

// TestResolveOnlyLabelledSecretsOfOneNamespace (R22): a TenantCluster
// resolves only a Secret labelled for it, in the one namespace both its
// references name. A Secret of another namespace, one without the label
// (such as another contract's credential) or one labelled for another
// TenantCluster is reported exactly like a missing Secret, so its
// existence is not revealed either, and no token is returned.
func TestResolveOnlyLabelledSecretsOfOneNamespace(t *testing.T) {
	ca, err := framework.NewCA("tenant")
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "attacker", Name: "ca"}, Data: map[string]string{"ca.crt": string(ca.PEM)}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "market", Name: "ca"}, Data: map[string]string{"ca.crt": string(ca.PEM)}},
		// The market's credential, labelled for its own TenantCluster.
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "market", Name: "cc-tenant", Labels: map[string]string{computev1alpha1.LabelMountCredential: "cc"}},
			Data: map[string][]byte{"token": []byte("market-token"), computev1alpha1.MountCredentialURLKey: []byte("https://attacker.example")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "market", Name: "unlabelled"}, Data: map[string][]byte{"token": []byte("other-token"), computev1alpha1.MountCredentialURLKey: []byte("https://attacker.example")}},
	}
	c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(objs...).Build()
	tc := func(caNS, credNS, cred string) *computev1alpha1.TenantCluster {
		return &computev1alpha1.TenantCluster{
			ObjectMeta: metav1.ObjectMeta{Name: "hostile"},
			Spec: computev1alpha1.TenantClusterSpec{
				URL:        "https://attacker.example",
				CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: caNS, Name: "ca", Key: "ca.crt"},
				Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: credNS, Name: cred}},
			},
		}
	}
	missing := func(ns, name string) string {
		_, err := Resolve(context.Background(), c, nil, "lc", tc(ns, ns, name))
		return err.Error()
	}
	for _, tt := range []struct {
		name   string
		tc     *computev1alpha1.TenantCluster
		reason string
	}{
		{"credential of another namespace", tc("attacker", "market", "cc-tenant"), computev1alpha1.ReasonInvalidSpec},
		{"labelled for another TenantCluster", tc("market", "market", "cc-tenant"), computev1alpha1.ReasonCredentialNotFound},
		{"not labelled", tc("market", "market", "unlabelled"), computev1alpha1.ReasonCredentialNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(context.Background(), c, nil, "lc", tt.tc)
			var te *conditions.Error
			if !errors.As(err, &te) || te.Reason != tt.reason {
				t.Fatalf("error %v, want reason %s", err, tt.reason)
			}
			if got.Credential.Token != "" {
				t.Fatalf("resolved the token %q", got.Credential.Token)
			}
			if strings.Contains(te.Message, "-token") {
				t.Errorf("message names the Secret's content: %s", te.Message)
			}
			// Apart from the name, the refusal is a missing Secret's.
			ref := tt.tc.Spec.Credential.SecretRef
			if want := missing(ref.Namespace, "no-such-secret"); tt.reason == computev1alpha1.ReasonCredentialNotFound && strings.Replace(err.Error(), ref.Name, "no-such-secret", 1) != want {
				t.Errorf("refusal %q differs from a missing Secret's %q", err, want)
			}
		})
	}
}

// TestLabelledCredentialDoesNotFollowTheURL (R22, from review): the label
// binds a Secret to a TenantCluster's name only. A member who may update
// (or delete and re-create) TenantClusters but not read Secrets takes the
// contract's TenantCluster "cc", points spec.url at their own server and
// spec.caBundle at a ConfigMap of their CA in the same namespace: the
// labelled Secret is bound to the URL its writer chose, so its token is
// not resolved for another URL, and the refusal is a missing Secret's.
func TestLabelledCredentialDoesNotFollowTheURL(t *testing.T) {
	attackerCA, err := framework.NewCA("attacker")
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(
		// What deliver wrote for contract cc (VM endpoint https://10.0.0.7:6443).
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "market", Name: "cc-tenant", Labels: map[string]string{computev1alpha1.LabelMountCredential: "cc"}},
			Data: map[string][]byte{"token": []byte("market-token"), "ca.crt": []byte("vm-ca"), computev1alpha1.MountCredentialURLKey: []byte("https://10.0.0.7:6443")}},
		// The member's own CA, in a ConfigMap of the same namespace.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "market", Name: "mine"}, Data: map[string]string{"ca.crt": string(attackerCA.PEM)}},
	).Build()
	// The contract's TenantCluster, after the member's update.
	tc := &computev1alpha1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "cc", Labels: map[string]string{"market.knotless.dev/contract-uid": "uid-of-cc"}},
		Spec: computev1alpha1.TenantClusterSpec{
			URL:        "https://attacker.example",
			CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "market", Name: "mine", Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "market", Name: "cc-tenant"}},
		},
	}
	got, err := Resolve(context.Background(), c, nil, "lc", tc)
	if err == nil || got.Credential.Token != "" {
		t.Fatalf("resolved token %q for %s (err %v): the contract's credential follows a URL its writer never chose", got.Credential.Token, tc.Spec.URL, err)
	}
	var te *conditions.Error
	if !errors.As(err, &te) || te.Reason != computev1alpha1.ReasonCredentialNotFound {
		t.Fatalf("error %v, want reason %s", err, computev1alpha1.ReasonCredentialNotFound)
	}
	missing := tc.DeepCopy()
	missing.Spec.Credential.SecretRef.Name = "no-such-secret"
	_, want := Resolve(context.Background(), c, nil, "lc", missing)
	if strings.Replace(err.Error(), "cc-tenant", "no-such-secret", 1) != want.Error() || strings.Contains(err.Error(), "10.0.0.7") {
		t.Errorf("refusal %q differs from a missing Secret's %q", err, want)
	}
}

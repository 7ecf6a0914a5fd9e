package tenant

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/knotless-dev/knotless/apis"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/conditions"
)

// A market contract's mount is reached with the credential the provider
// keeps in its own workspace, only for the TenantCluster, URL and CA
// bundle it is bound to. The attacks of a member of the requester's
// workspace (who may write the TenantCluster and Secrets there, and read
// them) get no token: pointing the TenantCluster at another URL or CA,
// writing a token into the workspace's Secret, or naming the market
// credential from another TenantCluster.
func TestMarketCredentialIsTheProvidersAndBound(t *testing.T) {
	ctx := context.Background()
	vmCA, err := framework.NewCA("vm")
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := framework.NewCA("mallory")
	if err != nil {
		t.Fatal(err)
	}
	const u = "https://10.0.0.7:6443"
	label := map[string]string{computev1alpha1.LabelMountCredential: "cc"}
	ws := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cc-tenant", Labels: label},
			Data: map[string][]byte{computev1alpha1.MountCredentialURLKey: []byte(u), computev1alpha1.MountCredentialCAKey: vmCA.PEM}},
		// A member's own Secrets: for the TenantCluster and its URL, with
		// her CA; and with a token of her own beside the market's flag.
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine", Labels: label},
			Data: map[string][]byte{computev1alpha1.MountCredentialURLKey: []byte(u), computev1alpha1.MountCredentialCAKey: mallory.PEM}},
	).Build()
	cred := MarketCredential{LogicalCluster: "lc", Name: "cc", URL: u, CA: vmCA.PEM, Token: "market-token", Users: []string{"alice"}, Groups: []string{"ops"}}
	provider := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(cred.Secret()).Build()
	tc := &computev1alpha1.TenantCluster{ObjectMeta: metav1.ObjectMeta{Name: "cc"}, Spec: computev1alpha1.TenantClusterSpec{
		URL:        u,
		CABundle:   computev1alpha1.KeyRef{Kind: "Secret", Namespace: "default", Name: "cc-tenant", Key: computev1alpha1.MountCredentialCAKey},
		Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "cc-tenant"}, Market: true},
	}}
	got, err := Resolve(ctx, ws, provider, "lc", tc)
	if err != nil || got.Credential.Token != "market-token" || got.Impersonate == nil ||
		!slices.Equal(got.Impersonate.Users, []string{"alice"}) || !slices.Equal(got.Impersonate.Groups, []string{"ops"}) {
		t.Fatalf("Resolve = %+v, %v; want the market's token and principals", got, err)
	}

	other := cred
	other.Name = "other"
	copied := other.Secret()
	copied.Name = MarketSecretName("lc", "cc2")
	if err := provider.Create(ctx, copied); err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(tc *computev1alpha1.TenantCluster){
		"another URL": func(tc *computev1alpha1.TenantCluster) { tc.Spec.URL = "https://attacker.example" },
		"another CA": func(tc *computev1alpha1.TenantCluster) {
			tc.Spec.CABundle.Name, tc.Spec.Credential.SecretRef.Name = "mine", "mine"
		},
		"a TenantCluster the provider keeps nothing for": func(tc *computev1alpha1.TenantCluster) { tc.Name = "mine" },
		"a credential kept for another TenantCluster":    func(tc *computev1alpha1.TenantCluster) { tc.Name = "cc2" },
	} {
		evil := tc.DeepCopy()
		change(evil)
		for _, market := range []client.Reader{provider, nil} {
			got, err := Resolve(ctx, ws, market, "lc", evil)
			var ce *conditions.Error
			if got.Credential.Token != "" || !errors.As(err, &ce) || (ce.Reason != computev1alpha1.ReasonCredentialNotFound && ce.Reason != computev1alpha1.ReasonCABundleNotFound) {
				t.Errorf("%s: token %q, %v", name, got.Credential.Token, err)
			}
		}
	}
	// Another logical cluster's TenantCluster of the same name gets nothing.
	if got, err := Resolve(ctx, ws, provider, "lc2", tc); err == nil || got.Credential.Token != "" {
		t.Errorf("another logical cluster: %q, %v", got.Credential.Token, err)
	}
}

// A contract deletes only its own credential: another contract of the
// name (in another namespace of the workspace) leaves it.
func TestDeleteMarketDeletesOnlyTheContracts(t *testing.T) {
	ctx := context.Background()
	cred := MarketCredential{LogicalCluster: "lc", Name: "cc", Contract: "uid-1", URL: "https://10.0.0.7:6443", Token: "t"}
	c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(cred.Secret()).Build()
	if err := DeleteMarket(ctx, c, "lc", "cc", "uid-2"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadMarket(ctx, c, "lc", "cc"); !ok || err != nil {
		t.Fatalf("another contract deleted the credential (%v)", err)
	}
	if err := DeleteMarket(ctx, c, "lc", "cc", "uid-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadMarket(ctx, c, "lc", "cc"); ok || err != nil {
		t.Fatalf("the contract's credential is still there (%v)", err)
	}
	if err := DeleteMarket(ctx, c, "lc", "cc", "uid-1"); err != nil {
		t.Fatalf("deleting a credential that is gone: %v", err)
	}
}

// Credentials left behind are deleted once their token has expired past
// the grace; live ones stay.
func TestSweepMarketDeletesExpiredCredentials(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	live := MarketCredential{LogicalCluster: "lc", Name: "live", Token: "t", Expires: now.Add(5 * time.Minute)}
	recent := MarketCredential{LogicalCluster: "lc", Name: "recent", Token: "t", Expires: now.Add(-5 * time.Minute)}
	left := MarketCredential{LogicalCluster: "lc", Name: "left", Token: "t", Expires: now.Add(-time.Hour)}
	c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(live.Secret(), recent.Secret(), left.Secret()).Build()
	n, err := SweepMarket(ctx, c, now, 10*time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("SweepMarket = %d, %v; want 1", n, err)
	}
	for name, want := range map[string]bool{"live": true, "recent": true, "left": false} {
		if _, ok, _ := ReadMarket(ctx, c, "lc", name); ok != want {
			t.Errorf("%s: kept %v, want %v", name, ok, want)
		}
	}
}

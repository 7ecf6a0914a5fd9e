package marketrequester

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
)

// TestPreCreatedTenantClusterDoesNotTakeTheMount (item 10 of issue 27): a
// TenantCluster a workspace member made under the contract's name before
// the tenant was mounted (its URL the member's own server) is not taken
// as the contract's mount, even though it names the contract's Secret:
// the contract waits with MountNameTaken, an Event says why, the
// TenantCluster is left as it is and the contract's credential Secret is
// not written. Once it is deleted, the contract mounts its tenant with a
// TenantCluster labelled with its UID and a Secret labelled for that
// TenantCluster only.
func TestPreCreatedTenantClusterDoesNotTakeTheMount(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	cc := contracts(t, m.shop)
	if len(cc) != 1 {
		t.Fatalf("contracts %+v", cc)
	}
	hostile := &computev1alpha1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: cc[0].Name},
		Spec: computev1alpha1.TenantClusterSpec{
			URL:        "https://attacker.example",
			CABundle:   computev1alpha1.KeyRef{Kind: "Secret", Namespace: ns, Name: tenantCredential(cc[0].Name), Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: ns, Name: tenantCredential(cc[0].Name)}},
		},
	}
	if err := m.shop.Client.Create(ctx, hostile); err != nil {
		t.Fatal(err)
	}
	m.runVM(m.bidders["fit"], drivertest.TestCA(t))
	m.round()
	m.round()

	got := contracts(t, m.shop)[0]
	if c := clustertest.Condition(t, got.Status.Conditions, marketv1alpha1.ConditionReady); got.Status.Phase != marketv1alpha1.ContractProvisioning || c.Reason != ReasonMountNameTaken {
		t.Fatalf("contract %s, Ready %+v; want Provisioning, MountNameTaken", got.Status.Phase, c)
	}
	tc := &computev1alpha1.TenantCluster{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Name: got.Name}, tc); err != nil || tc.Spec.URL != hostile.Spec.URL {
		t.Fatalf("the member's TenantCluster was changed: %+v, %v", tc.Spec, err)
	}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(got.Name)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the contract's credential Secret was written beside the member's TenantCluster (%v)", err)
	}
	var taken []clustertest.Event
	for _, e := range m.shop.Events.Events() {
		if e.Reason == ReasonMountNameTaken {
			taken = append(taken, e)
		}
	}
	if len(taken) != 1 || taken[0].Object != ns+"/"+got.Name {
		t.Fatalf("MountNameTaken events %+v, want one about the contract", taken)
	}

	// The member's TenantCluster goes: the contract mounts its tenant.
	if err := m.shop.Client.Delete(ctx, tc); err != nil {
		t.Fatal(err)
	}
	m.round()
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Name: got.Name}, tc); err != nil || tc.Labels[LabelContract] != string(got.UID) || tc.Spec.URL == hostile.Spec.URL {
		t.Fatalf("the contract's TenantCluster: %+v %+v, %v", tc.Labels, tc.Spec, err)
	}
	sec := &corev1.Secret{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(got.Name)}, sec); err != nil || sec.Labels[computev1alpha1.LabelMountCredential] != tc.Name ||
		string(sec.Data[computev1alpha1.MountCredentialURLKey]) != tc.Spec.URL {
		t.Fatalf("the contract's Secret: labels %v, url %q (TenantCluster's %q), %v", sec.Labels, sec.Data[computev1alpha1.MountCredentialURLKey], tc.Spec.URL, err)
	}
	m.tenantReady()
	m.round()
	if got := contracts(t, m.shop)[0]; got.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("contract %s after its TenantCluster is Ready", got.Status.Phase)
	}
}

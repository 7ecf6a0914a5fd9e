package sshgateway

// Adversarial review of the requester's half of the SSH gateway (issue
// 32): holes fail on the code they were written against, defences that
// held pass.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

func (f *fixture) reconcileIn(t *testing.T, ns, name string) {
	t.Helper()
	if _, err := f.r.Reconcile(t.Context(), mcreconcile.Request{ClusterName: ws, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}); err != nil {
		t.Fatal(err)
	}
}

// leasesPublished are the leases the repo's ssh records name.
func (f *fixture) leasesPublished(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, rec := range f.repo.Records(lexicon.GatewaySSH) {
		var r sshRecord
		if err := json.Unmarshal(rec.Value, &r); err != nil {
			t.Fatal(err)
		}
		out[r.Lease.URI] = true
	}
	return out
}

// TestAttackTwoNamespacesShareARecordKey: the record key is the
// SshGateway's name alone. Two namespaces of one workspace whose
// identities are the same requester DID (two contracts, two tenants)
// each have an SshGateway "shell": the second overwrites the first's
// record (its tenant silently loses SSH while its status still says
// Published and Ready), and deleting the second deletes the record the
// first relies on.
func TestAttackTwoNamespacesShareARecordKey(t *testing.T) {
	const lease2 = "at://did:plc:fit/dev.knotless.market.lease/3lease2"
	cc2 := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "staging", Name: "web-1", UID: "cc2-uid"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: shop, BidderDID: "did:plc:fit"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: lease2, CID: "bafylease2"}}}}
	repo2 := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "staging", Name: "shop"}}
	repo2.Status.DID, repo2.Status.Conditions = shop, readyCond()
	id2 := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: "staging", Name: "shop"},
		Spec: marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: "shop"}}}
	id2.Status.DID, id2.Status.Conditions = shop, readyCond()
	gw2 := sshgw("shell", "jobs")
	gw2.Namespace, gw2.Spec.ContractRef.Name, gw2.UID = "staging", "web-1", "shell-staging-uid"

	f := newFixture(t, "ssh.fit.example:22", sshgw("shell", "web"), cc2, repo2, id2, gw2)
	f.reaches.Put(ws, cc2.UID, tenantreach.Reach{Tenant: deal.Tenant{Endpoint: "https://tenant2.example:6443", SSHAddress: "ssh.fit.example:22", SSHHostKey: hostKey},
		Client: func(context.Context, time.Time) (kubernetes.Interface, error) { return nil, nil }})

	f.reconcileIn(t, "default", "shell")
	f.reconcileIn(t, "staging", "shell")
	if got := f.leasesPublished(t); !got[lease] || !got[lease2] {
		t.Errorf("two SshGateways of two namespaces: records name %v, want both leases (key the record by namespace and name, or refuse the second)", got)
	}
	if c := clustertest.Condition(t, f.get(t, "shell").Status.Conditions, gatewayv1alpha1.ConditionPublished); c.Status == metav1.ConditionTrue && !f.leasesPublished(t)[lease] {
		t.Errorf("default/shell says Published, its record names another lease")
	}

	// default/shell is reconciled last (any event of its own): the
	// record is its own again. staging's contract then goes (deleted
	// after it completed): staging/shell deletes the record, whose
	// lease it cannot compare any more, though it is default/shell's.
	f.reconcileIn(t, "default", "shell")
	if err := f.cl.Client.Delete(t.Context(), cc2); err != nil {
		t.Fatal(err)
	}
	f.reconcileIn(t, "staging", "shell")
	if got := f.leasesPublished(t); !got[lease] {
		t.Errorf("after staging's contract went: records name %v: staging/shell deleted default/shell's record (without its contract, compare the lease with the one it published)", got)
	}
}

// TestDefenceContractOfAnotherNamespace: an SshGateway can name only a
// contract of its own namespace (R22): one in team-b naming web-0 (of
// default) publishes nothing, and one naming a bidder's contract
// neither.
func TestDefenceContractOfAnotherNamespace(t *testing.T) {
	intruder := sshgw("shell", "kube-system")
	intruder.Namespace = "team-b"
	bidderCC := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sold-0", UID: "sold-uid"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideBidder, RequesterDID: shop, BidderDID: "did:plc:fit"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: lease, CID: "bafylease"}}}}
	sold := sshgw("sold", "kube-system")
	sold.Spec.ContractRef.Name = "sold-0"
	f := newFixture(t, "ssh.fit.example:22", intruder, bidderCC, sold)
	f.reaches.Put(ws, bidderCC.UID, tenantreach.Reach{Tenant: deal.Tenant{Endpoint: "https://tenant.example:6443"},
		Client: func(context.Context, time.Time) (kubernetes.Interface, error) { return nil, nil }})
	f.reconcileIn(t, "team-b", "shell")
	f.reconcileIn(t, "default", "sold")
	if recs := f.repo.Records(lexicon.GatewaySSH); len(recs) != 0 {
		t.Errorf("records published: %+v", recs)
	}
	g := &gatewayv1alpha1.SshGateway{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "team-b", Name: "shell"}, g); err != nil {
		t.Fatal(err)
	}
	if c := clustertest.Condition(t, g.Status.Conditions, gatewayv1alpha1.ConditionPublished); c.Reason != gatewayv1alpha1.ReasonContractNotFound || g.Status.Address != "" {
		t.Errorf("team-b/shell: %+v, address %q", c, g.Status.Address)
	}
}

package marketrequester

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/serviceauth"
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
	if mc := m.mountCredential(got.Name); mc.Token != "" {
		t.Fatal("the mount's credential was kept for the member's TenantCluster")
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

// dealRunning makes a deal with the bidder "fit" whose VM runs with the
// CA bundle ca and whose lease says so (lease running, with the VM's
// caFingerprint); the requester has not looked at the running lease yet.
// It returns the requester's contract.
func (m *marketFixture) dealRunning(ca []byte) marketv1alpha1.ComputeContract {
	m.t.Helper()
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	cc := contracts(m.t, m.shop)
	if len(cc) != 1 {
		m.t.Fatalf("contracts %+v", cc)
	}
	m.runVM(m.bidders["fit"], ca)
	m.reconcileBidder("fit")
	return cc[0]
}

// mountedNothing fails unless the contract waits (Provisioning) with
// reason on its Ready condition, its TenantCluster and credential Secret
// were not made, and exactly one Warning Event with reason says why,
// naming none of what forbidden holds.
func (m *marketFixture) mountedNothing(name, reason string, forbidden ...string) {
	m.t.Helper()
	ctx := context.Background()
	cc := &marketv1alpha1.ComputeContract{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cc); err != nil {
		m.t.Fatal(err)
	}
	c := clustertest.Condition(m.t, cc.Status.Conditions, marketv1alpha1.ConditionReady)
	if cc.Status.Phase != marketv1alpha1.ContractProvisioning || c.Reason != reason {
		m.t.Fatalf("contract %s, Ready %+v; want Provisioning, %s", cc.Status.Phase, c, reason)
	}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Name: name}, &computev1alpha1.TenantCluster{}); !apierrors.IsNotFound(err) {
		m.t.Fatalf("the TenantCluster was made (%v)", err)
	}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(name)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		m.t.Fatalf("the credential Secret was made (%v)", err)
	}
	if mc := m.mountCredential(name); mc.Token != "" {
		m.t.Fatalf("the mount's credential was kept for %s", mc.URL)
	}
	var warned []clustertest.Event
	for _, e := range m.shop.Events.Events() {
		if e.Reason == reason {
			warned = append(warned, e)
		}
	}
	if len(warned) != 1 || warned[0].Type != corev1.EventTypeWarning || warned[0].Object != ns+"/"+name {
		m.t.Fatalf("%s events %+v, want one Warning about the contract", reason, warned)
	}
	for _, text := range []string{c.Message, warned[0].Note, m.requester().Status.Requests[0].Message} {
		for _, f := range forbidden {
			if strings.Contains(text, f) {
				m.t.Errorf("%q reveals %q", text, f)
			}
		}
	}
}

// TestUnpinnedCertificateInTheCABundleIsNotMounted (issue 29): the VM's
// CA bundle, which the bidder's lease publishes, is [honest CA, attacker
// CA] while the lease pins the honest CA. Every certificate of the bundle would be trusted by the
// mount, so the contract is not mounted: no TenantCluster, no credential
// Secret, the contract waits with CABundleNotPinned and one Warning Event
// says why, naming neither CA, its pin nor the VM's endpoint. Before,
// only the first certificate was hashed and the bundle was mounted.
func TestUnpinnedCertificateInTheCABundleIsNotMounted(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	honest, attacker := drivertest.TestCA(t), drivertest.TestCA(t)
	cc := m.dealRunning(honest)
	pin, _ := market.CAFingerprint(honest)

	// The VM's bundle gains the attacker's CA; its status keeps the pin.
	var vms computev1alpha1.ComputeVMList
	if err := m.bidders["fit"].Client.List(ctx, &vms); err != nil || len(vms.Items) != 1 {
		t.Fatalf("VMs %v, %v", vms.Items, err)
	}
	vm := &vms.Items[0]
	vm.Status.CABundle = string(honest) + string(attacker)
	if err := m.bidders["fit"].Client.Status().Update(ctx, vm); err != nil {
		t.Fatal(err)
	}
	m.reconcileBidder("fit")
	if l := m.leaseOf(); l.State != deal.LeaseRunning || l.CAFingerprint != pin || l.CABundle != vm.Status.CABundle {
		t.Fatalf("lease %+v, want running with both CAs and the honest CA's pin", l)
	}
	m.reconcileRequester()
	m.reconcileRequester()
	m.mountedNothing(cc.Name, ReasonCABundleNotPinned, pin, strings.TrimPrefix(pin, "sha256:"), vm.Status.Endpoint, "BEGIN")

	// The bundle is the pinned one again: the tenant is mounted, with
	// that bundle only.
	vm.Status.CABundle = string(honest)
	if err := m.bidders["fit"].Client.Status().Update(ctx, vm); err != nil {
		t.Fatal(err)
	}
	m.reconcileBidder("fit")
	m.reconcileRequester()
	sec := &corev1.Secret{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(cc.Name)}, sec); err != nil || string(sec.Data[computev1alpha1.MountCredentialCAKey]) != string(honest) {
		t.Fatalf("the credential Secret: %v, ca.crt %q", err, sec.Data[computev1alpha1.MountCredentialCAKey])
	}
}

// leaseOf is the one lease record of the bidder "fit".
func (m *marketFixture) leaseOf() market.Lease {
	m.t.Helper()
	recs := m.repos["did:plc:fit"].Records(lexicon.Lease)
	if len(recs) != 1 {
		m.t.Fatalf("%d leases", len(recs))
	}
	var l market.Lease
	if err := json.Unmarshal(recs[0].Value, &l); err != nil {
		m.t.Fatal(err)
	}
	return l
}

// impostor adds the workspace "evil", whose PDS claims the bidder DID of
// "fit" (its MarketBidder of UID uid trades as did:plc:fit), holding what
// the bidder's workspace holds for the requester's contract cc: a
// contract on the same accept for the same requester, and a running VM
// with the honest VM's CA bundle (it is public) at its own endpoint, with
// its own mount credential. It returns the impostor's follower entry and
// its VM's endpoint.
func (m *marketFixture) impostor(cc marketv1alpha1.ComputeContract, uid types.UID) (mcreconcile.Request, string) {
	m.t.Helper()
	ctx := context.Background()
	mb := bidderObj("evil", 30, 0)
	mb.UID = uid
	evil := clustertest.New(append(participant("evil", cc.Spec.BidderDID), mb)...)
	mb.Status.DID = cc.Spec.BidderDID
	if err := evil.Client.Status().Update(ctx, mb); err != nil {
		m.t.Fatal(err)
	}
	clusters := map[string]*clustertest.Cluster{"shop": m.shop, "evil": evil}
	for name, ws := range m.bidders {
		clusters[name] = ws
	}
	m.req.GetCluster, m.bid.GetCluster = clustertest.Getter(clusters), clustertest.Getter(clusters)
	req := mcreconcile.Request{ClusterName: "evil", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "evil"}}}
	if _, err := m.net.Follow(market.Follower{Role: market.RoleBidder, DID: cc.Spec.BidderDID, Request: req}, nil); err != nil {
		m.t.Fatal(err)
	}
	var honest computev1alpha1.ComputeVMList
	if err := m.bidders["fit"].Client.List(ctx, &honest); err != nil || len(honest.Items) != 1 {
		m.t.Fatalf("VMs %v, %v", honest.Items, err)
	}
	name := market.ChildName(mb.Name, cc.Spec.Accept.URI)
	bcc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "evil-contract", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: marketv1alpha1.GroupVersion.String(), Kind: "MarketBidder", Name: mb.Name, UID: mb.UID, Controller: &isController}}},
		Spec: cc.Spec}
	bcc.Spec.Side = marketv1alpha1.SideBidder
	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "evil-vm", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: marketv1alpha1.GroupVersion.String(), Kind: "ComputeContract", Name: name, UID: bcc.UID, Controller: &isController}}}}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-credential", OwnerReferences: []metav1.OwnerReference{ownerRef(vm, "ComputeVM")}},
		Data: map[string][]byte{"token": []byte("evil-token")}}
	for _, o := range []client.Object{bcc, vm, sec} {
		if err := evil.Client.Create(ctx, o); err != nil {
			m.t.Fatal(err)
		}
	}
	endpoint := "https://127.0.0.1:6666/clusters/evil"
	vm.Status = computev1alpha1.ComputeVMStatus{Phase: computev1alpha1.VMRunning, Endpoint: endpoint,
		CABundle: honest.Items[0].Status.CABundle, CAFingerprint: honest.Items[0].Status.CAFingerprint, CredentialSecret: sec.Name}
	if err := evil.Client.Status().Update(ctx, vm); err != nil {
		m.t.Fatal(err)
	}
	return req, endpoint
}

// TestImpostorBidderWorkspaceGetsNothing (issue 29): a workspace whose
// PDS claims the bidder's DID holds a contract on the deal's accept and a
// running VM with the honest CA bundle at its own endpoint, even with the
// bidder's MarketBidder UID (which kcp never gives two objects). The
// mount is made from the bidder's signed lease alone: the impostor's
// endpoint and token are never used, and the requester's side reaches
// only the lease's endpoint, with its own service-auth token for the
// lease's service identity.
func TestImpostorBidderWorkspaceGetsNothing(t *testing.T) {
	ctx := context.Background()
	for _, uid := range []types.UID{"evil-uid", "fit-uid"} {
		m := newMarket(t, bidderObj("fit", 30, 2))
		cc := m.dealRunning(drivertest.TestCA(t))
		_, endpoint := m.impostor(cc, uid)
		m.reconcileRequester()
		lease := m.leaseOf()
		tc := &computev1alpha1.TenantCluster{}
		if err := m.shop.Client.Get(ctx, client.ObjectKey{Name: cc.Name}, tc); err != nil || tc.Spec.URL != lease.Endpoint || lease.Endpoint == endpoint {
			t.Fatalf("%s: the TenantCluster %+v, %v: want the lease's endpoint %s", uid, tc.Spec, err, lease.Endpoint)
		}
		if mc := m.mountCredential(cc.Name); !strings.HasPrefix(mc.Token, "markettest:did:plc:shop:"+lease.ServiceID+":") || mc.URL != lease.Endpoint {
			t.Fatalf("%s: the mount's credential %+v; want the requester's for %s", uid, mc, lease.ServiceID)
		}
		if len(m.tenants) != 1 || m.tenants[lease.Endpoint] == nil {
			t.Fatalf("%s: the requester reached %v, want only %s", uid, slices.Collect(maps.Keys(m.tenants)), lease.Endpoint)
		}
	}
}

// TestMountReadsNoBidderWorkspace (issue 29): the requester's side runs
// with no access to any workspace but its own, and the bidder's with none
// to the requester's: the deal completes, and the tenant is mounted with
// the requester's identity. Before the mount, the requester's side binds
// spec.tenantAdmins (no system: names) as the tenant's admins; a change
// of them is applied with the next token. A tenant that refuses keeps the
// contract waiting with TenantRefused, tried again after 30 s.
func TestMountReadsNoBidderWorkspace(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) {
		mr.Spec.TenantAdmins = computev1alpha1.TenantAdmins{Users: []string{"alice", "system:admin"}, Groups: []string{"ops", "system:masters"}}
	})
	m.req.GetCluster = clustertest.Getter(map[string]*clustertest.Cluster{"shop": m.shop})
	m.bid.GetCluster = clustertest.Getter(map[string]*clustertest.Cluster{"fit": m.bidders["fit"]})
	cc := m.dealRunning(drivertest.TestCA(t))
	lease := m.leaseOf()
	m.refusing[lease.Endpoint] = true
	m.reconcileRequester()
	m.mountedNothing(cc.Name, ReasonTenantRefused, lease.Endpoint, "refuses")

	delete(m.refusing, lease.Endpoint)
	m.clock.advance(31 * time.Second)
	m.reconcileRequester()
	m.tenantReady()
	m.reconcileRequester()
	if got := contracts(t, m.shop)[0]; got.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("contract %s, want Active", got.Status.Phase)
	}
	binding := func() []rbacv1.Subject {
		t.Helper()
		crb, err := m.tenants[lease.Endpoint].RbacV1().ClusterRoleBindings().Get(ctx, mountAdminRole, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return crb.Subjects
	}
	want := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "ops"}, {APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}
	if got := binding(); !slices.Equal(got, want) {
		t.Fatalf("the tenant's %s binds %+v, want %+v", mountAdminRole, got, want)
	}
	first := m.tenants[lease.Endpoint].token

	// Within the token's life nothing is minted; a change of the admins
	// is applied with a new token.
	m.clock.advance(time.Minute)
	m.reconcileRequester()
	if m.tenants[lease.Endpoint].token != first {
		t.Fatal("a token was minted while the mount's still had 7 minutes")
	}
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.TenantAdmins.Users = []string{"bob"} })
	m.reconcileRequester()
	want = []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "ops"}, {APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "bob"}}
	if got := binding(); !slices.Equal(got, want) {
		t.Fatalf("after the change the tenant's %s binds %+v, want %+v", mountAdminRole, got, want)
	}
	// Past mountTokenRenew before its end, the token is minted again; a
	// failure then leaves the mount as it is.
	m.clock.advance(5 * time.Minute)
	m.repos["did:plc:shop"].NoServiceAuth = true
	m.reconcileRequester()
	if got := contracts(t, m.shop)[0]; got.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("contract %s while the old token still serves, want Active", got.Status.Phase)
	}
	m.repos["did:plc:shop"].NoServiceAuth = false
	before := m.tenants[lease.Endpoint].token
	m.clock.advance(31 * time.Second)
	m.reconcileRequester()
	mc := m.mountCredential(cc.Name)
	if mc.Token == before || mc.Token != strings.Replace(m.tenants[lease.Endpoint].token, ":"+serviceauth.Method+":", ":"+serviceauth.MountMethod+":", 1) {
		t.Fatalf("the mount's token was not renewed, or not for the mount's method: %q", mc.Token)
	}
	// The mount's token is its own user's, which may impersonate the
	// admins and the probe alone; the mount proxy is told whom to forward.
	crb, err := m.tenants[lease.Endpoint].RbacV1().ClusterRoleBindings().Get(ctx, mountRole, metav1.GetOptions{})
	if err != nil || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "did:plc:shop#mount" || crb.Subjects[0].Kind != rbacv1.UserKind {
		t.Fatalf("the mount's binding: %+v %v", crb, err)
	}
	role, err := m.tenants[lease.Endpoint].RbacV1().ClusterRoles().Get(ctx, mountRole, metav1.GetOptions{})
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: []string{mount.ProbeUser, "bob"}},
		{APIGroups: []string{""}, Resources: []string{"groups"}, Verbs: []string{"impersonate"}, ResourceNames: []string{"ops"}},
	}
	if err != nil || !reflect.DeepEqual(role.Rules, wantRules) {
		t.Fatalf("the mount's role: %+v %v; want %+v", role.Rules, err, wantRules)
	}
	if !slices.Equal(mc.Users, []string{"bob"}) || !slices.Equal(mc.Groups, []string{"ops"}) {
		t.Fatalf("the mount's principals: %q %q", mc.Users, mc.Groups)
	}
	// Nothing of it is in the requester's workspace: the TenantCluster
	// says the credential is the market's, and its Secret holds the URL
	// and CA alone.
	tc := &computev1alpha1.TenantCluster{}
	sec := &corev1.Secret{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Name: cc.Name}, tc); err != nil || !tc.Spec.Credential.Market {
		t.Fatalf("the TenantCluster's credential: %+v %v", tc.Spec.Credential, err)
	}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(cc.Name)}, sec); err != nil || len(sec.Data) != 2 ||
		string(sec.Data[computev1alpha1.MountCredentialURLKey]) != lease.Endpoint || len(sec.Data[computev1alpha1.MountCredentialCAKey]) == 0 {
		t.Fatalf("the requester's workspace's Secret: keys %v, %v", slices.Collect(maps.Keys(sec.Data)), err)
	}
}

// TestMountTokenThroughFailures (issue 29): the mount's token is renewed
// while the tenant does not answer (a tenant that answers again within
// the grace is reached); a tenant that refuses is tried again after 30 s
// doubling, however often the requester is woken; an Active contract
// whose lease stops saying how to reach its tenant stays Active on the
// mount it has (the grace then runs from the mount's own probe), and a
// token expiry that the requester's side did not write is not trusted.
func TestMountTokenThroughFailures(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	cc := m.dealRunning(drivertest.TestCA(t))
	lease := m.leaseOf()
	m.reconcileRequester()
	m.tenantReady()
	m.reconcileRequester()
	token := func() string {
		t.Helper()
		return m.mountCredential(cc.Name).Token
	}
	setPhase := func(phase string) {
		t.Helper()
		tc := &computev1alpha1.TenantCluster{}
		if err := m.shop.Client.Get(ctx, client.ObjectKey{Name: cc.Name}, tc); err != nil {
			t.Fatal(err)
		}
		tc.Status.Phase = phase
		if err := m.shop.Client.Status().Update(ctx, tc); err != nil {
			t.Fatal(err)
		}
	}
	first := token()

	// The tenant stops answering; past the renewal time the token is
	// minted again all the same.
	setPhase(computev1alpha1.PhaseUnknown)
	m.clock.advance(5 * time.Minute)
	m.reconcileRequester()
	if got := contracts(t, m.shop)[0]; got.Status.Phase != marketv1alpha1.ContractActive || token() == first {
		t.Fatalf("contract %s while its tenant does not answer; token renewed: %v", got.Status.Phase, token() != first)
	}
	setPhase(computev1alpha1.PhaseReady)

	// A refusing tenant: ten wakes at one instant cost one try; the next
	// comes 30 s later, then 60 s.
	m.clock.advance(5 * time.Minute)
	m.refusing[lease.Endpoint] = true
	calls := func() int { return m.repos["did:plc:shop"].ServiceAuths }
	before := calls()
	for range 10 {
		m.reconcileRequester()
	}
	if n := calls() - before; n != 1 {
		t.Fatalf("%d tokens minted for ten wakes at one instant, want 1", n)
	}
	got := contracts(t, m.shop)[0]
	if c := clustertest.Condition(t, got.Status.Conditions, marketv1alpha1.ConditionReady); got.Status.Phase != marketv1alpha1.ContractActive || c.Reason != ReasonTenantRefused {
		t.Fatalf("contract %s, Ready %+v; want Active with TenantRefused while the token in place serves", got.Status.Phase, c)
	}
	m.clock.advance(31 * time.Second)
	m.reconcileRequester()
	m.clock.advance(31 * time.Second)
	m.reconcileRequester()
	if n := calls() - before; n != 2 {
		t.Fatalf("%d tries 62 s after the first failure, want 2 (30 s, then 60 s)", n)
	}
	delete(m.refusing, lease.Endpoint)
	m.clock.advance(30 * time.Second)
	m.reconcileRequester()
	if c := clustertest.Condition(t, contracts(t, m.shop)[0].Status.Conditions, marketv1alpha1.ConditionReady); c.Reason != string(marketv1alpha1.ContractActive) {
		t.Fatalf("Ready %+v once the tenant takes the token again", c)
	}

	// A member writes a far expiry on the mount's Secret: not trusted
	// (the token is renewed when the one minted is due), and a token the
	// member writes there is replaced at once.
	sec := &corev1.Secret{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(cc.Name)}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["expires"] = []byte(m.clock.now().Add(24 * time.Hour).UTC().Format(time.RFC3339))
	if err := m.shop.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	was := token()
	m.clock.advance(5 * time.Minute)
	m.reconcileRequester()
	if token() == was {
		t.Fatal("a token expiring in 24 h (written by a member) was trusted")
	}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(cc.Name)}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["token"] = []byte("a member's token")
	if err := m.shop.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	minted := calls()
	m.clock.advance(time.Second) // a fake token names its expiry
	m.reconcileRequester()
	if n := calls() - minted; n != 0 {
		t.Fatalf("a member's write into the mount's Secret made %d tokens be minted", n)
	}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(cc.Name)}, sec); err != nil || token() == "a member's token" || sec.Data["token"] != nil {
		t.Fatalf("a token a member wrote into the mount's Secret was kept (%v)", err)
	}

	// The bidder's lease stops naming a service identity of its own: the
	// contract stays Active on the mount it has.
	var vms computev1alpha1.ComputeVMList
	if err := m.bidders["fit"].Client.List(ctx, &vms); err != nil || len(vms.Items) != 1 {
		t.Fatalf("VMs %v, %v", vms.Items, err)
	}
	vm := &vms.Items[0]
	vm.Status.ServiceID = "did:plc:other#knotless_tenant_aaaa"
	if err := m.bidders["fit"].Client.Status().Update(ctx, vm); err != nil {
		t.Fatal(err)
	}
	m.reconcileBidder("fit")
	m.reconcileRequester()
	got = contracts(t, m.shop)[0]
	if c := clustertest.Condition(t, got.Status.Conditions, marketv1alpha1.ConditionReady); got.Status.Phase != marketv1alpha1.ContractActive || c.Reason != ReasonTenantNotPublished {
		t.Fatalf("contract %s, Ready %+v; want Active with TenantNotPublished", got.Status.Phase, c)
	}
}

// TestForgedSecretDoesNotHoldBackAdminRemoval (attack review): a member
// being removed from spec.tenantAdmins writes into the mount's Secret what
// would say the new list was applied (its hash, a plausible expiry): the
// requester's side keeps what it applied in memory, so the tenant's
// binding names the new list.
func TestForgedSecretDoesNotHoldBackAdminRemoval(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) {
		mr.Spec.TenantAdmins = computev1alpha1.TenantAdmins{Users: []string{"alice"}}
	})
	cc := m.dealRunning(drivertest.TestCA(t))
	lease := m.leaseOf()
	m.reconcileRequester()
	m.tenantReady()
	m.reconcileRequester()

	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.TenantAdmins.Users = []string{"bob"} })
	s := &session{mr: m.requester()}
	sec := &corev1.Secret{}
	if err := m.shop.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenantCredential(cc.Name)}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["tenant-admins"] = []byte(s.adminsKey())
	sec.Data["expires"] = []byte(m.clock.now().Add(mountTokenLife).UTC().Format(time.RFC3339))
	if err := m.shop.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	m.reconcileRequester()
	crb, err := m.tenants[lease.Endpoint].RbacV1().ClusterRoleBindings().Get(ctx, mountAdminRole, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "bob"}}
	if !slices.Equal(crb.Subjects, want) {
		t.Fatalf("after alice's removal the tenant's %s still binds %+v, want %+v", mountAdminRole, crb.Subjects, want)
	}
}

// The provider's workspace failing to keep the mount's credential shows
// in the contract's status without anything of the provider's (its
// kcp's address, its user, the namespace): R17.
func TestCredentialNotKeptTellsNothingOfTheProvider(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.req.Mounts = interceptor.NewClient(m.mounts.(client.WithWatch), interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			return errors.New(`Post "https://kcp.internal:6443/clusters/root:knotless/api/v1/namespaces/knotless-mounts/secrets": dial tcp 10.1.2.3:6443: connection refused`)
		},
	})
	m.dealRunning(drivertest.TestCA(t))
	req := mcreconcile.Request{ClusterName: "shop", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "shop"}}}
	if _, err := m.req.Reconcile(context.Background(), req); err == nil {
		t.Fatal("the mount went on without its credential")
	}
	// The reconcile's retries mint nothing more until the wait is over.
	minted := m.repos["did:plc:shop"].ServiceAuths
	for range 5 {
		_, _ = m.req.Reconcile(context.Background(), req)
	}
	if n := m.repos["did:plc:shop"].ServiceAuths - minted; n != 0 {
		t.Errorf("%d tokens minted by the retries of a mount whose credential was not kept", n)
	}
	// The wait doubles while the credential is not kept: 30 s, then 60 s.
	tries := func() int {
		_, _ = m.req.Reconcile(context.Background(), req)
		return m.repos["did:plc:shop"].ServiceAuths - minted
	}
	m.clock.advance(31 * time.Second)
	first := tries()
	m.clock.advance(31 * time.Second)
	if n := tries(); first == 0 || n != first {
		t.Errorf("tokens minted: %d after 30 s, %d after 60 s; want some, then none until 90 s", first, n)
	}
	m.clock.advance(31 * time.Second)
	if n := tries(); n == first {
		t.Error("no token minted 60 s after the second failure")
	}
	cc := contracts(t, m.shop)[0]
	for _, o := range []client.Object{&cc, m.requester()} {
		raw := fmt.Sprintf("%+v", o)
		for _, leak := range []string{"kcp.internal", "10.1.2.3", "knotless-mounts", "root:knotless"} {
			if strings.Contains(raw, leak) {
				t.Errorf("%T %s tells of the provider's %q", o, o.GetName(), leak)
			}
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/process"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	mdeal "github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/mountproxy"
)

// tenantDeal is a deal (requester buyer, the given bidders) whose
// bidder workspace, bob's, runs knotless-agent with a kubeconfig for that
// workspace only. It returns the deal, the agent and bob's config; it
// skips without the mount topology or the token user bob.
func tenantDeal(ctx context.Context, t *testing.T, tag string, bidders ...string) (*deal, *agent, *rest.Config) {
	t.Helper()
	return tenantDealWith(ctx, t, tag, nil, bidders...)
}

// tenantDealWith is tenantDeal with more flags for the agent.
func tenantDealWith(ctx context.Context, t *testing.T, tag string, agentArgs []string, bidders ...string) (*deal, *agent, *rest.Config) {
	t.Helper()
	if env.frontProxy == nil {
		t.Skip("no mount topology (kcp-front-proxy and the shim): see e2e/framework/external.go")
	}
	bobCfg, err := env.kcp.UserConfig("bob")
	if err != nil {
		t.Skip("no token user bob on this kcp")
	}
	d := newDealAs(ctx, t, tag, "bob", []string{"buyer"}, bidders, nil)
	t.Cleanup(func() { d.dumpOnFailure(t) })
	bob, err := framework.ClientFor(bobCfg, root.Join(d.bidWS))
	if err != nil {
		t.Fatal(err)
	}
	// The agent runs with the identity it ships with (deploy/agent/rbac.yaml) only.
	return d, startAgent(ctx, t, d.bidWS, agentKubeconfig(ctx, t, bob, d.bidWS), agentArgs...), bobCfg
}

// TestMarketTenantMounted: the whole walk as unprivileged users. bob runs
// a bidder workspace and knotless-agent with a kubeconfig for it only;
// alice, in her socialweb-application workspace, applies a
// MarketRequester and, with no other step, gets a workspace that is the
// tenant the winning bidder runs: `kubectl get namespaces` through kcp as
// alice. The lease record carries the tenant CA's fingerprint, never a
// credential, and no record, status, Event or log of the provider, the
// agent or the mount proxy carries the mount's credential; bob's
// credential cannot read alice's workspace. Deleting
// the MarketRequester leaves no VM, process, TenantCluster, workspace,
// Secret or record behind. Figures: MarketRequester created -> namespaces
// listed through the mount, split into market, provisioning and mount.
func TestMarketTenantMounted(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	d, a, bobCfg := tenantDeal(ctx, t, "t", "acme")
	d.bidder(ctx, t, "acme", offerOf("small", 1000, 1024, 30, 1))

	start := time.Now()
	spec := requesterSpec("buyer", 1000, 1024, 50, 5)
	spec.TenantAdmins.Users = []string{"alice"}
	spec.UnresponsiveGraceSeconds = 20
	viewer, err := env.pds.CreateAccount(ctx, env.prefix+"tviewer.test")
	if err != nil {
		t.Fatal(err)
	}
	spec.TenantAccess = []marketv1alpha1.TenantAccess{{DID: viewer.DID, Role: marketv1alpha1.AccessView}}
	d.requester(ctx, t, "vms", spec)
	contractOf(ctx, t, d.app, "vms", "the requester's contract agreed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Records.Lease != nil
	})
	market_ := time.Since(start)
	bc := contractOf(ctx, t, d.bid, "acme", "the bidder's contract Active (the VM runs)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	provisioned := time.Since(start)
	rc := contractOf(ctx, t, d.app, "vms", "the requester's contract Active (the tenant mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	mounted := time.Since(start)

	// alice, through kcp-front-proxy, in the mounted workspace.
	cs := mountClient(t, "alice", d.appWS, rc.Name)
	var names []string
	if err := framework.Eventually(ctx, 2*time.Minute, "namespaces through the mount as alice", func(ctx context.Context) (bool, string, error) {
		var err error
		if names, err = namespaceNames(ctx, cs); err != nil {
			return false, err.Error(), nil
		}
		return slices.Contains(names, "default"), strings.Join(names, ","), nil
	}); err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	notTenantAdminRefused(ctx, t, d, rc.Name)
	// A guest's identity in the requester's workspace (GuestIdentityGrant):
	// the suite's own provider serves grants; an existing installation's
	// (hack/kind-e2e.sh) is not given the webhook's flags.
	if env.kcp.Process != nil {
		guestGone(ctx, t, d, cs, guestIdentity(ctx, t, d, rc.Name, cs))
	}
	t.Logf("FIGURE MarketRequester created -> kubectl get namespaces through the mount: %s (market %s, provisioning %s, mount %s, first list %s)",
		total.Round(time.Millisecond), market_.Round(time.Millisecond), (provisioned - market_).Round(time.Millisecond),
		(mounted - provisioned).Round(time.Millisecond), (total - mounted).Round(time.Millisecond))

	// The lease carries the CA's fingerprint and no credential; the VM is
	// the contract's, its credential the VM's; the copies are the
	// requester's contract's.
	vm := &computev1alpha1.ComputeVM{}
	if err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bc.Name}, vm); err != nil {
		t.Fatal(err)
	}
	ownedBy(t, vm, "ComputeContract", bc.UID)
	token := vmToken(ctx, t, d.bid, vm)
	// The mount's credential is the buyer's own service-auth token for
	// the tenant's mount alone (its PDS issued it; no credential of
	// bob's), kept in the provider's workspace. alice's workspace holds
	// the tenant's URL and CA only, and no Secret of alice's or bob's
	// workspace holds the token.
	copied := &corev1.Secret{}
	if err := d.app.Get(ctx, client.ObjectKey{Namespace: "default", Name: rc.Name + "-tenant"}, copied); err != nil {
		t.Fatal(err)
	}
	ownedBy(t, copied, "ComputeContract", rc.UID)
	if _, ok := copied.Data["token"]; ok || len(copied.Data) != 2 {
		t.Errorf("the mount's Secret in alice's workspace holds %v, want url and ca.crt only", slices.Collect(maps.Keys(copied.Data)))
	}
	mountToken := mountTokenOf(ctx, t, env.home(), d.app, rc.Name)
	for name, c := range map[string]client.Client{"alice's": d.app, "bob's": d.bid} {
		var secs corev1.SecretList
		if err := c.List(ctx, &secs); err != nil {
			t.Fatal(err)
		}
		for _, sec := range secs.Items {
			for k, v := range sec.Data {
				if strings.Contains(string(v), mountToken) {
					t.Errorf("Secret %s/%s (key %s) of %s workspace holds the mount's token", sec.Namespace, sec.Name, k, name)
				}
			}
		}
	}
	if claims := jwtClaims(t, mountToken); mountToken == token || claims["iss"] != d.accounts["buyer"].DID || claims["aud"] != vm.Status.ServiceID ||
		claims["lxm"] != serviceauth.MountMethod {
		t.Errorf("the mount's token has claims %v, want the buyer's DID's for %s and the mount", claims, vm.Status.ServiceID)
	}
	mountTokenImpersonatesTenantAdminsOnly(ctx, t, vm, mountToken, d.accounts["buyer"].DID)
	secrets := []string{token, mountToken}
	leases := listCollection(ctx, t, env.pds, d.accounts["acme"].DID, lexicon.Lease)
	for _, l := range leases {
		rec := decodeRecord[market.Lease](t, l)
		if rec.CAFingerprint != vm.Status.CAFingerprint || rec.State != mdeal.LeaseRunning || rec.CABundle != vm.Status.CABundle ||
			rec.Endpoint != vm.Status.Endpoint || rec.ServiceID == "" || rec.ServiceID != vm.Status.ServiceID {
			t.Errorf("lease %s: %+v, want running with the VM's CA, fingerprint %q, endpoint %q and service identity %q", l.URI, rec,
				vm.Status.CAFingerprint, vm.Status.Endpoint, vm.Status.ServiceID)
		}
	}
	for _, l := range leases {
		membersCannotForge(ctx, t, d, vm, l)
	}
	// The requester's DID administers the tenant directly: kubectl
	// knotless kubeconfig of alice's contract (the lease read from the
	// bidder's PDS) as the buyer's identity sees the namespace alice
	// made through the mount, and makes one alice sees there.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "by-alice"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	byDID := didClient(ctx, t, d.accounts["buyer"], d.appWS, rc.Name)
	if _, err := byDID.CoreV1().Namespaces().Get(ctx, "by-alice", metav1.GetOptions{}); err != nil {
		t.Errorf("the buyer's DID does not see the namespace alice made through the mount: %v", err)
	}
	if _, err := byDID.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "by-buyer-did"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("the buyer's DID cannot create a namespace: %v", err)
	} else if _, err := cs.CoreV1().Namespaces().Get(ctx, "by-buyer-did", metav1.GetOptions{}); err != nil {
		t.Errorf("alice does not see, through the mount, the namespace the buyer's DID made: %v", err)
	}
	// spec.tenantAccess: the requester's side applied it into the tenant
	// with its own identity (nothing read from bob's workspace); the
	// viewer's DID lists and cannot create.
	contractOf(ctx, t, d.app, "vms", "the tenant access applied", func(cc *marketv1alpha1.ComputeContract) bool {
		return meta.IsStatusConditionTrue(cc.Status.Conditions, marketv1alpha1.ConditionTenantAccess)
	})
	asViewer := didClient(ctx, t, viewer, d.appWS, rc.Name)
	if err := framework.Eventually(ctx, time.Minute, "the viewer's DID lists namespaces (the agent reads the tenant's RBAC every 15 s)", func(ctx context.Context) (bool, string, error) {
		_, err := asViewer.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Error(err)
	}
	if _, err := asViewer.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "by-viewer"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the viewer's DID creates a namespace: %v, want 403", err)
	}
	for _, did := range []string{d.accounts["acme"].DID, d.accounts["buyer"].DID} {
		for _, col := range []string{lexicon.Request, lexicon.Bid, lexicon.Accept, lexicon.Lease, lexicon.Presence} {
			for _, r := range listCollection(ctx, t, env.pds, did, col) {
				for _, st := range secrets {
					if strings.Contains(string(r.Value), st) {
						t.Errorf("record %s carries a credential", r.URI)
					}
				}
			}
		}
	}
	for _, o := range []client.Object{rc, bc} {
		for _, st := range secrets {
			if raw := fmt.Sprintf("%+v", o); strings.Contains(raw, st) {
				t.Errorf("%T %s carries the credential", o, o.GetName())
			}
		}
	}
	// Nor does any Event of either workspace, or the log of the provider,
	// the agent or the mount proxy.
	for name, c := range map[string]client.Client{"alice's": d.app, "bob's": d.bid} {
		var evs corev1.EventList
		if err := c.List(ctx, &evs); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			for _, st := range secrets {
				if strings.Contains(ev.Message, st) {
					t.Errorf("an Event in %s workspace carries a credential: %s", name, ev.Reason)
				}
			}
		}
	}
	logs := []*framework.Process{env.provider.Process, a.proc}
	switch {
	case env.mountProxy != nil && env.mountProxy.Process != nil:
		logs = append(logs, env.mountProxy.Process)
	case env.mountProxy != nil:
		t.Log("the existing shim (framework.External) is no process of the suite's: its log is not read here")
	}
	for _, p := range logs {
		raw, err := os.ReadFile(p.LogPath)
		if err != nil {
			t.Errorf("the log of %s cannot be read: %v", p.Name, err)
		}
		for _, st := range secrets {
			if strings.Contains(string(raw), st) {
				t.Errorf("the log of %s carries a credential", p.Name)
			}
		}
	}
	// bob's credential (the agent's) cannot read alice's workspace.
	bobApp, err := framework.ClientFor(bobCfg, root.Join(d.appWS))
	if err != nil {
		t.Fatal(err)
	}
	if err := bobApp.List(ctx, &marketv1alpha1.MarketRequesterList{}); !apierrors.IsForbidden(err) {
		t.Errorf("bob listing alice's MarketRequesters: %v, want Forbidden", err)
	}

	// The tenant stops answering (SIGSTOP) for less than the grace:
	// nothing is released.
	pids := process.PIDs(a.root)
	if len(pids) != 1 {
		t.Fatalf("VM processes %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	contractOf(ctx, t, d.app, "vms", "the contract says its tenant does not answer", func(cc *marketv1alpha1.ComputeContract) bool {
		c := meta.FindStatusCondition(cc.Status.Conditions, marketv1alpha1.ConditionReady)
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractActive && c != nil && c.Reason == "TenantUnresponsive"
	})
	if err := syscall.Kill(pids[0], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	contractOf(ctx, t, d.app, "vms", "the contract healthy again", func(cc *marketv1alpha1.ComputeContract) bool {
		c := meta.FindStatusCondition(cc.Status.Conditions, marketv1alpha1.ConditionReady)
		return cc.Name == rc.Name && c != nil && c.Status == metav1.ConditionTrue
	})
	if n := len(listCollection(ctx, t, env.pds, d.accounts["buyer"].DID, lexicon.Release)); n != 0 {
		t.Fatalf("released after a pause shorter than the grace (%d release records)", n)
	}
	// For longer than the grace: released as provider-unresponsive, and
	// another contract is made (acme again, once its VM is gone).
	start = time.Now()
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	contractOf(ctx, t, d.app, "vms", "the unresponsive contract released", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Reason == string(mdeal.ProviderUnresponsive)
	})
	t.Logf("FIGURE tenant stopped -> released as provider-unresponsive: %s (grace 20 s)", time.Since(start).Round(time.Millisecond))
	rc2 := contractOf(ctx, t, d.app, "vms", "a new contract Active", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name != rc.Name && cc.Status.Phase == marketv1alpha1.ContractActive
	})
	t.Logf("FIGURE tenant stopped -> a new tenant mounted: %s", time.Since(start).Round(time.Millisecond))
	if driver.Alive(pids[0]) {
		t.Errorf("the unresponsive VM's process %d still runs", pids[0])
	}
	bc = contractOf(ctx, t, d.bid, "acme", "the bidder's new contract", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Spec.Accept == rc2.Spec.Accept
	})
	rc = rc2

	// Deleting the MarketRequester leaves nothing behind, in the
	// provider's workspace neither.
	aliceLC := mountCluster(ctx, t, d.app, rc.Name)
	pids = process.PIDs(a.root)
	if err := d.app.Delete(ctx, getMR(ctx, t, d.app, "vms")); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 3*time.Minute, "everything of the deal gone", func(ctx context.Context) (bool, string, error) {
		var left []string
		if err := d.app.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vms"}, &marketv1alpha1.MarketRequester{}); err == nil {
			left = append(left, "MarketRequester")
		}
		if err := d.app.Get(ctx, client.ObjectKey{Name: rc.Name}, &computev1alpha1.TenantCluster{}); err == nil {
			left = append(left, "TenantCluster")
		}
		if err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bc.Name}, &computev1alpha1.ComputeVM{}); err == nil {
			left = append(left, "ComputeVM")
		}
		if n := len(process.PIDs(a.root)); n > 0 {
			left = append(left, fmt.Sprintf("%d VM directories", n))
		}
		var creds corev1.SecretList
		if err := providerClient(t, env.home()).List(ctx, &creds, client.InNamespace(tenant.MarketNamespace), client.MatchingLabels{tenant.LabelMarketCluster: aliceLC}); err != nil {
			return false, "", err
		} else if n := len(creds.Items); n > 0 {
			left = append(left, fmt.Sprintf("%d mount credentials in the provider's workspace", n))
		}
		for _, did := range []string{d.accounts["acme"].DID, d.accounts["buyer"].DID} {
			for _, col := range []string{lexicon.Request, lexicon.Bid, lexicon.Accept, lexicon.Lease, lexicon.Release} {
				if n := len(listCollection(ctx, t, env.pds, did, col)); n > 0 {
					left = append(left, fmt.Sprintf("%d %s of %s", n, col, did))
				}
			}
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if driver.Alive(pid) {
			t.Errorf("the VM's process %d still runs", pid)
		}
	}
	contractOf(ctx, t, d.bid, "acme", "the bidder's contract Completed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == bc.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.RequesterDeleted)
	})
}

// mountClient is user's client for the tenant mounted as workspace
// contract in ws, through kcp-front-proxy.
func mountClient(t *testing.T, user, ws, contract string) kubernetes.Interface {
	t.Helper()
	return mountClientOn(t, env.home(), user, ws, contract)
}

// mountClientOn is mountClient on the installation in.
func mountClientOn(t *testing.T, in *installation, user, ws, contract string) kubernetes.Interface {
	t.Helper()
	cfg, err := in.frontProxy.UserConfig(user, root.Join(ws).Join(contract).String())
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

func namespaceNames(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, ns := range nss.Items {
		names = append(names, ns.Name)
	}
	return names, nil
}

// membersCannotForge: a member of either side's workspace cannot act for
// the market's kinds on a live deal. The requester's cannot publish a
// release of the live lease with an AtprotoRecord (kcp refuses the
// collection at admission, naming the kinds that write it: R22); the
// bidder's cannot make a StateSync of the VM, which the agent would run
// as the tenant's admin (the export's maximal permission policy leaves
// create to the provider: R20).
func membersCannotForge(ctx context.Context, t *testing.T, d *deal, vm *computev1alpha1.ComputeVM, lease pdsRecord) {
	t.Helper()
	release := record("forged-release", "buyer", "forged", fmt.Sprintf(`{"$type":%q,"lease":{"uri":%q,"cid":%q},"reason":"expired","createdAt":%q}`,
		lexicon.Release, lease.URI, lease.CID, time.Now().UTC().Format(time.RFC3339)))
	release.Spec.Collection = lexicon.Release
	if err := d.app.Create(ctx, release); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "MarketRequester") {
		t.Errorf("an AtprotoRecord releasing the live lease: %v, want Invalid naming MarketRequester", err)
	}
	cannotMakeStateSync(ctx, t, d.bid, vm, "the bidder workspace's owner")
}

// mountTokenImpersonatesTenantAdminsOnly: the mount's token, taken to
// the tenant directly, is the mount's own user there (not the
// requester's DID): it may do nothing itself and may impersonate
// spec.tenantAdmins (alice) alone, never system:masters, another user
// or a kcp extra.
func mountTokenImpersonatesTenantAdminsOnly(ctx context.Context, t *testing.T, vm *computev1alpha1.ComputeVM, token, requester string) {
	t.Helper()
	as := func(imp rest.ImpersonationConfig) error {
		cfg := &rest.Config{Host: vm.Status.Endpoint, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: []byte(vm.Status.CABundle)}, Impersonate: imp}
		_, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}
	if err := as(rest.ImpersonationConfig{UserName: "alice"}); err != nil {
		t.Errorf("the mount's token impersonating alice (a tenant admin): %v", err)
	}
	for name, imp := range map[string]rest.ImpersonationConfig{
		"itself":                     {},
		"another user":               {UserName: "mallory"},
		"alice in system:masters":    {UserName: "alice", Groups: []string{"system:masters"}},
		"alice with kubeadm's group": {UserName: "alice", Groups: []string{"kubeadm:cluster-admins"}},
		"alice with a kcp extra":     {UserName: "alice", Extra: map[string][]string{"authorization.kcp.io/warrant": {"{}"}}},
		"the requester's DID":        {UserName: requester},
	} {
		if err := as(imp); !apierrors.IsForbidden(err) {
			t.Errorf("the mount's token as %s: %v, want 403", name, err)
		}
	}
}

// mountTokenOf is the token of the mount of the contract contract of the
// requester workspace ws (the TenantCluster of its name), as the provider
// of the installation in keeps it in its own workspace
// (tenant.MarketNamespace).
func mountTokenOf(ctx context.Context, t *testing.T, in *installation, ws client.Client, contract string) string {
	t.Helper()
	sec := &corev1.Secret{}
	if err := providerClient(t, in).Get(ctx, client.ObjectKey{Namespace: tenant.MarketNamespace, Name: tenant.MarketSecretName(mountCluster(ctx, t, ws, contract), contract)}, sec); err != nil {
		t.Fatalf("the mount's credential in the provider's workspace: %v", err)
	}
	return string(sec.Data["token"])
}

// mountCluster is the logical cluster of the market mount contract of
// the workspace ws, as its TenantCluster's status.url names it.
func mountCluster(ctx context.Context, t *testing.T, ws client.Client, contract string) string {
	t.Helper()
	tc := &computev1alpha1.TenantCluster{}
	if err := ws.Get(ctx, client.ObjectKey{Name: contract}, tc); err != nil {
		t.Fatal(err)
	}
	// status.url is <mount proxy>/tenants/<logical cluster>/<name>.
	parts := strings.Split(strings.TrimSuffix(tc.Status.URL, "/"), "/")
	if len(parts) < 3 || parts[len(parts)-3] != "tenants" || !tc.Spec.Credential.Market {
		t.Fatalf("TenantCluster %s: status.url %q, credential %+v; want a market mount", contract, tc.Status.URL, tc.Spec.Credential)
	}
	return parts[len(parts)-2]
}

// providerClient is a client of the provider workspace of in, as kcp's
// admin.
func providerClient(t *testing.T, in *installation) client.Client {
	t.Helper()
	pc, err := framework.ClientFor(in.admin, in.providerWS)
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// notTenantAdminRefused: carol, whom alice lets into her workspace but who
// is none of spec.tenantAdmins, is refused at the mount (403
// NotTenantAdmin): nothing of hers reaches the tenant.
func notTenantAdminRefused(ctx context.Context, t *testing.T, d *deal, contract string) {
	t.Helper()
	if _, err := env.kcp.UserConfig("carol"); err != nil {
		t.Log("no token user carol on this kcp: the refusal of a workspace user who is not a tenant admin is not checked")
		return
	}
	create(ctx, t, d.app, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e:enter"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/"}, Verbs: []string{"access"}}}})
	create(ctx, t, d.app, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e:enter"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e:enter"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "carol"}}})
	cfg, err := env.frontProxy.UserConfig("carol", root.Join(d.appWS).Join(contract).String())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: rt, Timeout: 30 * time.Second}
	if err := framework.Eventually(ctx, time.Minute, "carol refused at the mount as no tenant admin", func(ctx context.Context) (bool, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/api/v1/namespaces", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		_ = resp.Body.Close()
		reason := resp.Header.Get(mountproxy.ReasonHeader)
		return resp.StatusCode == http.StatusForbidden && reason == mountproxy.ReasonNotTenantAdmin, fmt.Sprintf("%d %s", resp.StatusCode, reason), nil
	}); err != nil {
		t.Error(err)
	}
}

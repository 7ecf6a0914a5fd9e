package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/marketrequester"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/process"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	mdeal "github.com/knotless-dev/knotless/internal/market/deal"
)

// requesterWorkspace makes another requester's workspace of the deal:
// socialweb-application, made by user with kubectl ws create, with the
// network and an identity name the deal's operator vouches for with the
// requester role.
func (d *deal) requesterWorkspace(ctx context.Context, t *testing.T, tag, user, name string) (client.Client, string) {
	t.Helper()
	ws := env.prefix + "-" + tag + "-" + name
	c := userWorkspaceAs(ctx, t, ws, "socialweb-application", user)
	create(ctx, t, c, network("net", []string{env.pds.URL}, d.op.DID))
	d.accounts[name] = participant(ctx, t, c, env.pds, env.prefix+tag+name+".test", name, "net")
	d.vouch(ctx, t, marketv1alpha1.Association{DID: d.accounts[name].DID, Roles: []marketv1alpha1.Role{marketv1alpha1.RoleRequester}})
	return c, ws
}

// TestMarketTenantReclaimed: a bidder takes VMs back after the notice
// their requests asked for. bob's bidder acme runs the tenants of two
// requesters in two workspaces, alice's (notice 180 s) and carol's (25 s,
// acme only). Neither sees the other's tenant: each workspace holds one
// mount, alice cannot enter carol's mounted workspace, alice's mount
// credential is refused by carol's tenant and carol's namespace is not in
// alice's. bob lists both contracts in acme's spec.reclaims (and takes
// acme's capacity away): acme publishes reclaim records whose
// terminateAfter is each request's notice away. alice's side buys the
// next VM from beta while acme's runs, and gives acme's back (reason
// reclaimed) only once beta's is mounted; carol's has no other bidder,
// and acme stops her VM only after the notice, her contract Completed
// (reclaimed). Deleting both requesters leaves no VM, process or record.
// Figures: reclaim -> the next tenant mounted; terminateAfter -> the
// reclaimed VM gone.
func TestMarketTenantReclaimed(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	d, a, _ := tenantDeal(ctx, t, "rcl", "acme", "beta")
	if _, err := env.kcp.UserConfig("carol"); err != nil {
		t.Skip("no user carol on this kcp")
	}
	carolApp, carolWS := d.requesterWorkspace(ctx, t, "rcl", "carol", "carol")
	d.bidder(ctx, t, "acme", offerOf("small", 1000, 1024, 20, 2))
	d.bidder(ctx, t, "beta", offerOf("small", 1000, 1024, 40, 2))

	spec := requesterSpec("buyer", 1000, 1024, 50, 5)
	spec.TenantAdmins.Users = []string{"alice"}
	spec.NoticeSeconds = 180
	d.requester(ctx, t, "vms", spec)
	cspec := requesterSpec("carol", 1000, 1024, 50, 5)
	cspec.TenantAdmins.Users = []string{"carol"}
	cspec.NoticeSeconds = 25
	cspec.Policy.AllowedBidders = []string{d.accounts["acme"].DID}
	create(ctx, t, carolApp, &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Name: "vms", Namespace: "default"}, Spec: cspec})

	ra := contractOf(ctx, t, d.app, "vms", "alice's contract Active", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	rc := contractOf(ctx, t, carolApp, "vms", "carol's contract Active", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	if ra.Spec.BidderDID != d.accounts["acme"].DID || rc.Spec.BidderDID != d.accounts["acme"].DID {
		t.Fatalf("contracts with %s and %s, want acme for both", ra.Spec.BidderDID, rc.Spec.BidderDID)
	}

	// The requesters never see each other's tenant.
	csA, csC := mountClient(t, "alice", d.appWS, ra.Name), mountClient(t, "carol", carolWS, rc.Name)
	if err := framework.Eventually(ctx, 2*time.Minute, "carol makes a namespace in her tenant", func(ctx context.Context) (bool, string, error) {
		_, err := csC.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "carol-only"}}, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := framework.Eventually(ctx, 2*time.Minute, "namespaces of alice's tenant", func(ctx context.Context) (bool, string, error) {
		var err error
		names, err = namespaceNames(ctx, csA)
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, "carol-only") {
		t.Errorf("alice's tenant lists carol's namespace: %v", names)
	}
	for who, c := range map[string]client.Client{"alice": d.app, "carol": carolApp} {
		var tcs computev1alpha1.TenantClusterList
		if err := c.List(ctx, &tcs); err != nil {
			t.Fatal(err)
		}
		if len(tcs.Items) != 1 {
			t.Errorf("%s's workspace holds %d TenantClusters, want her own", who, len(tcs.Items))
		}
	}
	if _, err := mountClient(t, "alice", carolWS, rc.Name).CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice entering carol's mounted workspace: %v, want Forbidden", err)
	}
	bcC := contractOf(ctx, t, d.bid, "acme", "carol's contract at acme", func(cc *marketv1alpha1.ComputeContract) bool { return cc.Spec.Accept == rc.Spec.Accept })
	bcA := contractOf(ctx, t, d.bid, "acme", "alice's contract at acme", func(cc *marketv1alpha1.ComputeContract) bool { return cc.Spec.Accept == ra.Spec.Accept })
	vmC := waitVM(ctx, t, d.bid, bcC.Name, "carol's VM", time.Minute, func(vm *computev1alpha1.ComputeVM) bool { return vm.Status.Phase == computev1alpha1.VMRunning })
	vmA := waitVM(ctx, t, d.bid, bcA.Name, "alice's VM", time.Minute, func(vm *computev1alpha1.ComputeVM) bool { return vm.Status.Phase == computev1alpha1.VMRunning })
	if code := tenantGet(ctx, t, vmC, mountTokenOf(ctx, t, env.home(), d.app, ra.Name), "/api", "alice", ""); code != http.StatusUnauthorized {
		t.Errorf("carol's tenant answered alice's mount credential with %d, want 401", code)
	}
	pidA, pidC := process.PIDOf(a.root, string(vmA.UID)), process.PIDOf(a.root, string(vmC.UID))
	if !driver.Alive(pidA) || !driver.Alive(pidC) {
		t.Fatalf("VM processes %d and %d", pidA, pidC)
	}

	// bob takes both VMs back (and sells no more).
	start := time.Now()
	mergePatch(ctx, t, d.bid, getMB(ctx, t, d.bid, "acme"), map[string]any{
		"offers":   []marketv1alpha1.Offer{offerOf("small", 1000, 1024, 20, 0)},
		"reclaims": []marketv1alpha1.Reclaim{{Contract: bcA.Name}, {Contract: bcC.Name, Reason: marketv1alpha1.ReclaimCapacity}},
	})
	var byC time.Time
	waitPDS(ctx, t, "acme's reclaim records", func() (bool, string) {
		recs := listCollection(ctx, t, env.pds, d.accounts["acme"].DID, lexicon.Reclaim)
		var got []string
		for _, r := range recs {
			rec := decodeRecord[market.Reclaim](t, r)
			by, at := market.ParseTime(rec.TerminateAfter), market.ParseTime(rec.CreatedAt)
			got = append(got, fmt.Sprintf("%s %s %s", rec.Reason, by.Sub(at), rec.Lease.URI))
			if rec.Lease.URI == bcC.Status.Records.Lease.URI {
				byC = by
			}
		}
		want := []string{"maintenance 3m0s " + bcA.Status.Records.Lease.URI, "capacity 25s " + bcC.Status.Records.Lease.URI}
		slices.Sort(got)
		slices.Sort(want)
		return slices.Equal(got, want), strings.Join(got, "; ")
	})
	contractOf(ctx, t, d.app, "vms", "alice's contract says it is reclaimed", func(cc *marketv1alpha1.ComputeContract) bool {
		c := meta.FindStatusCondition(cc.Status.Conditions, marketv1alpha1.ConditionReady)
		return cc.Name == ra.Name && cc.Status.Reclaim != nil && !cc.Status.Reclaim.ShortNotice && c != nil && c.Reason == marketrequester.ReasonReclaimed
	})

	// carol has nobody else: her VM runs until the notice ran out, then
	// goes, and her contract ends Completed (reclaimed).
	if wait := time.Until(byC) - 3*time.Second; wait > 0 {
		time.Sleep(wait)
	}
	if !driver.Alive(pidC) {
		t.Fatalf("carol's VM stopped before its notice ran out (%s)", market.Time(byC))
	}
	if _, err := namespaceNames(ctx, csC); err != nil {
		t.Errorf("carol's tenant 3 s before the notice ran out: %v", err)
	}
	contractOf(ctx, t, carolApp, "vms", "carol's contract Completed (reclaimed)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.Reclaimed)
	})
	if err := framework.Eventually(ctx, time.Minute, "carol's VM process gone", func(ctx context.Context) (bool, string, error) {
		return !driver.Alive(pidC), "", nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE terminateAfter -> the reclaimed VM gone: %s", time.Since(byC).Round(time.Millisecond))

	// alice's next VM comes from beta while acme's runs; acme's goes
	// only once beta's is mounted.
	next := contractOf(ctx, t, d.app, "vms", "alice's next contract Active", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name != ra.Name && cc.Status.Phase == marketv1alpha1.ContractActive
	})
	mounted := time.Since(start)
	if next.Spec.BidderDID != d.accounts["beta"].DID {
		t.Errorf("alice's next contract is with %s, want beta", next.Spec.BidderDID)
	}
	// Given back by alice's side (a release record), not ended by acme
	// when the notice ran out.
	contractOf(ctx, t, d.app, "vms", "alice's reclaimed contract given back", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == ra.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReleaseReclaimed) && cc.Status.Records.Release != nil
	})
	t.Logf("FIGURE reclaim -> alice's next tenant mounted: %s (notice 180 s)", mounted.Round(time.Millisecond))
	if err := framework.Eventually(ctx, time.Minute, "acme's VM of alice gone", func(ctx context.Context) (bool, string, error) {
		return !driver.Alive(pidA), "", nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := namespaceNames(ctx, mountClient(t, "alice", d.appWS, next.Name)); err != nil {
		t.Errorf("alice's next tenant: %v", err)
	}

	// Deleting both requesters leaves nothing.
	for _, c := range []client.Client{d.app, carolApp} {
		if err := c.Delete(ctx, getMR(ctx, t, c, "vms")); err != nil {
			t.Fatal(err)
		}
	}
	if err := framework.Eventually(ctx, 3*time.Minute, "everything of the deals gone", func(ctx context.Context) (bool, string, error) {
		var left []string
		var vms computev1alpha1.ComputeVMList
		if err := d.bid.List(ctx, &vms, client.InNamespace("default")); err == nil && len(vms.Items) > 0 {
			left = append(left, fmt.Sprintf("%d ComputeVMs", len(vms.Items)))
		}
		if n := len(process.PIDs(a.root)); n > 0 {
			left = append(left, fmt.Sprintf("%d VM directories", n))
		}
		for _, did := range []string{d.accounts["acme"].DID, d.accounts["beta"].DID, d.accounts["buyer"].DID, d.accounts["carol"].DID} {
			for _, col := range []string{lexicon.Request, lexicon.Bid, lexicon.Accept, lexicon.Lease, lexicon.Release, lexicon.Reclaim} {
				if n := len(listCollection(ctx, t, env.pds, did, col)); n > 0 {
					left = append(left, fmt.Sprintf("%d %s of %s", n, col, did))
				}
			}
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/marketrequester"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/driver/process"
	"github.com/knotless-dev/knotless/internal/lexicon"
	mdeal "github.com/knotless-dev/knotless/internal/market/deal"
)

// TestMarketAcrossInstallations (issue 29, R20): deals between two
// installations of knotless that share nothing but the ATProto network
// (one PLC, two PDSes). Installation B is the suite's: bob's bidder acme
// with its knotless-agent, and the market's operator, on the first PDS.
// Installation A is a second kcp with its own kcp-front-proxy, provider
// and mount proxy: alice's application workspace with the requester
// shop, and bob's bidder beta with its own agent, both on the second
// PDS. Each provider has a kubeconfig for its own kcp only.
//
// shop buys from acme (beta takes no work yet): acme's tenant is mounted
// into alice's workspace on A and she writes to it through kcp there;
// `kubectl knotless kubeconfig` gives shop's DID the same tenant
// directly. acme then has no capacity left, beta takes work, and shop
// releases with an export: the snapshot stays in alice's workspace on A,
// acme's VM on B stops, leaving no process. Wanted again with
// spec.restoreFrom, the tenant moves to beta on A (a deal within one
// installation, by the same path) and the restored ConfigMap is read
// through the new mount. Deleting the MarketRequester removes its records
// and beta's VM. What crossed between the installations was signed
// records and the tenant. Cost: the second installation (about 35 s), one
// more agent and PDS, two tenants. Figures: the second installation
// ready; MarketRequester created -> written through the mount; release ->
// Completed; wanted again -> restored objects read.
func TestMarketAcrossInstallations(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	start := time.Now()
	a := startInstallation(ctx, t, env.prefix+"-other")
	t.Logf("FIGURE a second installation (kcp, kcp-front-proxy, provider, mount proxy) ready in %s", time.Since(start).Round(time.Millisecond))
	repoRoot, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pds2, err := framework.StartPDS(ctx, env.group, repoRoot, filepath.Join(env.dir, "pds-open"), env.plc.URL)
	if err != nil {
		t.Fatal(err)
	}
	firehoses := []string{env.pds.URL, pds2.URL}

	// B: the operator and acme (tenantDeal), following both PDSes.
	d, agentB, _ := tenantDeal(ctx, t, "open", "acme")
	for _, c := range []client.Client{d.opWS, d.bid} {
		mergePatch(ctx, t, c, &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "net"}}, map[string]any{"firehoses": firehoses})
	}
	d.bidder(ctx, t, "acme", offerOf("small", 1000, 1024, 30, 1))
	// A: alice's workspace with shop, and beta.
	d.appWS = env.prefix + "-open-shop"
	d.app = userWorkspaceOn(ctx, t, a, d.appWS, "socialweb-application", "alice")
	create(ctx, t, d.app, network("net", firehoses, d.op.DID))
	d.accounts["shop"] = participant(ctx, t, d.app, pds2, env.prefix+"openshop.test", "shop", "net")
	betaWS := env.prefix + "-open-beta"
	beta := &deal{bid: userWorkspaceOn(ctx, t, a, betaWS, "market-bidder", "bob")}
	create(ctx, t, beta.bid, network("net", firehoses, d.op.DID))
	d.accounts["beta"] = participant(ctx, t, beta.bid, pds2, env.prefix+"openbeta.test", "beta", "net")
	d.vouch(ctx, t, marketv1alpha1.Association{DID: d.accounts["shop"].DID, Roles: []marketv1alpha1.Role{marketv1alpha1.RoleRequester}},
		marketv1alpha1.Association{DID: d.accounts["beta"].DID, Roles: []marketv1alpha1.Role{marketv1alpha1.RoleBidder}})
	agentA := startAgent(ctx, t, betaWS, agentKubeconfigOn(ctx, t, a, beta.bid, betaWS))
	// beta takes work only once the tenant moves.
	beta.bidder(ctx, t, "beta", offerOf("small", 1000, 1024, 40, 0))

	start = time.Now()
	spec := exportingSpec("shop")
	d.requester(ctx, t, "vms", spec)
	rc := contractOf(ctx, t, d.app, "vms", "the contract on A Active (the tenant mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	if rc.Spec.BidderDID != d.accounts["acme"].DID {
		t.Fatalf("the contract went to %s, want acme", rc.Spec.BidderDID)
	}
	bc := contractOf(ctx, t, d.bid, "acme", "acme's contract on B", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Spec.Accept == rc.Spec.Accept && cc.Spec.RequesterDID == d.accounts["shop"].DID
	})
	cs := mountClientOn(t, a, "alice", d.appWS, rc.Name)
	if err := framework.Eventually(ctx, 2*time.Minute, "alice writes to the tenant through kcp A", func(ctx context.Context) (bool, string, error) {
		names, err := namespaceNames(ctx, cs)
		if err != nil || !slices.Contains(names, "default") {
			return false, fmt.Sprint(names, err), nil
		}
		_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		_, err = cs.CoreV1().ConfigMaps("shop").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"currency": "EUR"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE across installations: MarketRequester created -> written through the mount: %s", time.Since(start).Round(time.Millisecond))
	// shop's DID, straight to the tenant with kubectl knotless.
	if _, err := didClientOn(ctx, t, a, pds2, d.accounts["shop"], d.appWS, rc.Name).CoreV1().ConfigMaps("shop").Get(ctx, "settings", metav1.GetOptions{}); err != nil {
		t.Errorf("shop's DID reading the ConfigMap with kubectl knotless: %v", err)
	}
	// alice's workspace is not on B: B's mount serves nothing of it.
	if _, err := mountClient(t, "alice", d.appWS, rc.Name).CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("B's kcp-front-proxy answered for alice's mount on A")
	}

	// acme is full, beta takes work; the release with an export: the
	// snapshot stays on A, the VM on B stops.
	mergePatch(ctx, t, d.bid, getMB(ctx, t, d.bid, "acme"), map[string]any{"offers": []marketv1alpha1.Offer{offerOf("small", 1000, 1024, 30, 0)}})
	mergePatch(ctx, t, beta.bid, getMB(ctx, t, beta.bid, "beta"), map[string]any{"offers": []marketv1alpha1.Offer{offerOf("small", 1000, 1024, 40, 1)}})
	start = time.Now()
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 0})
	contractOf(ctx, t, d.app, "vms", "the contract Completed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReplicasLowered)
	})
	t.Logf("FIGURE across installations: release with export -> Completed: %s", time.Since(start).Round(time.Millisecond))
	var snap corev1.SecretList
	if err := d.app.List(ctx, &snap, client.InNamespace("default"), client.MatchingLabels{marketrequester.LabelSnapshot: rc.Name}); err != nil || len(snap.Items) == 0 {
		t.Fatalf("no snapshot in alice's workspace on A: %v", err)
	}
	if err := framework.Eventually(ctx, time.Minute, "acme's VM gone from B", func(ctx context.Context) (bool, string, error) {
		err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bc.Name}, &computev1alpha1.ComputeVM{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if left := process.PIDs(agentB.root); len(left) != 0 {
		t.Errorf("VM processes left on B after the release: %v", left)
	}

	// Wanted again from the snapshot: beta, on A, gets it.
	start = time.Now()
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 1, "restoreFrom": rc.Name})
	rc2 := contractOf(ctx, t, d.app, "vms", "the second contract Active (restored and mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name != rc.Name && cc.Status.Phase == marketv1alpha1.ContractActive
	})
	if rc2.Spec.BidderDID != d.accounts["beta"].DID {
		t.Fatalf("the second contract went to %s, want beta", rc2.Spec.BidderDID)
	}
	if err := settingsRestored(ctx, mountClientOn(t, a, "alice", d.appWS, rc2.Name), "the restored ConfigMap in beta's tenant as alice"); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE across installations: wanted again with restoreFrom -> restored objects read on A: %s", time.Since(start).Round(time.Millisecond))
	for name, c := range map[string]client.Client{"acme's": d.bid, "beta's": beta.bid} {
		var syncs computev1alpha1.StateSyncList
		if err := c.List(ctx, &syncs); err != nil || len(syncs.Items) != 0 {
			t.Errorf("StateSyncs in %s workspace: %v, %v", name, syncs.Items, err)
		}
	}

	if err := d.app.Delete(ctx, getMR(ctx, t, d.app, "vms")); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 2*time.Minute, "the requester's records and beta's VM gone", func(ctx context.Context) (bool, string, error) {
		var left []string
		for _, col := range []string{lexicon.Request, lexicon.Accept, lexicon.Release} {
			if n := len(listCollection(ctx, t, pds2, d.accounts["shop"].DID, col)); n > 0 {
				left = append(left, fmt.Sprintf("%d %s", n, col))
			}
		}
		var vms computev1alpha1.ComputeVMList
		if err := beta.bid.List(ctx, &vms, client.InNamespace("default")); err != nil || len(vms.Items) > 0 {
			left = append(left, fmt.Sprintf("%d ComputeVMs (%v)", len(vms.Items), err))
		}
		if n := len(process.PIDs(agentA.root)); n > 0 {
			left = append(left, fmt.Sprintf("%d VM processes on A", n))
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
}

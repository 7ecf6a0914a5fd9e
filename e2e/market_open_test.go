package e2e

import (
	"context"
	"fmt"
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

// TestMarketAcrossInstallations (issue 29, R20): a deal between two
// installations of knotless that share nothing but the ATProto network
// (the PLC and the PDS). bob's bidder acme, its knotless-agent and the
// market's operator are on the suite's kcp; alice's application
// workspace, with the requester shop, on a second kcp with its own
// kcp-front-proxy, provider and mount proxy. Each provider has a
// kubeconfig for its own kcp only. alice's MarketRequester gets acme's
// tenant mounted into her workspace on the second kcp, and she writes to
// it through kcp there; a release with an export keeps the snapshot in
// her workspace there and the VM on the first kcp stops, leaving no
// process. What crossed between the two was signed records and the
// tenant. Figures: the second installation ready; MarketRequester
// created -> namespaces listed through the mount; release -> Completed.
func TestMarketAcrossInstallations(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	start := time.Now()
	other := startInstallation(ctx, t, env.prefix+"-other")
	t.Logf("FIGURE a second installation (kcp, kcp-front-proxy, provider, mount proxy) ready in %s", time.Since(start).Round(time.Millisecond))

	d, a, _ := tenantDeal(ctx, t, "open", "acme")
	d.bidder(ctx, t, "acme", offerOf("small", 1000, 1024, 30, 1))
	d.app, d.appWS = d.requesterWorkspace(ctx, t, other, "open", "alice", "shop")

	start = time.Now()
	spec := requesterSpec("shop", 1000, 1024, 50, 5)
	spec.TenantAdmins.Users = []string{"alice"}
	spec.StateSync = marketv1alpha1.StateSyncPolicy{Mode: marketv1alpha1.StateSyncExport, Resources: []computev1alpha1.GroupResource{{Resource: "configmaps"}}}
	d.requester(ctx, t, "vms", spec)
	rc := contractOf(ctx, t, d.app, "vms", "the contract on the second installation Active (the tenant mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	if rc.Spec.BidderDID != d.accounts["acme"].DID {
		t.Fatalf("the contract went to %s, want acme", rc.Spec.BidderDID)
	}
	bc := contractOf(ctx, t, d.bid, "acme", "acme's contract on the first installation", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Spec.Accept == rc.Spec.Accept && cc.Spec.RequesterDID == d.accounts["shop"].DID
	})
	cs := mountClientOn(t, other, "alice", d.appWS, rc.Name)
	if err := framework.Eventually(ctx, 2*time.Minute, "alice writes to the tenant through the second kcp", func(ctx context.Context) (bool, string, error) {
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
	// alice of the second kcp is nobody on the first.
	if _, err := mountClient(t, "alice", d.appWS, rc.Name).CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("the mount answered on the first installation, where alice's workspace is not")
	}

	// The release with an export: the snapshot stays on the second
	// installation, the VM on the first stops.
	start = time.Now()
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 0})
	contractOf(ctx, t, d.app, "vms", "the contract Completed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReplicasLowered)
	})
	t.Logf("FIGURE across installations: release with export -> Completed: %s", time.Since(start).Round(time.Millisecond))
	var snap corev1.SecretList
	if err := d.app.List(ctx, &snap, client.InNamespace("default"), client.MatchingLabels{marketrequester.LabelSnapshot: rc.Name}); err != nil || len(snap.Items) == 0 {
		t.Fatalf("no snapshot in alice's workspace on the second installation: %v", err)
	}
	if err := framework.Eventually(ctx, time.Minute, "acme's VM gone from the first installation", func(ctx context.Context) (bool, string, error) {
		err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bc.Name}, &computev1alpha1.ComputeVM{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if left := process.PIDs(a.root); len(left) != 0 {
		t.Errorf("VM processes left after the release: %v", left)
	}
	var syncs computev1alpha1.StateSyncList
	if err := d.bid.List(ctx, &syncs); err != nil || len(syncs.Items) != 0 {
		t.Errorf("StateSyncs in the bidder's workspace: %v, %v", syncs.Items, err)
	}
	if err := d.app.Delete(ctx, getMR(ctx, t, d.app, "vms")); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 2*time.Minute, "the requester's records gone", func(ctx context.Context) (bool, string, error) {
		var left []string
		for _, col := range []string{lexicon.Request, lexicon.Accept, lexicon.Release} {
			if n := len(listCollection(ctx, t, env.pds, d.accounts["shop"].DID, col)); n > 0 {
				left = append(left, fmt.Sprintf("%d %s", n, col))
			}
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
}

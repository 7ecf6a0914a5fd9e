package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
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
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/process"
	mdeal "github.com/knotless-dev/knotless/internal/market/deal"
)

// TestMarketTenantMigrates: a tenant moves from one bidder to another.
// alice's MarketRequester (stateSync Export of ConfigMaps) gets a tenant
// from acme, the cheaper bidder, through a kill -9 of the agent while
// the VM provisions and of the provider before it is delivered (one VM
// process, delivered once after the restart); alice makes a namespace, a
// ConfigMap and a Secret in it through the mount. acme then has no
// capacity left, and alice releases (replicas 0) while her tenant does
// not answer (SIGSTOP): the requester's side exports the tenant with
// alice's identity before it releases, so acme's VM is kept until the
// tenant answers again; then the snapshot lands in alice's workspace,
// owned by the MarketRequester, and the VM stops, leaving no process
// behind. With spec.restoreFrom and replicas 1 the new contract goes to
// beta, whose tenant gets the namespace and the ConfigMap (not the
// Secret, which was not listed) before the contract is Active; no
// StateSync is ever made in the bidder's workspace (R20), acme's tenant
// process is gone, and alice cannot read the bidder's workspace (its
// VMs, credentials and StateSyncs). A kill -9 of beta's tenant ends its
// contract as vm-lost and a new one is restored and mounted. Deleting
// the MarketRequester takes the snapshot and the VM with it. Figures:
// tenant back -> snapshot kept; MarketRequester wanted again -> the
// restored objects read through the new mount, split into market,
// provisioning, and import with the mount.
func TestMarketTenantMigrates(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	d, a, _ := tenantDeal(ctx, t, "mig", "acme", "beta")
	d.bidder(ctx, t, "acme", offerOf("small", 1000, 1024, 20, 1))
	d.bidder(ctx, t, "beta", offerOf("small", 1000, 1024, 40, 1))

	spec := exportingSpec("buyer")
	d.requester(ctx, t, "vms", spec)
	rc := contractOf(ctx, t, d.app, "vms", "the first contract agreed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Records.Lease != nil
	})

	// Faults while the first tenant is made: the agent is killed (-9)
	// while the VM provisions and the provider is killed (-9) before the
	// VM runs. The restarted agent adopts the starting VM (one process);
	// nothing is delivered while the provider is down, and once it is
	// back the tenant is delivered once.
	bcA := contractOf(ctx, t, d.bid, "acme", "acme's contract", func(cc *marketv1alpha1.ComputeContract) bool { return cc.Spec.Accept == rc.Spec.Accept })
	waitVM(ctx, t, d.bid, bcA.Name, "acme's VM made", 2*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMProvisioning && len(process.PIDs(a.root)) == 1
	})
	a.proc.Kill9()
	env.provider.Kill9()
	a.start(t)
	waitVM(ctx, t, d.bid, bcA.Name, "acme's VM Running with the provider down", 2*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMRunning
	})
	if pids := process.PIDs(a.root); len(pids) != 1 {
		t.Errorf("VM processes after the agent restart %v, want one", pids)
	}
	if err := d.app.Get(ctx, client.ObjectKey{Name: rc.Name}, &computev1alpha1.TenantCluster{}); !apierrors.IsNotFound(err) {
		t.Errorf("the tenant was mounted while the provider was down: %v", err)
	}
	restarted := time.Now()
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	rc = contractOf(ctx, t, d.app, "vms", "the first contract Active after the provider restarted", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractActive
	})
	var tcs computev1alpha1.TenantClusterList
	if err := d.app.List(ctx, &tcs); err != nil {
		t.Fatal(err)
	}
	if len(tcs.Items) != 1 || tcs.Items[0].Name != rc.Name || tcs.Items[0].CreationTimestamp.Time.Before(restarted.Add(-time.Second)) {
		t.Errorf("TenantClusters %v, want %s made once, after the restart", tcs.Items, rc.Name)
	}
	if rc.Spec.BidderDID != d.accounts["acme"].DID {
		t.Fatalf("the first contract went to %s, want acme", rc.Spec.BidderDID)
	}
	csA := mountClient(t, "alice", d.appWS, rc.Name)
	if err := framework.Eventually(ctx, 2*time.Minute, "alice makes a namespace, a ConfigMap and a Secret in tenant A", func(ctx context.Context) (bool, string, error) {
		_, err := csA.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		_, err = csA.CoreV1().ConfigMaps("shop").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Labels: map[string]string{"app": "shop"}},
			Data: map[string]string{"currency": "EUR"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		_, err = csA.CoreV1().Secrets("shop").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "unlisted"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	pidsA := process.PIDs(a.root)
	if len(pidsA) != 1 {
		t.Fatalf("VM processes %v, want acme's one", pidsA)
	}

	// acme is full; alice releases with an export while her tenant does
	// not answer (SIGSTOP): the requester's side exports it with alice's
	// identity before it releases, so the release waits and acme's VM is
	// kept; once the tenant answers again the snapshot is kept in alice's
	// workspace and the release goes out.
	mergePatch(ctx, t, d.bid, getMB(ctx, t, d.bid, "acme"), map[string]any{"offers": []marketv1alpha1.Offer{offerOf("small", 1000, 1024, 20, 0)}})
	if err := syscall.Kill(pidsA[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 0})
	time.Sleep(8 * time.Second)
	if err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bcA.Name}, &computev1alpha1.ComputeVM{}); err != nil {
		t.Fatalf("acme's VM while the export waits for the tenant: %v", err)
	}
	if err := syscall.Kill(pidsA[0], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	contractOf(ctx, t, d.app, "vms", "the first contract Completed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReplicasLowered)
	})
	released := time.Since(start)
	mr := getMR(ctx, t, d.app, "vms")
	var snap corev1.SecretList
	if err := d.app.List(ctx, &snap, client.InNamespace("default"), client.MatchingLabels{marketrequester.LabelSnapshot: rc.Name}); err != nil {
		t.Fatal(err)
	}
	if len(snap.Items) == 0 {
		t.Fatal("no snapshot in alice's workspace after the release")
	}
	size := 0
	for i := range snap.Items {
		ownedBy(t, &snap.Items[i], "MarketRequester", mr.UID)
		size += len(snap.Items[i].Data[computev1alpha1.SnapshotKey])
	}
	t.Logf("FIGURE release with export: tenant back -> exported, VM stopped, contract Completed: %s (%d chunk(s), %d bytes)", released.Round(time.Millisecond), len(snap.Items), size)
	for _, pid := range pidsA {
		if driver.Alive(pid) {
			t.Errorf("tenant A's process %d still runs", pid)
		}
	}
	if left := process.PIDs(a.root); len(left) != 0 {
		t.Errorf("VMs left after the export and the release: %v", left)
	}

	// Wanted again, restored from the snapshot: beta's tenant.
	start = time.Now()
	mergePatch(ctx, t, d.app, mr, map[string]any{"replicas": 1, "restoreFrom": rc.Name})
	contractOf(ctx, t, d.app, "vms", "the second contract agreed", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name != rc.Name && cc.Status.Records.Lease != nil
	})
	market_ := time.Since(start)
	contractOf(ctx, t, d.bid, "beta", "beta's contract Active (the VM runs)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	provisioned := time.Since(start)
	rc2 := contractOf(ctx, t, d.app, "vms", "the second contract Active (restored and mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name != rc.Name && cc.Status.Phase == marketv1alpha1.ContractActive
	})
	mounted := time.Since(start)
	if rc2.Spec.BidderDID != d.accounts["beta"].DID {
		t.Fatalf("the second contract went to %s, want beta", rc2.Spec.BidderDID)
	}
	// Nothing of the move went through the bidder's workspace.
	var syncs computev1alpha1.StateSyncList
	if err := d.bid.List(ctx, &syncs); err != nil || len(syncs.Items) != 0 {
		t.Errorf("StateSyncs in the bidder's workspace: %v, %v", syncs.Items, err)
	}
	csB := mountClient(t, "alice", d.appWS, rc2.Name)
	var cm *corev1.ConfigMap
	if err := framework.Eventually(ctx, 2*time.Minute, "the ConfigMap in tenant B as alice", func(ctx context.Context) (bool, string, error) {
		var err error
		cm, err = csB.CoreV1().ConfigMaps("shop").Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	t.Logf("FIGURE MarketRequester wanted again with restoreFrom -> restored objects read through the new mount: %s (market %s, provisioning %s, import and mount %s, first read %s)",
		total.Round(time.Millisecond), market_.Round(time.Millisecond), (provisioned - market_).Round(time.Millisecond),
		(mounted - provisioned).Round(time.Millisecond), (total - mounted).Round(time.Millisecond))
	if cm.Data["currency"] != "EUR" || cm.Labels["app"] != "shop" {
		t.Errorf("restored ConfigMap %v %v", cm.Labels, cm.Data)
	}
	if _, err := csB.CoreV1().Secrets("shop").Get(ctx, "unlisted", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Secret that was not listed: %v, want NotFound in tenant B", err)
	}
	if n := len(process.PIDs(a.root)); n != 1 {
		t.Errorf("%d VM directories, want beta's one", n)
	}
	// alice sees her tenant through her mount only: not the bidder's
	// workspace, its VMs, their credentials or its StateSyncs.
	aliceCfg, err := env.kcp.UserConfig("alice")
	if err != nil {
		t.Fatal(err)
	}
	aliceBid, err := framework.ClientFor(aliceCfg, root.Join(d.bidWS))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []client.ObjectList{&computev1alpha1.ComputeVMList{}, &corev1.SecretList{}, &computev1alpha1.StateSyncList{}} {
		if err := aliceBid.List(ctx, l, client.InNamespace("default")); !apierrors.IsForbidden(err) {
			t.Errorf("alice listing %T in the bidder's workspace: %v, want Forbidden", l, err)
		}
	}

	// kill -9 of beta's tenant: the VM is Lost, the lease ends (vm-lost),
	// the requester's contract says so and a new contract is made, again
	// restored from the snapshot.
	pidsB := process.PIDs(a.root)
	if len(pidsB) != 1 {
		t.Fatalf("VM processes %v, want beta's one", pidsB)
	}
	if err := syscall.Kill(pidsB[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	contractOf(ctx, t, d.app, "vms", "the contract of the killed tenant ended as vm-lost", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc2.Name && cc.Status.Phase == marketv1alpha1.ContractFailed && cc.Status.Reason == "vm-lost"
	})
	rc3 := contractOf(ctx, t, d.app, "vms", "a new contract Active after the VM was lost", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name != rc.Name && cc.Name != rc2.Name && cc.Status.Phase == marketv1alpha1.ContractActive
	})
	t.Logf("FIGURE tenant killed -> a new tenant restored and mounted: %s", time.Since(start).Round(time.Millisecond))
	if err := framework.Eventually(ctx, time.Minute, "the restored ConfigMap in the third tenant", func(ctx context.Context) (bool, string, error) {
		_, err := mountClient(t, "alice", d.appWS, rc3.Name).CoreV1().ConfigMaps("shop").Get(ctx, "settings", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}

	// Deleting the MarketRequester takes the snapshot and the VM with it.
	if err := d.app.Delete(ctx, getMR(ctx, t, d.app, "vms")); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 3*time.Minute, "everything of the migration gone", func(ctx context.Context) (bool, string, error) {
		var left []string
		var secs corev1.SecretList
		if err := d.app.List(ctx, &secs, client.InNamespace("default"), client.HasLabels{marketrequester.LabelSnapshot}); err == nil && len(secs.Items) > 0 {
			left = append(left, fmt.Sprintf("%d snapshot chunks", len(secs.Items)))
		}
		var syncs computev1alpha1.StateSyncList
		if err := d.bid.List(ctx, &syncs, client.InNamespace("default")); err == nil && len(syncs.Items) > 0 {
			left = append(left, fmt.Sprintf("%d StateSyncs", len(syncs.Items)))
		}
		var vms computev1alpha1.ComputeVMList
		if err := d.bid.List(ctx, &vms, client.InNamespace("default")); err == nil && len(vms.Items) > 0 {
			left = append(left, fmt.Sprintf("%d ComputeVMs", len(vms.Items)))
		}
		if n := len(process.PIDs(a.root)); n > 0 {
			left = append(left, fmt.Sprintf("%d VM directories", n))
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
}

package marketrequester

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/statesync"
)

// runVM plays the agent: the bidder's VM runs, with a credential, and
// the requester's TenantCluster (once made) is Ready.
func (m *marketFixture) runVM(ws *clustertest.Cluster, ca []byte) *computev1alpha1.ComputeVM {
	m.t.Helper()
	ctx := context.Background()
	var vms computev1alpha1.ComputeVMList
	if err := ws.Client.List(ctx, &vms); err != nil || len(vms.Items) != 1 {
		m.t.Fatalf("VMs %v, %v", vms.Items, err)
	}
	vm := &vms.Items[0]
	if vm.Status.Phase != computev1alpha1.VMRunning {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vm.Name + "-credential", OwnerReferences: []metav1.OwnerReference{ownerRef(vm, "ComputeVM")}},
			Data: map[string][]byte{"token": []byte("tok")}}
		if err := ws.Client.Create(ctx, sec); err != nil {
			m.t.Fatal(err)
		}
		fp, _ := market.CAFingerprint(ca)
		vm.Status = computev1alpha1.ComputeVMStatus{Phase: computev1alpha1.VMRunning, Endpoint: "https://127.0.0.1:7443/clusters/root",
			CABundle: string(ca), CAFingerprint: fp, CredentialSecret: sec.Name, ServiceID: serviceauth.Audience(vm.Spec.ServiceDID, string(vm.UID))}
		if err := ws.Client.Status().Update(ctx, vm); err != nil {
			m.t.Fatal(err)
		}
	}
	return vm
}

var isController = true

func ownerRef(o client.Object, kind string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: computev1alpha1.GroupVersion.String(), Kind: kind, Name: o.GetName(), UID: o.GetUID(), Controller: &isController}
}

func (m *marketFixture) tenantReady() {
	m.t.Helper()
	var tcs computev1alpha1.TenantClusterList
	if err := m.shop.Client.List(context.Background(), &tcs); err != nil {
		m.t.Fatal(err)
	}
	for i := range tcs.Items {
		tcs.Items[i].Status.Phase = computev1alpha1.PhaseReady
		if err := m.shop.Client.Status().Update(context.Background(), &tcs.Items[i]); err != nil {
			m.t.Fatal(err)
		}
	}
}

func getSync(t *testing.T, ws *clustertest.Cluster, name string) *computev1alpha1.StateSync {
	t.Helper()
	ss := &computev1alpha1.StateSync{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, ss); err != nil {
		return nil
	}
	return ss
}

// TestExportAndRestore: a release of a requester with stateSync Export
// asks the export beside the VM before the release record; the bidder
// keeps the VM while the export runs; chunk counts the bidder writes are
// checked before anything is read; the completed export's snapshot is
// kept in the requester's workspace, owned by the MarketRequester, and
// the export deleted, and only then the VM goes. A later contract with
// restoreFrom gets an import (the requester's kinds only) with the
// snapshot's chunks and is mounted only once the import completed.
func TestExportAndRestore(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) {
		mr.Spec.StateSync = marketv1alpha1.StateSyncPolicy{Mode: marketv1alpha1.StateSyncExport, Resources: []computev1alpha1.GroupResource{{Resource: "configmaps"}}}
	})
	ca := drivertest.TestCA(t)
	fit := m.bidders["fit"]
	contract := func() *marketv1alpha1.ComputeContract {
		t.Helper()
		m.round()
		m.clock.advance(11 * time.Second)
		m.round()
		m.round()
		vm := m.runVM(fit, ca)
		m.round()
		m.tenantReady()
		m.round()
		cc := contracts(t, m.shop)
		for i := range cc {
			if cc[i].Status.Phase == marketv1alpha1.ContractActive {
				return &cc[i]
			}
		}
		t.Fatalf("no Active contract (VM %s): %+v", vm.Name, cc)
		return nil
	}
	cc := contract()
	var vms computev1alpha1.ComputeVMList
	_ = fit.Client.List(ctx, &vms)
	vm := &vms.Items[0]

	// Release: the export is asked for with the release.
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	m.reconcileRequester()
	exp := getSync(t, fit, computev1alpha1.ExportName(vm.Name))
	if exp == nil || exp.Spec.Direction != computev1alpha1.Export || len(exp.Spec.Resources) != 1 || !metav1.IsControlledBy(exp, vm) {
		t.Fatalf("export %+v", exp)
	}
	if m.records("did:plc:shop", lexicon.Release) != 1 {
		t.Fatal("no release record")
	}
	// kcp stamps the creation (the fake client does not).
	exp.CreationTimestamp = metav1.NewTime(m.clock.t)
	if err := fit.Client.Update(ctx, exp); err != nil {
		t.Fatal(err)
	}
	m.reconcileBidder("fit")
	m.reconcileBidder("fit")
	if err := fit.Client.Get(ctx, client.ObjectKeyFromObject(vm), &computev1alpha1.ComputeVM{}); err != nil {
		t.Fatalf("the VM went while its export runs: %v", err)
	}

	// A bidder that writes an absurd chunk count gets nothing read.
	exp.Status = computev1alpha1.StateSyncStatus{Phase: computev1alpha1.SyncCompleted, Chunks: 1 << 30}
	if err := fit.Client.Status().Update(ctx, exp); err != nil {
		t.Fatal(err)
	}
	m.reconcileRequester()
	if getSync(t, fit, exp.Name) != nil {
		t.Fatal("an export with a bad chunk count was not dropped")
	}
	// (the VM may go now; make the export again to see it collected)
	data := []byte("gzip of the tenant")
	exp = &computev1alpha1.StateSync{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: computev1alpha1.ExportName(vm.Name), OwnerReferences: []metav1.OwnerReference{ownerRef(vm, "ComputeVM")},
		CreationTimestamp: metav1.NewTime(m.clock.t)},
		Spec: computev1alpha1.StateSyncSpec{VMName: vm.Name, Direction: computev1alpha1.Export}}
	if err := fit.Client.Create(ctx, exp); err != nil {
		t.Fatal(err)
	}
	exp.Status = computev1alpha1.StateSyncStatus{Phase: computev1alpha1.SyncCompleted, Chunks: 1, SHA256: statesync.Sum(data), Objects: 3}
	if err := fit.Client.Status().Update(ctx, exp); err != nil {
		t.Fatal(err)
	}
	if err := fit.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: computev1alpha1.SnapshotChunkName(exp.Name, 0), OwnerReferences: []metav1.OwnerReference{ownerRef(exp, "StateSync")}},
		Data: map[string][]byte{computev1alpha1.SnapshotKey: data}}); err != nil {
		t.Fatal(err)
	}
	m.reconcileRequester()
	var snap corev1.SecretList
	if err := m.shop.Client.List(ctx, &snap, client.MatchingLabels{LabelSnapshot: cc.Name}); err != nil || len(snap.Items) != 1 ||
		string(snap.Items[0].Data[computev1alpha1.SnapshotKey]) != string(data) || !metav1.IsControlledBy(&snap.Items[0], m.requester()) {
		t.Fatalf("snapshot %+v, %v", snap.Items, err)
	}
	if getSync(t, fit, exp.Name) != nil {
		t.Error("the collected export is still there")
	}
	for range 3 {
		m.round()
	}
	if err := fit.Client.Get(ctx, client.ObjectKeyFromObject(vm), &computev1alpha1.ComputeVM{}); err == nil {
		t.Error("the VM is still there after its export was collected")
	}

	// Wanted again, from the snapshot.
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas, mr.Spec.RestoreFrom = 1, cc.Name })
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	vm2 := m.runVM(fit, ca)
	m.round()
	imp := getSync(t, fit, computev1alpha1.ImportName(vm2.Name))
	if imp == nil || imp.Spec.Direction != computev1alpha1.Import || imp.Spec.Chunks != 1 || imp.Spec.SHA256 != statesync.Sum(data) ||
		len(imp.Spec.Resources) != 1 || !metav1.IsControlledBy(imp, vm2) {
		t.Fatalf("import %+v", imp)
	}
	chunk := &corev1.Secret{}
	if err := fit.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: computev1alpha1.SnapshotChunkName(imp.Name, 0)}, chunk); err != nil ||
		string(chunk.Data[computev1alpha1.SnapshotKey]) != string(data) || !metav1.IsControlledBy(chunk, imp) {
		t.Fatalf("import chunk %+v, %v", chunk, err)
	}
	var tcs computev1alpha1.TenantClusterList
	if _ = m.shop.Client.List(ctx, &tcs); len(tcs.Items) != 0 {
		t.Fatalf("mounted before the import completed: %v", tcs.Items)
	}
	imp.Status.Phase = computev1alpha1.SyncCompleted
	if err := fit.Client.Status().Update(ctx, imp); err != nil {
		t.Fatal(err)
	}
	m.round()
	m.tenantReady()
	m.round()
	active := 0
	for _, c := range contracts(t, m.shop) {
		if c.Status.Phase == marketv1alpha1.ContractActive {
			active++
		}
	}
	if active != 1 {
		t.Errorf("%d Active contracts after the restore, want 1", active)
	}
}

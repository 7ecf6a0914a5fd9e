package statesync

import (
	"bytes"
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/statesync"
)

// runningVM is a running VM of the bidder's contract of the same name.
func runningVM(name string) *computev1alpha1.ComputeVM {
	return &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid"),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: marketv1alpha1.GroupVersion.String(), Kind: "ComputeContract", Name: name, UID: types.UID(name + "-cc-uid"), Controller: ptr.To(true)}}},
		Spec:   computev1alpha1.ComputeVMSpec{ContractName: name, Driver: "process", CPUMillis: 1, MemoryMiB: 1},
		Status: computev1alpha1.ComputeVMStatus{Phase: computev1alpha1.VMRunning}}
}

// contractOf is the bidder's contract of runningVM(name), in phase.
func contractOf(name string, phase marketv1alpha1.ContractPhase) *marketv1alpha1.ComputeContract {
	return &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-cc-uid")},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideBidder}, Status: marketv1alpha1.ComputeContractStatus{Phase: phase}}
}

func syncOf(name string, vm *computev1alpha1.ComputeVM, spec computev1alpha1.StateSyncSpec) *computev1alpha1.StateSync {
	spec.VMName = vm.Name
	return &computev1alpha1.StateSync{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid"),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: computev1alpha1.GroupVersion.String(), Kind: "ComputeVM", Name: vm.Name, UID: vm.UID, Controller: ptr.To(true)}}},
		Spec: spec}
}

// TestExportThenImport: an export of a running VM cuts its snapshot into
// chunk Secrets it owns and says how many, how big and its SHA-256; an
// import of those chunks into another VM waits until every chunk is
// there, refuses chunks that do not match the SHA-256, and applies the
// snapshot once; neither runs again once over.
func TestExportThenImport(t *testing.T) {
	a, b := runningVM("a"), runningVM("b")
	exp := syncOf("a-export", a, computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Export,
		Resources: []computev1alpha1.GroupResource{{Resource: "configmaps"}}})
	ws := clustertest.New(a, b, exp, contractOf("a", marketv1alpha1.ContractActive), contractOf("b", marketv1alpha1.ContractProvisioning))
	d := drivertest.New(t)
	d.Set("a-uid", driver.Running)
	d.Set("b-uid", driver.Running)
	// A snapshot of two and a half chunks.
	snap := bytes.Repeat([]byte("x"), 2*computev1alpha1.SnapshotChunkBytes+10)
	d.Tenants["a-uid"], d.Objects["a-uid"] = snap, 7
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"process": d}, Events: ws.GetEventRecorder(Name)}
	ctx := context.Background()
	run := func(name string) reconcile.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	get := func(name string) *computev1alpha1.StateSync {
		t.Helper()
		ss := &computev1alpha1.StateSync{}
		if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, ss); err != nil {
			t.Fatal(err)
		}
		return ss
	}

	run("a-export")
	got := get("a-export")
	if got.Status.Phase != computev1alpha1.SyncCompleted || got.Status.Chunks != 3 || got.Status.Objects != 7 ||
		got.Status.Bytes != int64(len(snap)) || got.Status.SHA256 != statesync.Sum(snap) {
		t.Fatalf("export: %+v", got.Status)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, "Ready"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready of a completed export: %+v", c)
	}
	if len(d.Exported) != 1 || len(d.Exported[0]) != 1 || d.Exported[0][0].Resource != "configmaps" {
		t.Errorf("exported %v", d.Exported)
	}
	run("a-export")
	if len(d.Exported) != 1 {
		t.Error("a Completed export ran again")
	}

	// The provider copies the chunks beside an import of b.
	imp := syncOf("b-import", b, computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Import, Chunks: 3, SHA256: got.Status.SHA256})
	if err := ws.Client.Create(ctx, imp); err != nil {
		t.Fatal(err)
	}
	imp = get("b-import")
	copyChunk := func(i int) {
		t.Helper()
		src := &corev1.Secret{}
		if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: computev1alpha1.SnapshotChunkName("a-export", i)}, src); err != nil || !metav1.IsControlledBy(src, got) {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if src.Labels[computev1alpha1.LabelAgent] != "true" {
			t.Errorf("chunk %d is not labelled for the agent's cache: %v", i, src.Labels)
		}
		dst := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.SnapshotChunkName("b-import", i), Namespace: "default", Labels: map[string]string{computev1alpha1.LabelStateSync: "b-import"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: computev1alpha1.GroupVersion.String(), Kind: "StateSync", Name: imp.Name, UID: imp.UID, Controller: ptr.To(true)}}},
			Data: src.Data}
		if err := ws.Client.Create(ctx, dst); err != nil {
			t.Fatal(err)
		}
	}
	copyChunk(0)
	copyChunk(1)
	if res := run("b-import"); res.RequeueAfter == 0 || get("b-import").Status.Phase != computev1alpha1.SyncPending {
		t.Fatalf("with a chunk missing: %+v %+v", res, get("b-import").Status)
	}
	copyChunk(2)
	d.Objects["b-uid"] = 7
	run("b-import")
	if st := get("b-import").Status; st.Phase != computev1alpha1.SyncCompleted || st.Objects != 7 || !bytes.Equal(d.Tenants["b-uid"], snap) {
		t.Fatalf("import: %+v (tenant has %d bytes)", st, len(d.Tenants["b-uid"]))
	}
	var left corev1.SecretList
	if err := ws.Client.List(ctx, &left, client.MatchingLabels{computev1alpha1.LabelStateSync: "b-import"}); err != nil || len(left.Items) != 0 {
		t.Errorf("the import's chunks after it completed: %d, %v", len(left.Items), err)
	}

	// Chunks that do not add up to the SHA-256 fail the import, which
	// applies nothing.
	bad := syncOf("a-import", a, computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Import, Chunks: 1, SHA256: statesync.Sum([]byte("other"))})
	if err := ws.Client.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	bad = get("a-import")
	if err := ws.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.SnapshotChunkName("a-import", 0), Namespace: "default",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: computev1alpha1.GroupVersion.String(), Kind: "StateSync", Name: bad.Name, UID: bad.UID, Controller: ptr.To(true)}}},
		Data: map[string][]byte{computev1alpha1.SnapshotKey: []byte("forged")}}); err != nil {
		t.Fatal(err)
	}
	run("a-import")
	if st := get("a-import").Status; st.Phase != computev1alpha1.SyncFailed || st.Reason != computev1alpha1.ReasonSnapshotInvalid {
		t.Fatalf("forged chunks: %+v", st)
	}
	if !bytes.Equal(d.Tenants["a-uid"], snap) {
		t.Error("a forged snapshot was imported")
	}
}

// TestStateSyncOfAVMThatIsNotRunning waits while the VM starts and fails
// once it is lost; a StateSync its VM does not control fails.
func TestStateSyncOfAVMThatIsNotRunning(t *testing.T) {
	vm := runningVM("a")
	vm.Status.Phase = computev1alpha1.VMProvisioning
	ss := syncOf("a-export", vm, computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Export})
	stray := syncOf("stray", vm, computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Export})
	stray.OwnerReferences = nil
	ws := clustertest.New(vm, ss, stray, contractOf("a", marketv1alpha1.ContractActive))
	d := drivertest.New(t)
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"process": d}, Events: ws.GetEventRecorder(Name)}
	ctx := context.Background()
	phase := func(name string) (computev1alpha1.StateSyncPhase, string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
			t.Fatal(err)
		}
		got := &computev1alpha1.StateSync{}
		_ = ws.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, got)
		return got.Status.Phase, got.Status.Reason
	}
	if p, _ := phase("a-export"); p != computev1alpha1.SyncPending {
		t.Errorf("while the VM starts: %s", p)
	}
	if p, reason := phase("stray"); p != computev1alpha1.SyncFailed || reason != computev1alpha1.ReasonSnapshotInvalid {
		t.Errorf("a StateSync its VM does not control: %s %s", p, reason)
	}
	got := &computev1alpha1.ComputeVM{}
	_ = ws.Client.Get(ctx, client.ObjectKeyFromObject(vm), got)
	got.Status.Phase = computev1alpha1.VMLost
	if err := ws.Client.Status().Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if p, reason := phase("a-export"); p != computev1alpha1.SyncFailed || reason != computev1alpha1.ReasonVMNotRunning {
		t.Errorf("once the VM is lost: %s %s", p, reason)
	}
	if len(d.Exported) != 0 {
		t.Errorf("exported %v", d.Exported)
	}
}

// A StateSync runs only when the VM's contract asks for it: the VM is its
// bidder's live contract's (not one made by hand, nor the requester's
// copy), an export while the contract is Active or Releasing, an import
// while it is Provisioning or Active. Any other is Failed (NotWanted)
// and the driver is never called: a bidder-workspace member cannot make
// the agent read or write a tenant as its admin by pointing a StateSync
// at a VM.
func TestStateSyncTheContractDoesNotAskFor(t *testing.T) {
	handmade := runningVM("handmade")
	requesters := contractOf("theirs", marketv1alpha1.ContractActive)
	requesters.Spec.Side = marketv1alpha1.SideRequester
	objs := []client.Object{handmade, runningVM("theirs"), requesters,
		runningVM("done"), contractOf("done", marketv1alpha1.ContractCompleted),
		runningVM("releasing"), contractOf("releasing", marketv1alpha1.ContractReleasing),
		runningVM("new"), contractOf("new", marketv1alpha1.ContractProvisioning)}
	refused := map[string]*computev1alpha1.StateSync{}
	for _, vm := range []string{"handmade", "theirs", "done", "new"} {
		refused[vm+"-export"] = syncOf(vm+"-export", objs[slices.IndexFunc(objs, func(o client.Object) bool { return o.GetName() == vm })].(*computev1alpha1.ComputeVM),
			computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Export, Resources: []computev1alpha1.GroupResource{{Resource: "secrets"}}})
	}
	for _, vm := range []string{"done", "releasing"} {
		refused[vm+"-import"] = syncOf(vm+"-import", objs[slices.IndexFunc(objs, func(o client.Object) bool { return o.GetName() == vm })].(*computev1alpha1.ComputeVM),
			computev1alpha1.StateSyncSpec{Direction: computev1alpha1.Import, Chunks: 1, SHA256: statesync.Sum([]byte("x"))})
	}
	for _, ss := range refused {
		objs = append(objs, ss)
	}
	ws := clustertest.New(objs...)
	d := drivertest.New(t)
	for _, vm := range []string{"handmade", "theirs", "done", "releasing", "new"} {
		d.Set(vm+"-uid", driver.Running)
	}
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"process": d}, Events: ws.GetEventRecorder(Name)}
	ctx := context.Background()
	for name := range refused {
		if err := ws.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.SnapshotChunkName(name, 0), Namespace: "default",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: computev1alpha1.GroupVersion.String(), Kind: "StateSync", Name: name, UID: types.UID(name + "-uid"), Controller: ptr.To(true)}}},
			Data: map[string][]byte{computev1alpha1.SnapshotKey: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
			t.Fatal(err)
		}
		got := &computev1alpha1.StateSync{}
		if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != computev1alpha1.SyncFailed || got.Status.Reason != computev1alpha1.ReasonNotWanted {
			t.Errorf("%s: %s %s, want Failed NotWanted", name, got.Status.Phase, got.Status.Reason)
		}
	}
	if len(d.Exported) != 0 || len(d.Tenants) != 0 {
		t.Errorf("the driver exported %v, imported into %d tenants", d.Exported, len(d.Tenants))
	}
}

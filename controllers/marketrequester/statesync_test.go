package marketrequester

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

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

// fakeState is the fixture's Reconciler.TenantState: it records every
// export and import (the tenant, the token, the kinds, the snapshot),
// exports data (objects objects), and fails every call with err while it
// is set.
type fakeState struct {
	data    []byte
	objects int
	err     error
	// progress is how many objects an import that fails applies first.
	progress         int
	exports, imports []stateCall
}

type stateCall struct {
	host, token string
	kinds       []schema.GroupResource
	data        []byte
	bounded     bool
	from        int
}

func call(cfg *rest.Config, kinds []schema.GroupResource, data []byte) stateCall {
	return stateCall{host: cfg.Host, token: cfg.BearerToken, kinds: kinds, data: data, bounded: cfg.WrapTransport != nil && cfg.Dial != nil}
}

func (f *fakeState) Export(_ context.Context, cfg *rest.Config, kinds []schema.GroupResource) ([]byte, int, error) {
	f.exports = append(f.exports, call(cfg, kinds, nil))
	if f.err != nil {
		return nil, 0, f.err
	}
	return f.data, f.objects, nil
}

func (f *fakeState) Import(_ context.Context, cfg *rest.Config, data []byte, kinds []schema.GroupResource, from int) (int, error) {
	c := call(cfg, kinds, data)
	c.from = from
	f.imports = append(f.imports, c)
	if f.err != nil {
		return from + f.progress, f.err
	}
	return f.objects, nil
}

// asShop checks that a call went to the VM's tenant as the requester's
// DID, for the VM's service identity, bounded, with the kinds of the
// requester's spec.stateSync.
func asShop(t *testing.T, c stateCall, vm *computev1alpha1.ComputeVM) {
	t.Helper()
	if c.host != vm.Status.Endpoint || !strings.HasPrefix(c.token, "markettest:did:plc:shop:"+vm.Status.ServiceID+":") || !c.bounded ||
		!slices.Equal(c.kinds, []schema.GroupResource{{Resource: "configmaps"}}) {
		t.Fatalf("call %+v; want the tenant %s as did:plc:shop for %s, bounded, configmaps", c, vm.Status.Endpoint, vm.Status.ServiceID)
	}
}

// activeContract runs the market until one contract of the shop is Active
// on the fit's VM, and returns both.
func (m *marketFixture) activeContract(ca []byte) (*marketv1alpha1.ComputeContract, *computev1alpha1.ComputeVM) {
	m.t.Helper()
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	vm := m.runVM(m.bidders["fit"], ca)
	m.round()
	m.tenantReady()
	m.round()
	for _, cc := range contracts(m.t, m.shop) {
		if cc.Status.Phase == marketv1alpha1.ContractActive {
			return &cc, vm
		}
	}
	m.t.Fatalf("no Active contract (VM %s)", vm.Name)
	return nil, nil
}

func withExport(mr *marketv1alpha1.MarketRequester) {
	mr.Spec.StateSync = marketv1alpha1.StateSyncPolicy{Mode: marketv1alpha1.StateSyncExport, Resources: []computev1alpha1.GroupResource{{Resource: "configmaps"}}}
}

func eventsOf(m *marketFixture, reason string) []clustertest.Event {
	var out []clustertest.Event
	for _, e := range m.shop.Events.Events() {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// exported runs the market until the shop's one contract is Active, with
// stateSync Export and st as the tenant's state, then releases it (the
// export kept as snapshot cc): the contract and the tenant's CA.
func exported(t *testing.T, st *fakeState) (*marketFixture, *marketv1alpha1.ComputeContract, []byte) {
	t.Helper()
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.req.TenantState = st
	m.updateRequester(withExport)
	ca := drivertest.TestCA(t)
	cc, _ := m.activeContract(ca)
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	for range 3 {
		m.round()
	}
	return m, cc, ca
}

// restoreOnNewVM wants the shop's replica again from snapshot cc, runs
// the market until the fit's new VM runs, and returns the VM.
func (m *marketFixture) restoreOnNewVM(cc *marketv1alpha1.ComputeContract, ca []byte) *computev1alpha1.ComputeVM {
	m.t.Helper()
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas, mr.Spec.RestoreFrom = 1, cc.Name })
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	return m.runVM(m.bidders["fit"], ca)
}

// TestExportAndRestore (R20): the requester's side exports the tenant of
// a contract it releases itself, as its own DID at the endpoint the
// bidder's lease names, before it publishes the release, and keeps the
// snapshot in its workspace, owned by the MarketRequester; nothing is
// written to the bidder's workspace, and the bidder stops the VM as soon
// as it sees the release. A later contract with restoreFrom gets the
// snapshot imported the same way before it is first mounted: while the
// import fails (a failure that may pass) the contract is not mounted,
// and the import is tried again after a backoff, not before.
func TestExportAndRestore(t *testing.T) {
	ctx := context.Background()
	m := newMarket(t, bidderObj("fit", 30, 2))
	st := &fakeState{data: []byte("gzip of the tenant"), objects: 3}
	m.req.TenantState = st
	m.updateRequester(withExport)
	ca := drivertest.TestCA(t)
	fit := m.bidders["fit"]
	cc, vm := m.activeContract(ca)

	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	m.reconcileRequester()
	if len(st.exports) != 1 {
		t.Fatalf("%d exports, want 1", len(st.exports))
	}
	asShop(t, st.exports[0], vm)
	if m.records("did:plc:shop", lexicon.Release) != 1 {
		t.Fatal("no release record after the export")
	}
	var snap corev1.SecretList
	if err := m.shop.Client.List(ctx, &snap, client.MatchingLabels{LabelSnapshot: cc.Name}); err != nil || len(snap.Items) != 1 ||
		string(snap.Items[0].Data[computev1alpha1.SnapshotKey]) != string(st.data) || string(snap.Items[0].Data[keyObjects]) != "3" ||
		!metav1.IsControlledBy(&snap.Items[0], m.requester()) {
		t.Fatalf("snapshot %+v, %v", snap.Items, err)
	}
	if len(eventsOf(m, "Exported")) != 1 {
		t.Errorf("events %v, want one Exported", m.shop.Events.Reasons())
	}
	for range 2 {
		m.round()
	}
	if len(st.exports) != 1 {
		t.Errorf("%d exports, want still 1: the snapshot is kept", len(st.exports))
	}
	if err := fit.Client.Get(ctx, client.ObjectKeyFromObject(vm), &computev1alpha1.ComputeVM{}); err == nil {
		t.Error("the VM is still there after the release")
	}
	var syncs computev1alpha1.StateSyncList
	var secs corev1.SecretList
	if err := fit.Client.List(ctx, &syncs); err != nil || len(syncs.Items) != 0 {
		t.Errorf("StateSyncs in the bidder's workspace: %v, %v", syncs.Items, err)
	}
	if err := fit.Client.List(ctx, &secs, client.HasLabels{computev1alpha1.LabelStateSync}); err != nil || len(secs.Items) != 0 {
		t.Errorf("snapshot chunks in the bidder's workspace: %v, %v", secs.Items, err)
	}

	// Wanted again, from the snapshot; the first import fails.
	st.err = errors.New("connection reset by the tenant")
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas, mr.Spec.RestoreFrom = 1, cc.Name })
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	vm2 := m.runVM(fit, ca)
	m.round()
	m.round()
	if len(st.imports) != 1 {
		t.Fatalf("%d imports, want 1 (then a backoff)", len(st.imports))
	}
	asShop(t, st.imports[0], vm2)
	if string(st.imports[0].data) != string(st.data) {
		t.Fatalf("imported %q, want the snapshot", st.imports[0].data)
	}
	var tcs computev1alpha1.TenantClusterList
	if _ = m.shop.Client.List(ctx, &tcs); len(tcs.Items) != 0 {
		t.Fatalf("mounted before the import: %v", tcs.Items)
	}
	var restoring *marketv1alpha1.ComputeContract
	for _, c := range contracts(t, m.shop) {
		if c.Status.Phase == marketv1alpha1.ContractProvisioning {
			restoring = &c
		}
	}
	if restoring == nil {
		t.Fatal("no contract Provisioning")
	}
	if c := clustertest.Condition(t, restoring.Status.Conditions, marketv1alpha1.ConditionReady); !strings.Contains(c.Message, "restoring snapshot "+cc.Name) ||
		strings.Contains(c.Message, "connection reset") {
		t.Errorf("Ready %+v; want it restoring the snapshot, without the tenant's answer", c)
	}
	st.err = nil
	m.clock.advance(snapshotRetry)
	m.round()
	m.tenantReady()
	m.round()
	if len(st.imports) != 2 {
		t.Fatalf("%d imports, want 2", len(st.imports))
	}
	active := 0
	for _, c := range contracts(t, m.shop) {
		if c.Status.Phase == marketv1alpha1.ContractActive {
			active++
		}
	}
	if active != 1 || len(eventsOf(m, "Restored")) != 1 {
		t.Errorf("%d Active contracts after the restore (want 1), events %v", active, m.shop.Events.Reasons())
	}
	m.round()
	if len(st.imports) != 2 {
		t.Errorf("%d imports, want 2: an Active contract is not restored again", len(st.imports))
	}
}

// releaseWhileExportFails releases the shop's contract while every
// export fails with a failure that may pass: one export, no release and
// no export again at once; then, 20 s at a time, a few exports until the
// release goes out (market.ExportWait).
func (m *marketFixture) releaseWhileExportFails(st *fakeState) {
	t := m.t
	t.Helper()
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	m.reconcileRequester()
	m.reconcileRequester()
	if len(st.exports) != 1 || m.records("did:plc:shop", lexicon.Release) != 0 {
		t.Fatalf("%d exports (want 1), %d releases (want 0)", len(st.exports), m.records("did:plc:shop", lexicon.Release))
	}
	for i := 0; m.records("did:plc:shop", lexicon.Release) == 0; i++ {
		if i > 20 {
			t.Fatal("the release never went out")
		}
		m.clock.advance(20 * time.Second)
		m.reconcileRequester()
	}
	if n := len(st.exports); n < 3 || n > 8 {
		t.Errorf("%d exports over %s, want a few", n, market.ExportWait)
	}
}

// TestExportFailures: an export that keeps failing holds the release
// back for market.ExportWait at most, tried again after a backoff (not at
// every pass); then the release goes out without a snapshot, with an
// Event that does not repeat the tenant's answer. An export that fails
// for good (statesync.ErrInvalid) releases at once.
func TestExportFailures(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	st := &fakeState{err: errors.New("tenant-internal-detail")}
	m.req.TenantState = st
	m.updateRequester(withExport)
	m.activeContract(drivertest.TestCA(t))
	m.releaseWhileExportFails(st)
	failed := eventsOf(m, "ExportFailed")
	if len(failed) != 1 || failed[0].Type != corev1.EventTypeWarning || strings.Contains(failed[0].Note, "tenant-internal-detail") {
		t.Fatalf("ExportFailed events %+v; want one Warning, without the tenant's answer", failed)
	}
	var snap corev1.SecretList
	if _ = m.shop.Client.List(context.Background(), &snap, client.HasLabels{LabelSnapshot}); len(snap.Items) != 0 {
		t.Errorf("snapshot chunks %v after a failed export", snap.Items)
	}

	// For good: at once.
	m2 := newMarket(t, bidderObj("fit", 30, 2))
	st2 := &fakeState{err: fmt.Errorf("%w: more than %d objects", statesync.ErrInvalid, statesync.MaxObjects)}
	m2.req.TenantState = st2
	m2.updateRequester(withExport)
	m2.activeContract(drivertest.TestCA(t))
	m2.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	m2.reconcileRequester()
	if len(st2.exports) != 1 || m2.records("did:plc:shop", lexicon.Release) != 1 {
		t.Fatalf("%d exports (want 1), %d releases (want 1)", len(st2.exports), m2.records("did:plc:shop", lexicon.Release))
	}
	if failed := eventsOf(m2, "ExportFailed"); len(failed) != 1 || !strings.Contains(failed[0].Note, "more than 10000 objects") {
		t.Fatalf("ExportFailed events %+v; want one saying why", failed)
	}
}

// TestRestoreRefused: a snapshot the tenant refuses (statesync.ErrInvalid
// with the tenant's answer) leaves the contract unmounted with a message
// that says so, without the tenant's words, and is not tried again;
// removing spec.restoreFrom mounts the tenant.
func TestRestoreRefused(t *testing.T) {
	ctx := context.Background()
	st := &fakeState{data: []byte("gzip"), objects: 1}
	m, cc, ca := exported(t, st)
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("tenant-secret-text"))
	st.err = fmt.Errorf("applying ConfigMap a/x: %w: %w", statesync.ErrInvalid, refused)
	m.restoreOnNewVM(cc, ca)
	for range 3 {
		m.round()
		m.clock.advance(time.Minute)
	}
	if len(st.imports) != 1 {
		t.Fatalf("%d imports, want 1: a refused snapshot is not tried again", len(st.imports))
	}
	var msg string
	for _, c := range contracts(t, m.shop) {
		if c.Status.Phase == marketv1alpha1.ContractProvisioning {
			msg = clustertest.Condition(t, c.Status.Conditions, marketv1alpha1.ConditionReady).Message
		}
	}
	if !strings.Contains(msg, "failed (the tenant refused an object of the snapshot)") || !strings.Contains(msg, "remove spec.restoreFrom") || strings.Contains(msg, "tenant-secret-text") {
		t.Fatalf("Ready message %q", msg)
	}
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.RestoreFrom = "" })
	m.round()
	m.tenantReady()
	m.round()
	var tcs computev1alpha1.TenantClusterList
	if _ = m.shop.Client.List(ctx, &tcs); len(tcs.Items) != 1 || len(st.imports) != 1 {
		t.Fatalf("TenantClusters %d (want 1), imports %d (want 1) once restoreFrom is removed", len(tcs.Items), len(st.imports))
	}
}

// TestRestoreGoesOnWhereItStopped: an import cut short (the reconcile's
// deadline, a tenant that stops answering) goes on from the first object
// it did not apply, soon, rather than from the start after a longer
// wait each time: a snapshot larger than one try can apply is restored.
func TestRestoreGoesOnWhereItStopped(t *testing.T) {
	st := &fakeState{data: []byte("gzip"), objects: 12}
	m, cc, ca := exported(t, st)
	st.err, st.progress = errors.New("context deadline exceeded"), 5
	m.restoreOnNewVM(cc, ca)
	m.round()
	m.clock.advance(snapshotRetry)
	m.round()
	st.err = nil
	m.clock.advance(snapshotRetry)
	m.round()
	m.tenantReady()
	m.round()
	var from []int
	for _, c := range st.imports {
		from = append(from, c.from)
	}
	if !slices.Equal(from, []int{0, 5, 10}) {
		t.Fatalf("imports from %v, want [0 5 10]", from)
	}
	var tcs computev1alpha1.TenantClusterList
	if _ = m.shop.Client.List(context.Background(), &tcs); len(tcs.Items) != 1 {
		t.Fatalf("%d TenantClusters after the restore, want 1", len(tcs.Items))
	}
}

// TestExportNotKeptIsGivenUp (from the review): a snapshot that cannot
// be written to the requester's workspace (a member made a Secret of the
// chunk's name that something else controls) is tried again after a
// backoff, not at every pass, and given up after market.ExportWait: the
// release goes out, with an Event.
func TestExportNotKeptIsGivenUp(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	st := &fakeState{data: []byte("gzip"), objects: 1}
	m.req.TenantState = st
	m.updateRequester(withExport)
	cc, vm := m.activeContract(drivertest.TestCA(t))
	squatter := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: computev1alpha1.SnapshotChunkName(snapshotOwner(cc.Name), 0),
		OwnerReferences: []metav1.OwnerReference{ownerRef(vm, "ComputeVM")}}}
	if err := m.shop.Client.Create(context.Background(), squatter); err != nil {
		t.Fatal(err)
	}
	m.releaseWhileExportFails(st)
	if failed := eventsOf(m, "ExportFailed"); len(failed) != 1 || !strings.Contains(failed[0].Note, "could not be kept") {
		t.Fatalf("ExportFailed events %+v", failed)
	}
}

// TestRestoreFollowsTheTenant (from the review): a snapshot imported into
// the tenant a lease named, which was not mounted yet (the tenant refused
// the mount's admins), is imported again when the bidder's lease names
// another tenant before the first mount: that one is not mounted without
// it.
func TestRestoreFollowsTheTenant(t *testing.T) {
	ctx := context.Background()
	st := &fakeState{data: []byte("gzip"), objects: 1}
	m, cc, ca := exported(t, st)
	vm := m.restoreOnNewVM(cc, ca)
	m.refusing[vm.Status.Endpoint] = true
	m.round()
	if len(st.imports) != 1 {
		t.Fatalf("%d imports, want 1", len(st.imports))
	}
	// The VM comes back at another endpoint; the lease says so.
	vm.Status.Endpoint = "https://127.0.0.1:7444/clusters/root"
	if err := m.bidders["fit"].Client.Status().Update(ctx, vm); err != nil {
		t.Fatal(err)
	}
	m.clock.advance(mountTokenMaxWait)
	m.round()
	m.round()
	if len(st.imports) != 2 || st.imports[1].host != vm.Status.Endpoint {
		t.Fatalf("imports %+v; want a second one, into the tenant the lease names now", st.imports)
	}
}

// A member of the requester's workspace who may write Secrets forges a
// snapshot: chunks owned by the MarketRequester that add up to the sum
// they say, under the name of the kept snapshot (replacing it) or of a
// new one. Neither is imported into the requester's tenant: a snapshot
// is whole only with the sum the provider keeps in its own workspace.
func TestForgedSnapshotIsNotImported(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"kept", "new"} {
		t.Run(name, func(t *testing.T) {
			st := &fakeState{data: []byte("gzip of the tenant"), objects: 3}
			m, cc, ca := exported(t, st)
			snapshot := cc.Name
			if name == "new" {
				snapshot = "forged"
			}
			forged := []byte("the member's objects")
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: computev1alpha1.SnapshotChunkName(snapshotOwner(snapshot), 0)}}
			if _, err := controllerutil.CreateOrUpdate(ctx, m.shop.Client, sec, func() error {
				sec.Labels = map[string]string{LabelSnapshot: snapshot}
				sec.Data = map[string][]byte{computev1alpha1.SnapshotKey: forged, keyIndex: []byte("0"), keyChunks: []byte("1"),
					keySHA256: []byte(statesync.Sum(forged)), keyObjects: []byte("1")}
				return controllerutil.SetControllerReference(m.requester(), sec, m.shop.Client.Scheme())
			}); err != nil {
				t.Fatal(err)
			}
			m.restoreOnNewVM(&marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: snapshot}}, ca)
			m.round()
			m.round()
			for _, im := range st.imports {
				if string(im.data) == string(forged) {
					t.Fatal("the member's snapshot was imported into the requester's tenant")
				}
			}
			var tcs computev1alpha1.TenantClusterList
			if err := m.shop.Client.List(ctx, &tcs); err != nil || len(tcs.Items) != 0 {
				t.Fatalf("mounted without the snapshot: %v, %v", tcs.Items, err)
			}
		})
	}
}

// A requester that goes takes the records of its snapshots in the
// provider's workspace with it.
func TestSnapshotRecordsGoWithTheRequester(t *testing.T) {
	ctx := context.Background()
	m, _, _ := exported(t, &fakeState{data: []byte("gzip of the tenant"), objects: 3})
	var cms corev1.ConfigMapList
	if err := m.mounts.List(ctx, &cms); err != nil || len(cms.Items) != 1 {
		t.Fatalf("records of the snapshot: %v, %v; want 1", cms.Items, err)
	}
	if err := m.shop.Client.Delete(ctx, m.requester()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.round()
	}
	if err := m.mounts.List(ctx, &cms); err != nil || len(cms.Items) != 0 {
		t.Fatalf("records left in the provider's workspace: %v, %v", cms.Items, err)
	}
}

// A member makes the new contract's TenantCluster first, labelled for it,
// to have the tenant mounted without spec.restoreFrom: the snapshot is
// imported all the same before the mount.
func TestRestoreNotSkippedByAPlantedTenantCluster(t *testing.T) {
	ctx := context.Background()
	st := &fakeState{data: []byte("gzip of the tenant"), objects: 3}
	m, cc, ca := exported(t, st)
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas, mr.Spec.RestoreFrom = 1, cc.Name })
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	var next *marketv1alpha1.ComputeContract
	for _, c := range contracts(t, m.shop) {
		if c.Name != cc.Name {
			next = &c
		}
	}
	if next == nil {
		t.Fatal("no new contract")
	}
	planted := &computev1alpha1.TenantCluster{ObjectMeta: metav1.ObjectMeta{Name: next.Name, Labels: map[string]string{LabelContract: string(next.UID)}},
		Spec: computev1alpha1.TenantClusterSpec{URL: "https://planted.example", CABundle: computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: ns, Name: "x", Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: ns, Name: "x"}}}}
	if err := m.shop.Client.Create(ctx, planted); err != nil {
		t.Fatal(err)
	}
	m.runVM(m.bidders["fit"], ca)
	m.round()
	m.round()
	if len(st.imports) != 1 || string(st.imports[0].data) != string(st.data) {
		t.Fatalf("%d imports, want the snapshot's before the mount", len(st.imports))
	}
}

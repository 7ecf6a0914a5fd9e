package tenantcluster

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	kcpversioned "github.com/kcp-dev/sdk/client/clientset/versioned"
	kcpclientset "github.com/kcp-dev/sdk/client/clientset/versioned/cluster"
	kcpfake "github.com/kcp-dev/sdk/client/clientset/versioned/fake"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/clustertest"
)

const (
	lc       = "2x7uf0bml0q9ms3b"
	mountURL = "https://kcp.example/services/mount"
	owner    = "knotless-provider"
)

// stubProber answers every probe with result and records the probes.
type stubProber struct {
	result Result
	mu     sync.Mutex
	probes []string
}

func (s *stubProber) Probe(_ context.Context, lc, name string) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes = append(s.probes, lc+"/"+name)
	return s.result
}

func (s *stubProber) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.probes)
}

// fakeKCP is a kcp cluster clientset with one fake clientset per
// workspace path; only Cluster is implemented.
type fakeKCP struct {
	kcpclientset.ClusterInterface
	mu       sync.Mutex
	clusters map[string]*kcpfake.Clientset
}

func (f *fakeKCP) Cluster(p logicalcluster.Path) kcpversioned.Interface {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.clusters == nil {
		f.clusters = map[string]*kcpfake.Clientset{}
	}
	if _, ok := f.clusters[p.String()]; !ok {
		// NewSimpleClientset: NewClientset tracks managed fields and needs
		// OpenAPI types the sdk does not ship for Workspace.
		f.clusters[p.String()] = kcpfake.NewSimpleClientset()
	}
	return f.clusters[p.String()]
}

func (f *fakeKCP) workspace(t *testing.T, name string) (*tenancyv1alpha1.Workspace, error) {
	t.Helper()
	return f.Cluster(logicalcluster.NewPath(lc)).TenancyV1alpha1().Workspaces().Get(context.Background(), name, metav1.GetOptions{})
}

func tenantCluster() *computev1alpha1.TenantCluster {
	return &computev1alpha1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant", UID: "tc-uid", Generation: 1},
		Spec: computev1alpha1.TenantClusterSpec{
			URL:        "https://127.0.0.1:6443",
			CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "ca", Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "cred"}},
		},
	}
}

// refs returns the CA ConfigMap and token Secret tenantCluster refers to.
func refs(t *testing.T) (*corev1.ConfigMap, *corev1.Secret) {
	t.Helper()
	ca, err := framework.NewCA("tenant")
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ca"}, Data: map[string]string{"ca.crt": string(ca.PEM)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cred", Labels: map[string]string{computev1alpha1.LabelMountCredential: "tenant"}},
			Data: map[string][]byte{"token": []byte("tenant-token"), computev1alpha1.MountCredentialCAKey: ca.PEM, computev1alpha1.MountCredentialURLKey: []byte("https://127.0.0.1:6443")}}
}

type fixture struct {
	r   *Reconciler
	ws  *clustertest.Cluster
	kcp *fakeKCP
}

func newFixture(prober TenantProber, objs ...client.Object) *fixture {
	ws := clustertest.New(objs...)
	kcp := &fakeKCP{}
	return &fixture{ws: ws, kcp: kcp, r: &Reconciler{
		GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}),
		KCP:        kcp, Prober: prober, MountURL: mountURL, ProbeInterval: 7 * time.Second, Owner: owner,
	}}
}

func (f *fixture) reconcile() (reconcile.Result, error) {
	return f.r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: "tenant"}}})
}

func (f *fixture) get(t *testing.T) *computev1alpha1.TenantCluster {
	t.Helper()
	tc := &computev1alpha1.TenantCluster{}
	if err := f.ws.Client.Get(context.Background(), client.ObjectKey{Name: "tenant"}, tc); err != nil {
		t.Fatal(err)
	}
	return tc
}

// A tenant whose probe succeeds is Ready with the tenant's version, and
// its mount workspace is created with the owner annotation (R15) and an
// owner reference (R07).
func TestReadyFromProbe(t *testing.T) {
	cm, sec := refs(t)
	stub := &stubProber{result: Result{Reason: computev1alpha1.ReasonReady, Message: "the tenant answered", Version: "v1.32.0"}}
	f := newFixture(stub, tenantCluster(), cm, sec)
	res, err := f.reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != 7*time.Second {
		t.Fatalf("result %+v, want the probe interval", res)
	}
	if got := stub.calls(); !slices.Equal(got, []string{lc + "/tenant"}) {
		t.Fatalf("probes %v", got)
	}
	tc := f.get(t)
	if c := *clustertest.Condition(t, tc.Status.Conditions, computev1alpha1.ConditionReady); c.Status != metav1.ConditionTrue || c.Reason != computev1alpha1.ReasonReady || c.Message != "the tenant answered" || c.ObservedGeneration != 1 {
		t.Fatalf("Ready = %+v", c)
	}
	if c := *clustertest.Condition(t, tc.Status.Conditions, computev1alpha1.ConditionMounted); c.Status != metav1.ConditionTrue || c.Reason != computev1alpha1.ReasonMounted {
		t.Fatalf("Mounted = %+v", c)
	}
	if tc.Status.Phase != computev1alpha1.PhaseReady || tc.Status.TenantVersion != "v1.32.0" || tc.Status.URL != mountURL+"/tenants/"+lc+"/tenant" {
		t.Fatalf("status %+v", tc.Status)
	}
	if !slices.Contains(tc.Finalizers, Finalizer) {
		t.Fatalf("finalizers %v", tc.Finalizers)
	}
	ws, err := f.kcp.workspace(t, "tenant")
	if err != nil {
		t.Fatalf("mount workspace: %v", err)
	}
	if ws.Annotations[tenancyv1alpha1.ExperimentalWorkspaceOwnerAnnotationKey] != owner || !mountsThis(ws, tc) ||
		len(ws.OwnerReferences) != 1 || ws.OwnerReferences[0].UID != tc.UID {
		t.Fatalf("workspace %+v", ws.ObjectMeta)
	}
	if got := f.ws.Events.Reasons(); !slices.Equal(got, []string{computev1alpha1.ReasonReady}) {
		t.Fatalf("events %v", got)
	}
}

// A missing CA bundle is CABundleNotFound; the tenant is not probed.
func TestMissingCAIsCABundleNotFound(t *testing.T) {
	_, sec := refs(t)
	stub := &stubProber{result: Result{Reason: computev1alpha1.ReasonReady}}
	f := newFixture(stub, tenantCluster(), sec)
	if _, err := f.reconcile(); err != nil {
		t.Fatal(err)
	}
	tc := f.get(t)
	if c := *clustertest.Condition(t, tc.Status.Conditions, computev1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != computev1alpha1.ReasonCABundleNotFound {
		t.Fatalf("Ready = %+v", c)
	}
	if tc.Status.Phase != computev1alpha1.PhaseInitializing {
		t.Fatalf("phase %q", tc.Status.Phase)
	}
	if got := stub.calls(); len(got) != 0 {
		t.Fatalf("probed %v with a missing CA", got)
	}
}

// The Ready condition carries the prober's reason and message; the phase
// follows from the reason and the previous phase.
func TestStatusReasonComesFromTheProber(t *testing.T) {
	for _, tc := range []struct {
		reason, previous, phase string
	}{
		{computev1alpha1.ReasonTenantUnreachable, "", computev1alpha1.PhaseConnecting},
		{computev1alpha1.ReasonTenantUnreachable, computev1alpha1.PhaseReady, computev1alpha1.PhaseUnknown},
		{computev1alpha1.ReasonCredentialRejected, "", computev1alpha1.PhaseConnecting},
		{computev1alpha1.ReasonRegistering, computev1alpha1.PhaseReady, computev1alpha1.PhaseConnecting},
		{computev1alpha1.ReasonMountProxyUnavailable, "", computev1alpha1.PhaseUnknown},
	} {
		t.Run(tc.reason+" after "+tc.previous, func(t *testing.T) {
			cm, sec := refs(t)
			obj := tenantCluster()
			obj.Status.Phase = tc.previous
			stub := &stubProber{result: Result{Reason: tc.reason, Message: "message of the probe"}}
			f := newFixture(stub, obj, cm, sec)
			if _, err := f.reconcile(); err != nil {
				t.Fatal(err)
			}
			got := f.get(t)
			if c := *clustertest.Condition(t, got.Status.Conditions, computev1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != tc.reason || c.Message != "message of the probe" {
				t.Fatalf("Ready = %+v", c)
			}
			if got.Status.Phase != tc.phase {
				t.Fatalf("phase %q, want %q", got.Status.Phase, tc.phase)
			}
			if ev := f.ws.Events.Events(); len(ev) != 1 || ev[0].Reason != tc.reason || ev[0].Type != corev1.EventTypeWarning {
				t.Fatalf("events %+v", ev)
			}
		})
	}
}

// Without a mount proxy the provider passes a nil *Prober: that is
// MountProxyUnavailable, not a crash.
func TestNilProberIsMountProxyUnavailable(t *testing.T) {
	cm, sec := refs(t)
	var p *Prober
	f := newFixture(p, tenantCluster(), cm, sec)
	if _, err := f.reconcile(); err != nil {
		t.Fatal(err)
	}
	tc := f.get(t)
	if c := *clustertest.Condition(t, tc.Status.Conditions, computev1alpha1.ConditionReady); c.Reason != computev1alpha1.ReasonMountProxyUnavailable || tc.Status.Phase != computev1alpha1.PhaseUnknown {
		t.Fatalf("Ready = %+v, phase %q", c, tc.Status.Phase)
	}
}

// A credential that disappears from a usable tenant revokes it.
func TestRemovedCredentialIsRevoked(t *testing.T) {
	cm, _ := refs(t)
	obj := tenantCluster()
	obj.Status.Phase = computev1alpha1.PhaseReady
	stub := &stubProber{result: Result{Reason: computev1alpha1.ReasonReady}}
	f := newFixture(stub, obj, cm)
	if _, err := f.reconcile(); err != nil {
		t.Fatal(err)
	}
	if c := *clustertest.Condition(t, f.get(t).Status.Conditions, computev1alpha1.ConditionReady); c.Reason != computev1alpha1.ReasonRevoked {
		t.Fatalf("Ready = %+v, want Revoked", c)
	}
}

// A workspace of that name that mounts something else is a Conflict: it is
// left alone.
func TestForeignWorkspaceIsAConflict(t *testing.T) {
	cm, sec := refs(t)
	f := newFixture(&stubProber{result: Result{Reason: computev1alpha1.ReasonReady}}, tenantCluster(), cm, sec)
	foreign := &tenancyv1alpha1.Workspace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}
	if _, err := f.kcp.Cluster(logicalcluster.NewPath(lc)).TenancyV1alpha1().Workspaces().Create(context.Background(), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reconcile(); err != nil {
		t.Fatalf("a conflict is not retried: %v", err)
	}
	if c := *clustertest.Condition(t, f.get(t).Status.Conditions, computev1alpha1.ConditionMounted); c.Status != metav1.ConditionFalse || c.Reason != computev1alpha1.ReasonConflict {
		t.Fatalf("Mounted = %+v", c)
	}
	if ws, err := f.kcp.workspace(t, "tenant"); err != nil || ws.Spec.Mount != nil {
		t.Fatalf("the foreign workspace changed: %+v, %v", ws, err)
	}
}

// A deleted TenantCluster deletes its mount workspace, then goes.
func TestDeletionDeletesTheMountWorkspace(t *testing.T) {
	cm, sec := refs(t)
	f := newFixture(&stubProber{result: Result{Reason: computev1alpha1.ReasonReady}}, tenantCluster(), cm, sec)
	if _, err := f.reconcile(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.kcp.workspace(t, "tenant"); err != nil {
		t.Fatal(err)
	}
	if err := f.ws.Client.Delete(context.Background(), f.get(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reconcile(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.kcp.workspace(t, "tenant"); !apierrors.IsNotFound(err) {
		t.Fatalf("mount workspace still there: %v", err)
	}
	if err := f.ws.Client.Get(context.Background(), client.ObjectKey{Name: "tenant"}, &computev1alpha1.TenantCluster{}); !apierrors.IsNotFound(err) {
		t.Fatalf("TenantCluster still there: %v", err)
	}
}

// Package tenantcluster reconciles TenantClusters: it checks their
// references, probes the tenant through the mount proxy, reports
// status.URL and status.phase (what kcp's workspace mounts read) with a
// Ready condition whose reason comes from the probe, and creates the
// child workspace whose spec.mount refers to the TenantCluster. It is the
// only status writer of TenantCluster (field manager FieldManager).
package tenantcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	kcpclientset "github.com/kcp-dev/sdk/client/clientset/versioned/cluster"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/tenant"
)

const (
	// Name is the controller's name.
	Name = "tenantcluster"
	// FieldManager owns TenantCluster status and its finalizer.
	FieldManager = "knotless-tenantcluster"
	// Finalizer makes a deleted TenantCluster delete its mount workspace
	// first.
	Finalizer = "compute.knotless.dev/mount"
)

// TenantProber probes the tenant of a TenantCluster (its logical cluster
// and name) through the mount proxy. *Prober is the one knotless uses.
type TenantProber interface {
	Probe(ctx context.Context, lc, name string) Result
}

// Reconciler reconciles TenantClusters in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	// KCP creates and deletes the mount workspaces, which the APIExport's
	// virtual workspace does not serve.
	KCP kcpclientset.ClusterInterface
	// Prober probes tenants through the shim (a *Prober; tests use a
	// stub); nil, or a nil *Prober, reports MountProxyUnavailable.
	Prober TenantProber
	// MountURL is the base of status.URL: where kcp's clients reach the
	// shim's /tenants/ path (kcp-front-proxy's mapping for it).
	MountURL string
	// ProbeInterval is how often a tenant is probed (default 30s).
	ProbeInterval time.Duration
	// Owner is the owner annotation of the mount workspaces (R15): the
	// provider's identity, as bootstrap.OwnerAnnotation reports it.
	Owner string
	// Market reads the market credentials of the provider's workspace
	// (tenant.MarketNamespace); nil: market contracts' mounts are not
	// usable.
	Market client.Reader
}

// SetupWithManager registers the controller and its reference index.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := tenant.AddIndex(ctx, mgr); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&computev1alpha1.TenantCluster{}, predicates.SpecOrLifecycleChanged()).
		Watches(&corev1.Secret{}, tenant.EnqueueReferrers("Secret")).
		Watches(&corev1.ConfigMap{}, tenant.EnqueueReferrers("ConfigMap")).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter:           workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout: time.Minute,
		}).
		Complete(r)
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	lc := string(req.ClusterName)
	c := cl.GetClient()
	tc := &computev1alpha1.TenantCluster{}
	if err := c.Get(ctx, req.NamespacedName, tc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !tc.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.finalize(ctx, c, lc, tc)
	}
	if !controllerutil.ContainsFinalizer(tc, Finalizer) {
		if err := ssa.Metadata(ctx, c, tc, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	interval := r.ProbeInterval
	if interval <= 0 {
		interval = 30 * time.Second
	}

	st := tc.Status.DeepCopy()
	st.ObservedGeneration = tc.Generation
	st.URL = r.MountURL + "/tenants/" + lc + "/" + tc.Name
	mounted := r.ensureWorkspace(ctx, lc, tc)
	meta.SetStatusCondition(&st.Conditions, withGen(mounted, tc.Generation))

	var res Result
	_, err = tenant.Resolve(ctx, c, r.Market, lc, tc)
	var ce *conditions.Error
	switch {
	case errors.As(err, &ce):
		res = Result{Reason: ce.Reason, Message: ce.Message}
		if ce.Reason == computev1alpha1.ReasonCredentialNotFound && wasUsable(tc.Status) {
			// The credential was there before: its removal revokes the
			// tenant (the shim refuses it already).
			res.Reason = computev1alpha1.ReasonRevoked
		}
		st.Phase = computev1alpha1.PhaseInitializing
	case err != nil:
		return reconcile.Result{}, err
	case r.Prober == nil:
		res = noMountProxy()
		st.Phase = computev1alpha1.PhaseUnknown
	default:
		res = r.Prober.Probe(ctx, lc, tc.Name)
		st.Phase = phaseOf(res.Reason, tc.Status.Phase)
	}
	if res.Version != "" {
		st.TenantVersion = res.Version
	}
	// The message may quote the spec or the tenant: a part of it, never
	// enough to make the status write fail (a condition's message is at
	// most 32 KiB).
	ready := metav1.Condition{Type: computev1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: res.Reason, Message: conditions.Quote(res.Message)}
	if res.Reason == computev1alpha1.ReasonReady {
		ready.Status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, withGen(ready, tc.Generation))
	if err := ssa.WriteStatus(ctx, c, tc, &tc.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(tc.Status.Conditions, st.Conditions, computev1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name),
		Action:   "Probe",
	}); err != nil {
		return reconcile.Result{}, err
	}
	if mounted.Status != metav1.ConditionTrue && mounted.Reason != computev1alpha1.ReasonConflict {
		return reconcile.Result{}, errors.New(mounted.Message)
	}
	return reconcile.Result{RequeueAfter: interval}, nil
}

// wasUsable reports whether the references resolved at the last
// reconcile, or the tenant was already revoked: a credential missing now
// is then a revocation, not a credential that was never there.
func wasUsable(st computev1alpha1.TenantClusterStatus) bool {
	if c := meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionReady); c != nil && c.Reason == computev1alpha1.ReasonRevoked {
		return true
	}
	return st.Phase != "" && st.Phase != computev1alpha1.PhaseInitializing
}

// phaseOf maps a probe's reason to a phase: Ready on success; a tenant
// that has not answered yet is Connecting; one that answered before and
// fails now is Unknown.
func phaseOf(reason, previous string) string {
	switch reason {
	case computev1alpha1.ReasonReady:
		return computev1alpha1.PhaseReady
	case computev1alpha1.ReasonMountProxyUnavailable:
		return computev1alpha1.PhaseUnknown
	case computev1alpha1.ReasonRegistering, computev1alpha1.ReasonRevoked:
		return computev1alpha1.PhaseConnecting
	}
	if previous == computev1alpha1.PhaseReady || previous == computev1alpha1.PhaseUnknown {
		return computev1alpha1.PhaseUnknown
	}
	return computev1alpha1.PhaseConnecting
}

func withGen(c metav1.Condition, gen int64) metav1.Condition {
	c.ObservedGeneration = gen
	return c
}

func workspaceName(tc *computev1alpha1.TenantCluster) string {
	if tc.Spec.Workspace != "" {
		return tc.Spec.Workspace
	}
	return tc.Name
}

// mountsThis reports whether ws is the mount workspace of tc.
func mountsThis(ws *tenancyv1alpha1.Workspace, tc *computev1alpha1.TenantCluster) bool {
	m := ws.Spec.Mount
	return m != nil && m.Reference.APIVersion == computev1alpha1.GroupVersion.String() && m.Reference.Kind == "TenantCluster" && m.Reference.Name == tc.Name
}

// ensureWorkspace creates the child workspace that mounts tc (once the
// TenantCluster exists, so kcp can map its kind) and reports it as the
// Mounted condition.
func (r *Reconciler) ensureWorkspace(ctx context.Context, lc string, tc *computev1alpha1.TenantCluster) metav1.Condition {
	name := workspaceName(tc)
	cond := metav1.Condition{Type: computev1alpha1.ConditionMounted, Status: metav1.ConditionFalse}
	wss := r.KCP.Cluster(logicalcluster.NewPath(lc)).TenancyV1alpha1().Workspaces()
	ws, err := wss.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ws, err = wss.Create(ctx, &tenancyv1alpha1.Workspace{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Annotations: map[string]string{tenancyv1alpha1.ExperimentalWorkspaceOwnerAnnotationKey: r.Owner},
				// R07; the finalizer still deletes it first, whatever kcp's
				// garbage collector does with a mount workspace.
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(tc, computev1alpha1.GroupVersion.WithKind("TenantCluster"))},
			},
			Spec: tenancyv1alpha1.WorkspaceSpec{Mount: &tenancyv1alpha1.Mount{Reference: tenancyv1alpha1.ObjectReference{
				APIVersion: computev1alpha1.GroupVersion.String(), Kind: "TenantCluster", Name: tc.Name,
			}}},
		}, metav1.CreateOptions{FieldManager: FieldManager})
	}
	switch {
	case err != nil:
		cond.Reason, cond.Message = "WorkspaceError", fmt.Sprintf("workspace %s: %v", name, err)
	case !mountsThis(ws, tc):
		cond.Reason, cond.Message = computev1alpha1.ReasonConflict, fmt.Sprintf("workspace %s exists and does not mount this TenantCluster", name)
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, computev1alpha1.ReasonMounted, fmt.Sprintf("workspace %s mounts this tenant (workspace phase %s)", name, ws.Status.Phase)
	}
	return cond
}

// finalize deletes the mount workspace (if it mounts this TenantCluster),
// then removes the finalizer.
func (r *Reconciler) finalize(ctx context.Context, c client.Client, lc string, tc *computev1alpha1.TenantCluster) error {
	if !controllerutil.ContainsFinalizer(tc, Finalizer) {
		return nil
	}
	wss := r.KCP.Cluster(logicalcluster.NewPath(lc)).TenancyV1alpha1().Workspaces()
	ws, err := wss.Get(ctx, workspaceName(tc), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case mountsThis(ws, tc):
		if err := wss.Delete(ctx, ws.Name, metav1.DeleteOptions{}); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return client.IgnoreNotFound(ssa.RemoveFinalizer(ctx, c, tc, Finalizer))
}

// Package mountregistry keeps the mount proxy's registry equal to the
// TenantClusters of every workspace bound to the compute export: a usable
// TenantCluster is registered with its URL, CA and credential; one that is
// deleted, being deleted, or whose references no longer resolve is revoked
// at once, which refuses new requests and ends in-flight ones. It runs in
// knotless-mountproxy and writes nothing to kcp.
package mountregistry

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/mountproxy"
)

const (
	// Name is the controller's name.
	Name = "mountregistry"
)

// Reconciler registers TenantClusters with the shim's registry.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Registry   *mountproxy.Registry
	// Readiness, when set, learns of every TenantCluster the registry
	// handled (the shim's /readyz).
	Readiness *Readiness
	// Market, when set, reads the market credentials in the provider's
	// workspace (tenant.MarketNamespace): a market contract's mount is
	// reached with its credential there. Without it, such mounts are
	// refused.
	Market client.Reader
	// MarketSource, when set, tells of a change of a market credential
	// as one of its TenantCluster (MarketSource).
	MarketSource source.TypedSource[mcreconcile.Request]
}

// MarketSource is the source of changes of the market credentials the
// cache c holds: each is a change of the TenantCluster its labels name.
func MarketSource(c cache.Cache) source.TypedSource[mcreconcile.Request] {
	return source.TypedKind(c, &corev1.Secret{}, handler.TypedEnqueueRequestsFromMapFunc(marketToTenant))
}

// SetupWithManager registers the controller and its reference index.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := tenant.AddIndex(ctx, mgr); err != nil {
		return err
	}
	b := engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&computev1alpha1.TenantCluster{}).
		Watches(&corev1.Secret{}, tenant.EnqueueReferrers("Secret")).
		Watches(&corev1.ConfigMap{}, tenant.EnqueueReferrers("ConfigMap")).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter:           workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout: time.Minute,
		})
	if r.MarketSource != nil {
		b = b.WatchesRawSource(r.MarketSource)
	}
	return b.Complete(r)
}

// marketToTenant maps a market credential to the TenantCluster its labels
// name.
func marketToTenant(_ context.Context, s *corev1.Secret) []mcreconcile.Request {
	lc, name := s.Labels[tenant.LabelMarketCluster], s.Labels[computev1alpha1.LabelMountCredential]
	if lc == "" || name == "" {
		return nil
	}
	return []mcreconcile.Request{{ClusterName: multicluster.ClusterName(lc), Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}}}
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (_ reconcile.Result, err error) {
	lc := string(req.ClusterName)
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	tc := &computev1alpha1.TenantCluster{}
	if err := cl.GetClient().Get(ctx, req.NamespacedName, tc); err != nil {
		if apierrors.IsNotFound(err) {
			r.Registry.Revoke(lc, req.Name)
			r.Readiness.Observed(lc, req.Namespace, req.Name, "", true)
			log.FromContext(ctx).Info("tenant revoked: TenantCluster deleted", "workspace", lc, "name", req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !tc.DeletionTimestamp.IsZero() {
		r.Registry.Revoke(lc, tc.Name)
		r.Readiness.Observed(lc, tc.Namespace, tc.Name, tc.ResourceVersion, true)
		return reconcile.Result{}, nil
	}
	// Every outcome below but an error (retried) is the registry's answer
	// for this version of the TenantCluster.
	defer func() {
		if err == nil {
			r.Readiness.Observed(lc, tc.Namespace, tc.Name, tc.ResourceVersion, false)
		}
	}()
	t, resolveErr := tenant.Resolve(ctx, cl.GetClient(), r.Market, lc, tc)
	var ce *conditions.Error
	switch {
	case errors.As(resolveErr, &ce):
		// Not retried: a change of the TenantCluster or of what it
		// references triggers the next reconcile.
		r.Registry.Revoke(lc, tc.Name)
		log.FromContext(ctx).Info("tenant revoked", "workspace", lc, "name", tc.Name, "reason", ce.Reason, "message", ce.Message)
		return reconcile.Result{}, nil
	case resolveErr != nil:
		return reconcile.Result{}, resolveErr
	}
	if err := r.Registry.Set(t); err != nil {
		r.Registry.Revoke(lc, tc.Name)
		log.FromContext(ctx).Info("tenant revoked", "workspace", lc, "name", tc.Name, "error", err.Error())
	}
	return reconcile.Result{}, nil
}

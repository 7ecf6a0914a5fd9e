// Package bidderworkspace is the initializer of the market-bidder
// WorkspaceType: a new bidder workspace starts with knotless-agent's
// identity in it (deploy/agent/rbac.yaml: the ServiceAccount
// default/knotless-agent, the ClusterRole knotless:agent and their
// binding), so its owner only makes the agent a token. It reconciles the
// LogicalClusters kcp's initializingworkspaces virtual workspace shows
// for the type, applies the objects and then takes its initializer off
// the LogicalCluster; kcp marks the workspace Ready once every
// initializer has. kcp makes the virtual workspace act as the
// workspace's owner, so the initializer can grant nothing the owner does
// not hold (kcp v0.28.1; a kcp whose WorkspaceTypes have
// initializerPermissions would act with those instead). A workspace whose
// initializer is gone is never touched again. Types that extend
// market-bidder inherit its initializer, and their workspaces get the
// same identity. A refusal in a workspace's first two minutes is tried
// again (kcp admits the owner through a binding it makes beside the
// workspace); later, the workspace goes on without the identity rather
// than staying Initializing, and the provider logs why.
package bidderworkspace

import (
	"context"
	"fmt"
	"slices"
	"time"

	kcpcorev1alpha1 "github.com/kcp-dev/sdk/apis/core/v1alpha1"
	"github.com/kcp-dev/sdk/apis/tenancy/initialization"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/clock"
)

const (
	// Name is the controller's name.
	Name = "bidderworkspace"
	// FieldManager owns the objects it applies.
	FieldManager = "knotless-bidderworkspace"
	// WorkspaceType is the type whose workspaces it initializes
	// (workspacetypes/market-bidder.yaml, spec.initializer).
	WorkspaceType = "market-bidder"
)

// Reconciler initializes the workspaces of one WorkspaceType.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	// Initializer is the WorkspaceType's (initialization.InitializerForType).
	Initializer kcpcorev1alpha1.LogicalClusterInitializer
	// Objects are applied to each new workspace (bootstrap.Decode of
	// deploy/agent/rbac.yaml).
	Objects []*unstructured.Unstructured
	// GiveUpAfter is how long after a workspace was created a refused
	// apply is still tried again (default 2 minutes); Now is the clock.
	GiveUpAfter time.Duration
	Now         func() time.Time
}

func (r *Reconciler) now() time.Time { return clock.Now(r.Now) }

func (r *Reconciler) giveUpAfter() time.Duration {
	if r.GiveUpAfter > 0 {
		return r.GiveUpAfter
	}
	return 2 * time.Minute
}

// SetupWithManager registers the controller with the manager of the
// initializingworkspaces provider.
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	return mcbuilder.ControllerManagedBy(mgr).
		Named(Name).
		For(&kcpcorev1alpha1.LogicalCluster{}).
		Complete(r)
}

// Reconcile applies the objects to one initializing workspace and takes
// the initializer off its LogicalCluster.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, err
	}
	if req.Name != kcpcorev1alpha1.LogicalClusterName {
		return reconcile.Result{}, nil // a workspace has one LogicalCluster, "cluster"
	}
	c := cl.GetClient()
	lc := &kcpcorev1alpha1.LogicalCluster{}
	if err := c.Get(ctx, req.NamespacedName, lc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !slices.Contains(lc.Status.Initializers, r.Initializer) {
		return reconcile.Result{}, nil
	}
	logger := log.FromContext(ctx)
	for _, o := range r.Objects {
		err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner(FieldManager), client.ForceOwnership)
		// The namespace comes from another initializer (kcp's universal
		// type), working beside this one; kcp admits the owner through a
		// binding it makes beside the workspace, and its caches may lag
		// a new workspace. Such refusals are tried again while the
		// workspace is new; later, holding it Initializing would lock its
		// owner out: it becomes Ready without the agent's identity, which
		// its owner applies.
		refused := apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || (apierrors.IsNotFound(err) && o.GetNamespace() != "")
		switch {
		case err == nil:
			continue
		case refused && r.now().Before(lc.CreationTimestamp.Add(r.giveUpAfter())):
			logger.V(1).Info("refused while the workspace is new; trying again", "kind", o.GetKind(), "name", o.GetName(), "error", err.Error())
			return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
		case refused:
			logger.Error(err, "the agent's identity cannot be made in the workspace; it goes on without it", "kind", o.GetKind(), "name", o.GetName())
		default:
			return reconcile.Result{}, fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		break
	}
	// The initializers are one list: the resourceVersion keeps this patch
	// from putting back one that another initializer took off meanwhile.
	patch := client.MergeFromWithOptions(lc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	lc.Status.Initializers = initialization.EnsureInitializerAbsent(r.Initializer, lc.Status.Initializers)
	if err := c.Status().Patch(ctx, lc, patch); apierrors.IsConflict(err) {
		// Another initializer left after the read: its change is on its
		// way to the cache, and the next pass reads it.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	} else if err != nil {
		return reconcile.Result{}, fmt.Errorf("taking the initializer off: %w", err)
	}
	logger.Info("bidder workspace initialized")
	return reconcile.Result{}, nil
}

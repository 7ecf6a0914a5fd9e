// Package marketnetwork checks MarketNetworks: their firehoses, PDS hosts,
// lexicon namespace and operator DID (internal/market/network's Validate,
// which the market controllers that trade in a network call too). It is the only status writer of
// MarketNetwork (field manager FieldManager) and never writes spec, so no
// restart clears a network's configuration (seed defect D03).
package marketnetwork

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/market/network"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "marketnetwork"
	// FieldManager owns MarketNetwork status.
	FieldManager = "knotless-marketnetwork"
)

// Reconciler reconciles MarketNetworks in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketNetwork{}, predicate.GenerationChangedPredicate{}).
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
	c := cl.GetClient()
	n := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, req.NamespacedName, n); err != nil || !n.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	st := n.Status.DeepCopy()
	st.ObservedGeneration = n.Generation
	cond := metav1.Condition{Type: marketv1alpha1.ConditionReady, ObservedGeneration: n.Generation}
	if err := network.Validate(&n.Spec); err != nil {
		st.Phase = marketv1alpha1.PhaseFailed
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, marketv1alpha1.ReasonInvalidSpec, err.Error()
	} else {
		st.Phase = marketv1alpha1.PhaseReady
		cond.Status, cond.Reason = metav1.ConditionTrue, marketv1alpha1.ReasonReady
		cond.Message = fmt.Sprintf("%d firehose(s), namespace %s", len(n.Spec.Firehoses), network.Namespace(&n.Spec))
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return reconcile.Result{}, ssa.WriteStatus(ctx, c, n, &n.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(n.Status.Conditions, st.Conditions, marketv1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name),
		Action:   "Validate",
	})
}

// Package marketbidder reconciles MarketBidders: it checks the bidder's
// network and identity, and applies its MarketPresence (a generated child
// with a controller owner reference, R07) from the offers, the free
// capacity and spec.suspend. A suspended bidder's presence says it takes
// no new requests; suspend never stops work on what it already runs
// (seed defect D04). It is the only status writer of MarketBidder (field
// manager FieldManager) and never writes the bidder's spec.
package marketbidder

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/marketnetwork"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "marketbidder"
	// FieldManager owns MarketBidder status and the spec of its
	// MarketPresence.
	FieldManager = "knotless-marketbidder"

	byIdentity = "market.knotless.dev/bidder-identity"
	byNetwork  = "market.knotless.dev/bidder-network"
)

// Reconciler reconciles MarketBidders in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
}

// SetupWithManager registers the controller and its indexes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketBidder{}, byIdentity, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketBidder).Spec.IdentityRef.Name}
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketBidder{}, byNetwork, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketBidder).Spec.NetworkRef.Name}
	}); err != nil {
		return err
	}
	bidders := func() client.ObjectList { return &marketv1alpha1.MarketBidderList{} }
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketBidder{}, predicates.SpecOrLifecycleChanged()).
		Owns(&marketv1alpha1.MarketPresence{}).
		Watches(&marketv1alpha1.MarketIdentity{}, mapping.ByIndex(bidders, byIdentity, client.Object.GetName)).
		Watches(&marketv1alpha1.MarketNetwork{}, mapping.ByClusterIndex(bidders, byNetwork, client.Object.GetName)).
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
	b := &marketv1alpha1.MarketBidder{}
	if err := c.Get(ctx, req.NamespacedName, b); err != nil || !b.DeletionTimestamp.IsZero() {
		// Its presence is deleted with it (owner reference); the
		// presence's finalizer deletes the record.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	st := b.Status.DeepCopy()
	st.ObservedGeneration = b.Generation
	cause := r.sync(ctx, c, b, st)
	var ce *conditions.Error
	switch {
	case cause == nil:
	case errors.As(cause, &ce):
		st.Phase = marketv1alpha1.PhasePending
		if ce.Reason == marketv1alpha1.ReasonInvalidSpec {
			st.Phase = marketv1alpha1.PhaseFailed
		}
		setReady(st, b.Generation, metav1.ConditionFalse, ce.Reason, ce.Message)
		cause = nil // a watch or a spec edit brings the bidder back
	default:
		setReady(st, b.Generation, metav1.ConditionFalse, "Error", cause.Error())
	}
	ready := meta.FindStatusCondition(st.Conditions, marketv1alpha1.ConditionReady)
	if err := ssa.WriteStatus(ctx, c, b, &b.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseChanged(b.Status.Phase, st.Phase, marketv1alpha1.PhaseFailed, marketv1alpha1.PhaseSuspended, ready.Message),
		Recorder: cl.GetEventRecorder(Name),
		Action:   "Reconcile",
	}); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, cause
}

// sync applies the bidder's presence and reads its state into st.
func (r *Reconciler) sync(ctx context.Context, c client.Client, b *marketv1alpha1.MarketBidder, st *marketv1alpha1.MarketBidderStatus) error {
	if b.Spec.Driver != "" && b.Spec.Driver != marketv1alpha1.DriverProcess {
		return conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil, "spec.driver: %q is not a driver knotless has (process)", b.Spec.Driver)
	}
	net := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, client.ObjectKey{Name: b.Spec.NetworkRef.Name}, net); err != nil {
		if apierrors.IsNotFound(err) {
			return conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketNetwork %s not found", b.Spec.NetworkRef.Name)
		}
		return err
	}
	if err := marketnetwork.Validate(&net.Spec); err != nil {
		return conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s is not usable: %v", net.Name, err)
	}
	id, err := market.Identity(ctx, c, b.Namespace, b.Spec.IdentityRef.Name)
	if err != nil {
		return err
	}
	st.DID = id.Status.DID
	if id.Spec.NetworkRef.Name != net.Name {
		return conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil, "MarketIdentity %s takes part in MarketNetwork %s, not %s", id.Name, id.Spec.NetworkRef.Name, net.Name)
	}

	desired := Presence(b, marketnetwork.Namespace(&net.Spec))
	if err := ssa.Child(ctx, c, desired, b, FieldManager); err != nil {
		return err
	}
	p := &marketv1alpha1.MarketPresence{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(desired), p); err != nil {
		if apierrors.IsNotFound(err) {
			return conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "MarketPresence %s is being created", desired.Name)
		}
		return err
	}
	if p.Status.Record != nil {
		st.PresenceURI = p.Status.Record.URI
	}
	pc := meta.FindStatusCondition(p.Status.Conditions, marketv1alpha1.ConditionReady)
	published := pc != nil && pc.Status == metav1.ConditionTrue && p.Status.ObservedGeneration == p.Generation
	switch {
	case !published && pc != nil && pc.ObservedGeneration == p.Generation:
		return conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "MarketPresence %s: %s: %s", p.Name, pc.Reason, pc.Message)
	case !published:
		return conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "MarketPresence %s is being published", p.Name)
	case b.Spec.Suspend:
		st.Phase = marketv1alpha1.PhaseSuspended
		setReady(st, b.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonSuspended, "suspended: the presence says the bidder takes no new requests")
	default:
		st.Phase = marketv1alpha1.PhaseReady
		setReady(st, b.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonReady, "presence published as "+st.PresenceURI)
	}
	return nil
}

// Presence is the bidder's MarketPresence: its offers with their free
// capacity (all of it until contracts exist) and whether it takes new
// requests.
func Presence(b *marketv1alpha1.MarketBidder, network string) *marketv1alpha1.MarketPresence {
	p := &marketv1alpha1.MarketPresence{
		ObjectMeta: metav1.ObjectMeta{Name: b.Name, Namespace: b.Namespace},
		Spec: marketv1alpha1.MarketPresenceSpec{
			IdentityRef:       b.Spec.IdentityRef,
			Network:           network,
			Driver:            b.Spec.Driver,
			AcceptingRequests: !b.Spec.Suspend,
		},
	}
	if p.Spec.Driver == "" {
		p.Spec.Driver = marketv1alpha1.DriverProcess
	}
	for _, o := range b.Spec.Offers {
		p.Spec.Offers = append(p.Spec.Offers, marketv1alpha1.PresenceOffer{Offer: o, Free: o.Capacity})
	}
	return p
}

func setReady(st *marketv1alpha1.MarketBidderStatus, gen int64, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

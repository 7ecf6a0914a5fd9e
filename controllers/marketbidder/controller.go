// Package marketbidder reconciles MarketBidders: the selling side of the
// compute market. It checks the bidder's network and identity, bids on
// the requests of the network it can serve (capacity is reserved for each
// open bid and freed on every terminal signal: the bid lost, expired, its
// request went or changed, or it was declined), answers the requester's
// accept with a lease record (confirmed, or declined with a reason), holds
// a ComputeContract per lease (owned by the MarketBidder) and ends the
// lease when the requester releases it. It applies the MarketPresence (a
// generated child with a controller owner reference, R07) from the
// offers, the free capacity and spec.suspend.
//
// What it acts on is the records: its own bids and leases (listed from
// its repo: the inventory, so a restart never loses a reservation) and the
// requesters' requests, accepts and releases (from the network's
// firehoses, verified, and listed again from the requesters' repos now and
// then). A suspended bidder makes no new bids and declines accepts, but
// still ends leases that are released (seed defect D04). It is the only
// status writer of MarketBidder and of the Bids and ComputeContracts it
// owns (field manager FieldManager) and never writes the bidder's spec.
package marketbidder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/network"
	"github.com/knotless-dev/knotless/internal/ownwrites"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "marketbidder"
	// FieldManager owns MarketBidder status and finalizer, the spec of its
	// MarketPresence, and the spec and status of its Bids and
	// ComputeContracts.
	FieldManager = "knotless-marketbidder"
	// Finalizer deletes the bidder's bid and lease records before it goes.
	Finalizer = "market.knotless.dev/bidder"

	byIdentity = "market.knotless.dev/bidder-identity"
	byNetwork  = "market.knotless.dev/bidder-network"
)

// Reconciler reconciles MarketBidders in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	// Market is where the requesters' records are read (market.Feeds).
	// Without it the bidder only publishes its presence.
	Market market.Market
	// Source wakes bidders when a record concerning them changes
	// (Feeds.Source(market.RoleBidder)); nil in unit tests.
	Source source.TypedSource[mcreconcile.Request]
	// Inventories hold each bidder's own records.
	Inventories *market.Inventories
	// Resync is how often a bidder with nothing due is looked at again
	// (default 2m).
	Resync time.Duration
	// Connect returns the Publisher of a repo (default market.Client with
	// Pool); tests replace it.
	Connect market.Connector
	// Now is the clock (default time.Now).
	Now func() time.Time
	// StepSeconds observes the bidder's market steps (request_bid,
	// accept_lease) when set (market.NewStepSeconds).
	StepSeconds *prometheus.HistogramVec

	// absent tells a record missing from the view from one gone from its
	// repo.
	absent market.Absences
	// writes lets a pass read what the passes before it wrote when the
	// cache does not show it yet.
	writes ownwrites.Store
}

// client is the workspace's client with the bidder's own writes read back.
func (r *Reconciler) client(cl cluster.Cluster, req mcreconcile.Request) client.Client {
	return r.writes.Client(string(req.ClusterName), cl.GetClient())
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
	b := engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketBidder{}, predicates.SpecOrLifecycleChanged()).
		Owns(&marketv1alpha1.MarketPresence{}).
		Watches(&marketv1alpha1.MarketIdentity{}, mapping.ByIndex(bidders, byIdentity, client.Object.GetName)).
		Watches(&marketv1alpha1.MarketNetwork{}, mapping.ByClusterIndex(bidders, byNetwork, client.Object.GetName)).
		// A VM's phase (Running, Lost) moves its lease on.
		Watches(&computev1alpha1.ComputeVM{}, vmToBidder()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout:   time.Minute,
			MaxConcurrentReconciles: 8,
		})
	if r.Source != nil {
		b = b.WatchesRawSource(r.Source)
	}
	return b.Complete(r)
}

// vmToBidder maps a ComputeVM to the MarketBidder that owns its contract.
func vmToBidder() func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, cl cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []mcreconcile.Request {
			ref := metav1.GetControllerOf(o)
			if ref == nil || ref.Kind != "ComputeContract" {
				return nil
			}
			cc := &marketv1alpha1.ComputeContract{}
			if cl.GetCache().Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}, cc) != nil {
				return nil
			}
			owner := metav1.GetControllerOf(cc)
			if owner == nil || owner.Kind != "MarketBidder" {
				return nil
			}
			return []mcreconcile.Request{{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: owner.Name}}}}
		})
	}
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	c := r.client(cl, req)
	b := &marketv1alpha1.MarketBidder{}
	if err := c.Get(ctx, req.NamespacedName, b); err != nil {
		if apierrors.IsNotFound(err) {
			market.Forget(r.Market, r.Inventories, req)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !b.DeletionTimestamp.IsZero() {
		// Its presence is deleted with it (owner reference); the
		// presence's finalizer deletes the record. Its bids and leases
		// are deleted here.
		return r.finalize(ctx, cl, req, b)
	}
	if r.Market != nil && !controllerutil.ContainsFinalizer(b, Finalizer) {
		if err := ssa.Metadata(ctx, c, b, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	st := b.Status.DeepCopy()
	st.ObservedGeneration = b.Generation
	t, cause := r.sync(ctx, cl, req, b, st)
	resync := clock.Resync(r.Resync)
	result := reconcile.Result{RequeueAfter: resync}
	if t != nil && !t.next().IsZero() {
		result.RequeueAfter = min(max(t.next().Sub(clock.Now(r.Now))+50*time.Millisecond, 50*time.Millisecond), resync)
	}
	var ce *conditions.Error
	switch {
	case cause == nil:
	case errors.As(cause, &ce):
		st.Phase = marketv1alpha1.PhasePending
		if ce.Reason == marketv1alpha1.ReasonInvalidSpec {
			st.Phase = marketv1alpha1.PhaseFailed
		}
		conditions.SetReady(&st.Conditions, b.Generation, metav1.ConditionFalse, ce.Reason, ce.Message)
		if ce.Reason == marketv1alpha1.ReasonNotFound || ce.Reason == marketv1alpha1.ReasonNotReady || ce.Reason == marketv1alpha1.ReasonInvalidSpec {
			cause = nil // a watch or a spec edit brings the bidder back
		}
	default:
		conditions.SetReady(&st.Conditions, b.Generation, metav1.ConditionFalse, "Error", cause.Error())
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
	return result, cause
}

// finalize deletes a deleted bidder's bid and lease records, then lets it
// go. Without a usable repo they cannot be deleted: it goes and a Warning
// Event says so.
func (r *Reconciler) finalize(ctx context.Context, cl cluster.Cluster, req mcreconcile.Request, b *marketv1alpha1.MarketBidder) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(b, Finalizer) {
		market.Forget(r.Market, r.Inventories, req)
		return reconcile.Result{}, nil
	}
	c := r.client(cl, req)
	t, err := r.trader(ctx, cl, req, b, b.Status.DeepCopy())
	switch {
	case err != nil && conditions.ReasonOf(err, "") == marketv1alpha1.ReasonNotFound:
		// The network, identity or repo is gone (a deleted identity deletes
		// the deal records of its repo); one that is only not Ready yet is
		// waited for: its records must go.
		if b.Status.OpenBids > 0 || b.Status.Leased > 0 {
			cl.GetEventRecorder(Name).Eventf(b, nil, corev1.EventTypeWarning, "RecordsLeft", "Delete",
				"the bidder's repo is not usable (%v); its bid and lease records could not be deleted", err)
		}
	case err != nil:
		return reconcile.Result{}, err
	case !t.withdrawAll():
		return reconcile.Result{}, errors.Join(t.errs...)
	}
	if err := ssa.RemoveFinalizer(ctx, c, b, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	market.Forget(r.Market, r.Inventories, req)
	return reconcile.Result{}, nil
}

// trader prepares the bidder's trading: its identity and repo (Ready),
// network, the market's records and its own. A missing or unready one is
// a *conditions.Error.
func (r *Reconciler) trader(ctx context.Context, cl cluster.Cluster, req mcreconcile.Request, b *marketv1alpha1.MarketBidder, st *marketv1alpha1.MarketBidderStatus) (*trader, error) {
	c := r.client(cl, req)
	net := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, client.ObjectKey{Name: b.Spec.NetworkRef.Name}, net); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketNetwork %s not found", b.Spec.NetworkRef.Name)
		}
		return nil, err
	}
	id, repo, err := market.IdentityRepo(ctx, c, b.Namespace, b.Spec.IdentityRef.Name)
	if err != nil {
		return nil, err
	}
	t := &trader{ctx: ctx, c: c, b: b, st: st, events: cl.GetEventRecorder(Name), now: clock.Now(r.Now), id: id, net: net,
		network: network.Name(net), owner: market.Owner(string(b.UID)), absent: &r.absent,
		observe: func(step string, since time.Time) { market.ObserveStep(r.StepSeconds, step, since, clock.Now(r.Now)) }}
	if b.Spec.Suspend {
		t.stop = "suspended"
	}
	fl := market.Follower{Role: market.RoleBidder, DID: id.Status.DID, Request: req, Operator: net.Spec.OperatorDID, Vouches: market.Approved(id, marketv1alpha1.RoleRequester)}
	if t.view, err = r.Market.Follow(fl, net.Spec.Firehoses); err != nil {
		return nil, conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s: %v", net.Name, err)
	}
	pub, err := market.Connect(ctx, r.Connect, r.Pool, c, string(req.ClusterName), repo)
	if err != nil {
		return nil, err
	}
	if t.inv, err = r.Inventories.Open(ctx, engage.Key(req), id.Status.DID, t.owner, pub, lexicon.Bid, lexicon.Lease, lexicon.Reclaim); err != nil {
		return nil, err
	}
	return t, nil
}

// sync trades, applies the bidder's presence and reads its state into st.
func (r *Reconciler) sync(ctx context.Context, cl cluster.Cluster, req mcreconcile.Request, b *marketv1alpha1.MarketBidder, st *marketv1alpha1.MarketBidderStatus) (*trader, error) {
	c := r.client(cl, req)
	if b.Spec.Driver != "" && b.Spec.Driver != marketv1alpha1.DriverProcess && b.Spec.Driver != marketv1alpha1.DriverKind {
		return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil, "spec.driver: %q is not a driver knotless has (process, kind)", b.Spec.Driver)
	}
	net := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, client.ObjectKey{Name: b.Spec.NetworkRef.Name}, net); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketNetwork %s not found", b.Spec.NetworkRef.Name)
		}
		return nil, err
	}
	if err := network.Validate(&net.Spec); err != nil {
		return nil, conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s is not usable: %v", net.Name, err)
	}
	id, err := market.Identity(ctx, c, b.Namespace, b.Spec.IdentityRef.Name)
	if err != nil {
		return nil, err
	}
	st.DID = id.Status.DID
	if id.Spec.NetworkRef.Name != net.Name {
		return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil, "MarketIdentity %s takes part in MarketNetwork %s, not %s", id.Name, id.Spec.NetworkRef.Name, net.Name)
	}

	// Trading decides the free capacity the presence advertises.
	var t *trader
	var tradeErr error
	if r.Market != nil {
		if t, tradeErr = r.trader(ctx, cl, req, b, st); tradeErr == nil {
			t.run()
			tradeErr = errors.Join(t.errs...)
			st.OpenBids, st.Leased, st.IgnoredRecords = 0, 0, int64(len(t.plan.Ignored))
			for i := range b.Spec.Offers {
				st.OpenBids += t.reserved(i)
				st.Leased += t.used(i)
			}
		}
	}
	desired := Presence(b, network.Name(net), t)
	if r.Market != nil && (t == nil || !t.counted) {
		// Trading did not run: what is leased is not known. The presence
		// keeps what it last said (nothing free if it said nothing).
		keepFree(ctx, c, desired)
	}
	p, err := applyPresence(ctx, c, b, desired)
	if err != nil {
		return t, err
	}
	if tradeErr != nil {
		return t, tradeErr
	}
	return t, ready(b, st, p, t != nil)
}

// ready reads the presence's state into the bidder's status: Ready once
// it is published (Suspended when the bidder is), else a
// *conditions.Error that says why not.
func ready(b *marketv1alpha1.MarketBidder, st *marketv1alpha1.MarketBidderStatus, p *marketv1alpha1.MarketPresence, traded bool) error {
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
		conditions.SetReady(&st.Conditions, b.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonSuspended, "suspended: the presence says the bidder takes no new requests; leases still end when released")
	default:
		st.Phase = marketv1alpha1.PhaseReady
		msg := "presence published as " + st.PresenceURI
		if traded {
			msg += fmt.Sprintf("; %d open bid(s), %d VM(s) leased", st.OpenBids, st.Leased)
		}
		conditions.SetReady(&st.Conditions, b.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonReady, msg)
	}
	return nil
}

// applyPresence applies the desired presence when the one there differs
// (a pass that changes nothing writes nothing) and returns the presence
// there, or a *conditions.Error while it is being created.
func applyPresence(ctx context.Context, c client.Client, b *marketv1alpha1.MarketBidder, desired *marketv1alpha1.MarketPresence) (*marketv1alpha1.MarketPresence, error) {
	p := &marketv1alpha1.MarketPresence{}
	err := c.Get(ctx, client.ObjectKeyFromObject(desired), p)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if err == nil && metav1.IsControlledBy(p, b) && apiequality.Semantic.DeepEqual(p.Spec, desired.Spec) {
		return p, nil
	}
	if err := ssa.Child(ctx, c, desired, b, FieldManager); err != nil {
		return nil, err
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(desired), p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "MarketPresence %s is being created", desired.Name)
		}
		return nil, err
	}
	return p, nil
}

// keepFree sets the free capacity of the desired presence's offers to
// what the existing presence says (0 for offers it does not have).
func keepFree(ctx context.Context, c client.Client, desired *marketv1alpha1.MarketPresence) {
	prev := &marketv1alpha1.MarketPresence{}
	free := map[string]int32{}
	if c.Get(ctx, client.ObjectKeyFromObject(desired), prev) == nil {
		for _, o := range prev.Spec.Offers {
			free[o.Name] = min(o.Free, o.Capacity)
		}
	}
	for i := range desired.Spec.Offers {
		o := &desired.Spec.Offers[i]
		o.Free = min(free[o.Name], o.Capacity)
	}
}

// Presence is the bidder's MarketPresence: its offers with their free
// capacity (what its leases leave; all of it without a trader) and
// whether it takes new requests.
func Presence(b *marketv1alpha1.MarketBidder, network string, t *trader) *marketv1alpha1.MarketPresence {
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
	for i, o := range b.Spec.Offers {
		// Open bids are not subtracted: they mostly end without a lease,
		// and the presence would change with every bid (status.openBids
		// counts them).
		free := o.Capacity
		if t != nil && t.plan != nil {
			free = max(o.Capacity-t.used(i), 0)
		}
		p.Spec.Offers = append(p.Spec.Offers, marketv1alpha1.PresenceOffer{Offer: o, Free: free})
	}
	return p
}

// Package marketrequester reconciles MarketRequesters: the buying side of
// the compute market. For every replica it still needs, a requester
// publishes a request record, keeps a Bid object per bid it sees (owned by
// the MarketRequester), accepts the cheapest acceptable bid after the bid
// window with an accept record, and, once the bidder confirms with a
// lease record, holds a ComputeContract (owned by the MarketRequester).
// Replicas no longer wanted (spec.replicas lowered, the requester deleted
// or suspended, alone or through its Component or Application) are given
// back with a release record.
//
// What it acts on is the records: its own (listed from its repo: the
// inventory) and the bidders' (from the network's firehoses, verified).
// Record keys derive from the record answered, so a retry after a crash
// rewrites the same record. Deadlines are judged by this provider's clock.
// It is the only status writer of MarketRequester and of the Bids and
// ComputeContracts it owns (field manager FieldManager) and never writes
// a MarketRequester's spec.
package marketrequester

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	kclock "github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/market/network"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/ownwrites"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/suspend"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const (
	// Name is the controller's name.
	Name = "marketrequester"
	// FieldManager owns MarketRequester status and finalizer, and the spec
	// and status of the requester's Bids and ComputeContracts.
	FieldManager = "knotless-marketrequester"
	// Finalizer releases what the requester holds before it goes.
	Finalizer = "market.knotless.dev/requester"

	byIdentity = "market.knotless.dev/requester-identity"
	byNetwork  = "market.knotless.dev/requester-network"

	// keepFinished is how many finished contracts a requester keeps.
	keepFinished = 10
	// keepSettledBids is how many Bids of earlier requests it keeps.
	keepSettledBids = 20
	// ReasonTenantUnresponsive: an Active contract whose mounted tenant
	// does not answer (its Ready condition's reason).
	ReasonTenantUnresponsive = "TenantUnresponsive"
	// ReasonReclaimed: an Active contract whose bidder gave notice that it
	// takes the VM back (its Ready condition's reason).
	ReasonReclaimed = "Reclaimed"
	// kcpWriters bounds the Bids written at once.
	kcpWriters = 8
	// maxRetry caps the wait before a request without an acceptable bid
	// is made again.
	maxRetry = deal.MaxRetry
)

// Reconciler reconciles MarketRequesters in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	// Market is where the bidders' records are read (market.Feeds).
	Market market.Market
	// Source wakes requesters when a record concerning them changes
	// (Feeds.Source(market.RoleRequester)); nil in unit tests.
	Source source.TypedSource[mcreconcile.Request]
	Scheme *runtime.Scheme
	// Inventories hold each requester's own records.
	Inventories *market.Inventories
	// Resync is how often a requester with nothing due is looked at again
	// (default 2m).
	Resync time.Duration
	// Connect returns the Publisher of a repo (default market.Client with
	// Pool); tests replace it.
	Connect market.Connector
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Policy is the address policy of connections to tenants (R18; nil
	// allows public addresses only).
	Policy *netpolicy.Policy
	// TenantClient returns a client of a tenant bearing a token (default:
	// through Policy, no proxy, no redirect, bounded answers); tests
	// replace it.
	TenantClient func(tn deal.Tenant, token string) (kubernetes.Interface, error)
	// Mounts is the client of the provider's own workspace, where the
	// mounts' credentials are kept (tenant.MarketNamespace), out of every
	// workspace the provider serves; without it no tenant is mounted.
	Mounts client.Client
	// TenantState exports and imports a tenant's objects (default:
	// package statesync's); tests replace it.
	TenantState TenantState
	// Reaches is where each mounted contract's tenant reach is published
	// for the other controllers of the requester's side (nil: nowhere).
	Reaches *tenantreach.Registry
	// StepSeconds observes the requester's market steps (deadline_accept,
	// lease_active) when set (market.NewStepSeconds).
	StepSeconds *prometheus.HistogramVec

	// absent tells a lease or bid missing from the view from one gone
	// from its repo.
	absent market.Absences
	// writes lets a pass read what the passes before it wrote when the
	// cache does not show it yet.
	writes ownwrites.Store
	// access is when each contract's tenant access is applied next
	// (accessTry by contract UID).
	access sync.Map
	// mints is when each contract's mount token is minted next after a
	// failure (mintTry by contract UID).
	mints sync.Map
	// minted is the token each contract's mount holds (mountedToken by
	// contract UID).
	minted sync.Map
	// exports is how each released contract's export went (exportTry by
	// contract UID), restores each new contract's import (restoreTry).
	exports, restores sync.Map
}

// observeStep records a market step begun at since that a write just
// ended (knotless_market_step_seconds).
func (r *Reconciler) observeStep(step string, since time.Time) {
	market.ObserveStep(r.StepSeconds, step, since, kclock.Now(r.Now))
}

// SetupWithManager registers the controller and its indexes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketRequester{}, byIdentity, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketRequester).Spec.IdentityRef.Name}
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketRequester{}, byNetwork, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketRequester).Spec.NetworkRef.Name}
	}); err != nil {
		return err
	}
	requesters := func() client.ObjectList { return &marketv1alpha1.MarketRequesterList{} }
	b := engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketRequester{}, predicates.SpecOrLifecycleChanged()).
		Watches(&marketv1alpha1.MarketIdentity{}, mapping.ByIndex(requesters, byIdentity, client.Object.GetName)).
		Watches(&marketv1alpha1.MarketNetwork{}, mapping.ByClusterIndex(requesters, byNetwork, client.Object.GetName)).
		// A Component's (or, through it, an Application's) suspend reaches
		// the requester it templates.
		Watches(&appsv1alpha1.Component{}, componentToRequester(), predicates.PhaseChanged()).
		// A mount's phase moves its contract to Active.
		Watches(&computev1alpha1.TenantCluster{}, tenantToRequester()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter:           workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout: time.Minute,
			// A reconcile mostly waits on kcp and the PDS; requesters whose
			// deadlines fall together must not queue behind each other.
			MaxConcurrentReconciles: 16,
		})
	if r.Source != nil {
		b = b.WatchesRawSource(r.Source)
	}
	return b.Complete(r)
}

func componentToRequester() func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, _ cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []mcreconcile.Request {
			comp, ok := o.(*appsv1alpha1.Component)
			if !ok || comp.Spec.Template.MarketRequester == nil {
				return nil
			}
			return []mcreconcile.Request{{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKeyFromObject(comp)}}}
		})
	}
}

// tenantToRequester maps a TenantCluster the requester made (named like
// its contract, whose namespace the credential reference names) to the
// contract's MarketRequester.
func tenantToRequester() func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, cl cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []mcreconcile.Request {
			tc, ok := o.(*computev1alpha1.TenantCluster)
			if !ok || tc.Spec.Credential.SecretRef.Name != tenantCredential(tc.Name) {
				return nil
			}
			cc := &marketv1alpha1.ComputeContract{}
			if cl.GetCache().Get(ctx, client.ObjectKey{Namespace: tc.Spec.Credential.SecretRef.Namespace, Name: tc.Name}, cc) != nil {
				return nil
			}
			owner := metav1.GetControllerOf(cc)
			if owner == nil || owner.Kind != "MarketRequester" {
				return nil
			}
			return []mcreconcile.Request{{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKey{Namespace: cc.Namespace, Name: owner.Name}}}}
		})
	}
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	// The requester's own writes are read back before the cache has
	// them: a pass that follows closely on another does not decide from
	// a stale status and write again what is written.
	c := r.writes.Client(string(req.ClusterName), cl.GetClient())
	mr := &marketv1alpha1.MarketRequester{}
	if err := c.Get(ctx, req.NamespacedName, mr); err != nil {
		if apierrors.IsNotFound(err) {
			market.Forget(r.Market, r.Inventories, req)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	deleting := !mr.DeletionTimestamp.IsZero()
	if deleting && !controllerutil.ContainsFinalizer(mr, Finalizer) {
		market.Forget(r.Market, r.Inventories, req)
		return reconcile.Result{}, nil
	}
	if !deleting && !controllerutil.ContainsFinalizer(mr, Finalizer) {
		if err := ssa.Metadata(ctx, c, mr, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}

	s := &session{r: r, req: req, ctx: ctx, c: c, lc: string(req.ClusterName), mr: mr, events: cl.GetEventRecorder(Name),
		now: kclock.Now(r.Now), st: mr.Status.DeepCopy(), deleting: deleting, ignored: map[string]bool{}}
	s.st.ObservedGeneration = mr.Generation
	result, cause := s.outcome(s.run())
	if deleting && s.done {
		return s.removeFinalizer()
	}
	ready := meta.FindStatusCondition(s.st.Conditions, marketv1alpha1.ConditionReady)
	if err := ssa.WriteStatus(ctx, c, mr, &mr.Status, s.st, ssa.StatusOptions{
		Manager: FieldManager,
		// status.requests loses entries (replicas released): replaced
		// whole (an apply through the virtual workspace would keep them).
		Replace:  true,
		Event:    ssa.PhaseMoved(mr.Status.Phase, s.st.Phase, marketv1alpha1.PhaseFailed, marketv1alpha1.PhaseSuspended, ready.Message),
		Recorder: s.events,
		Action:   "Reconcile",
	}); err != nil {
		return reconcile.Result{}, err
	}
	if cause != nil {
		return reconcile.Result{}, cause
	}
	return result, nil
}

// session is one reconcile of one MarketRequester.
type session struct {
	r        *Reconciler
	req      mcreconcile.Request
	ctx      context.Context
	c        client.Client
	lc       string
	mr       *marketv1alpha1.MarketRequester
	events   events.EventRecorder
	now      time.Time
	st       *marketv1alpha1.MarketRequesterStatus
	deleting bool
	// done is set when a deleting requester holds nothing any more.
	done bool

	id   *marketv1alpha1.MarketIdentity
	net  *marketv1alpha1.MarketNetwork
	view market.Reader
	inv  *market.Inventory
	// pub is the requester's repo (its records, its service-auth tokens);
	// repo is its AtprotoRepo.
	pub     market.Publisher
	repo    *atprotov1alpha1.AtprotoRepo
	owner   string
	network string
	// stop is why no new request is made ("" when one may be); release
	// is the reason code of releases.
	stop    string
	release deal.ReleaseReason

	bids      map[string]*marketv1alpha1.Bid             // by name
	contracts map[string]*marketv1alpha1.ComputeContract // by name
	// next is the earliest deadline that needs a look.
	next time.Time
	// ignored are the records (uri|cid) ignored as forged or stale.
	ignored map[string]bool
}

func (s *session) due(t time.Time) {
	if t.IsZero() {
		return
	}
	if s.next.IsZero() || t.Before(s.next) {
		s.next = t
	}
}

func (s *session) requeue() time.Duration {
	if s.next.IsZero() {
		return kclock.Resync(s.r.Resync)
	}
	d := s.next.Sub(kclock.Now(s.r.Now))
	// A little after the deadline, so that it has passed by then.
	return min(max(d+50*time.Millisecond, 50*time.Millisecond), kclock.Resync(s.r.Resync))
}

// outcome sets the phase and Ready condition for the error run returned
// (cause) and returns the reconcile's result with the error still to
// report. A requester that waits for a watch or a spec edit (something
// not found or not ready, or a Failed phase) is looked at again at the
// resync, without an error.
func (s *session) outcome(cause error) (reconcile.Result, error) {
	result := reconcile.Result{RequeueAfter: s.requeue()}
	var ce *conditions.Error
	switch {
	case cause == nil:
	case errors.As(cause, &ce):
		s.st.Phase = marketv1alpha1.PhasePending
		if ce.Reason == marketv1alpha1.ReasonInvalidSpec || ce.Reason == marketv1alpha1.ReasonInvalidRecord {
			s.st.Phase = marketv1alpha1.PhaseFailed
		}
		if s.deleting {
			s.st.Phase = marketv1alpha1.PhaseDeleting
		}
		conditions.SetReady(&s.st.Conditions, s.mr.Generation, metav1.ConditionFalse, ce.Reason, ce.Message)
		if ce.Reason == marketv1alpha1.ReasonNotFound || ce.Reason == marketv1alpha1.ReasonNotReady || s.st.Phase == marketv1alpha1.PhaseFailed {
			// A watch or a spec edit brings the requester back; look again
			// at the resync, no retry storm.
			cause, result = nil, reconcile.Result{RequeueAfter: kclock.Resync(s.r.Resync)}
		}
	default:
		conditions.SetReady(&s.st.Conditions, s.mr.Generation, metav1.ConditionFalse, "Error", cause.Error())
	}
	return result, cause
}

// removeFinalizer lets a deleting requester that holds nothing any more
// go: it removes the mounts of its contracts, then its finalizer, and
// forgets it. A conflict is tried again a second later.
func (s *session) removeFinalizer() (reconcile.Result, error) {
	if err := s.sweepMounts(); err != nil {
		return reconcile.Result{}, err
	}
	if err := ssa.RemoveFinalizer(s.ctx, s.c, s.mr, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	market.Forget(s.r.Market, s.r.Inventories, s.req)
	return reconcile.Result{}, nil
}

// run does everything the requester needs and reports the outcome in
// s.st.
func (s *session) run() error {
	mr := s.mr
	s.net = &marketv1alpha1.MarketNetwork{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Name: mr.Spec.NetworkRef.Name}, s.net); err != nil {
		if apierrors.IsNotFound(err) {
			return s.unreachable(conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketNetwork %s not found", mr.Spec.NetworkRef.Name))
		}
		return err
	}
	if err := network.Validate(&s.net.Spec); err != nil {
		err = conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s is not usable: %v", s.net.Name, err)
		if s.deleting {
			return s.letGo(err) // nothing to read the other side from
		}
		return err
	}
	id, repo, err := market.IdentityRepo(s.ctx, s.c, mr.Namespace, mr.Spec.IdentityRef.Name)
	if err != nil {
		return s.unreachable(err)
	}
	if id.Spec.NetworkRef.Name != s.net.Name && !s.deleting {
		return conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil, "MarketIdentity %s takes part in MarketNetwork %s, not %s", id.Name, id.Spec.NetworkRef.Name, s.net.Name)
	}
	s.id = id
	s.st.DID = id.Status.DID
	s.network = network.Name(s.net)
	s.owner = market.Owner(string(mr.UID))

	state, err := suspend.Effective(s.ctx, s.c, s.r.Scheme, mr)
	if err != nil {
		return err
	}
	suspend.SetCondition(&s.st.Conditions, state, mr.Generation)
	switch {
	case s.deleting:
		s.stop, s.release = "the MarketRequester is being deleted", deal.RequesterDeleted
	case state.Suspended:
		s.stop, s.release = "suspended by "+state.By, deal.ReleaseSuspended
	default:
		s.release = deal.ReplicasLowered
	}

	fl := market.Follower{Role: market.RoleRequester, DID: s.st.DID, Request: s.req, Operator: s.net.Spec.OperatorDID, Vouches: market.Approved(id, marketv1alpha1.RoleBidder)}
	if s.view, err = s.r.Market.Follow(fl, s.net.Spec.Firehoses); err != nil {
		return conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s: %v", s.net.Name, err)
	}
	if s.pub, err = market.Connect(s.ctx, s.r.Connect, s.r.Pool, s.c, s.lc, repo); err != nil {
		return err
	}
	s.repo = repo
	if s.inv, err = s.r.Inventories.Open(s.ctx, engage.Key(s.req), s.st.DID, s.owner, s.pub, lexicon.Request, lexicon.Accept, lexicon.Release); err != nil {
		return err
	}
	if err := s.loadObjects(); err != nil {
		return err
	}
	return s.trade()
}

// unreachable handles a requester that cannot reach its repo. A deleting
// one whose network, identity or repo is gone (or going: the identity
// then deletes every market record of its repo) lets go, with an Event if
// it held anything; one whose identity or repo is only not Ready yet waits
// (its records must be released and deleted). Others report err.
func (s *session) unreachable(err error) error {
	if !s.deleting || conditions.ReasonOf(err, "") != marketv1alpha1.ReasonNotFound {
		return err
	}
	return s.letGo(err)
}

// letGo lets a deleting requester go although its records could not be
// released (an Event says so when it held any). Its mounts go with it.
func (s *session) letGo(err error) error {
	if err := s.sweepMounts(); err != nil {
		return err
	}
	if len(s.mr.Status.Requests) > 0 {
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "RecordsLeft", "Delete",
			"the requester's repo or network is not usable (%v); its records could not be released or deleted", err)
	}
	s.done = true
	return nil
}

// dropSnapshotRecords deletes the records of the requester's snapshots
// in the provider's workspace, one by one (no deletecollection needed).
// A failure is logged and does not hold the requester back: a record
// left names a requester UID no other requester has, so it serves no
// snapshot any more.
func (s *session) dropSnapshotRecords() {
	if s.r.Mounts == nil || s.mr.UID == "" {
		return
	}
	var cms corev1.ConfigMapList
	err := s.r.Mounts.List(s.ctx, &cms, client.InNamespace(tenant.MarketNamespace), client.MatchingLabels{tenant.LabelMarketCluster: s.lc, labelRequester: string(s.mr.UID)})
	for i := range cms.Items {
		if err == nil {
			err = client.IgnoreNotFound(s.r.Mounts.Delete(s.ctx, &cms.Items[i]))
		}
	}
	if err != nil {
		log.FromContext(s.ctx).Error(err, "deleting the records of the requester's snapshots")
	}
}

// sweepMounts removes the mounts of every contract the requester holds
// (its contracts go with it; TenantClusters cannot be owned by them), and
// the records of its snapshots in the provider's workspace.
func (s *session) sweepMounts() error {
	s.dropSnapshotRecords()
	var ccs marketv1alpha1.ComputeContractList
	if err := s.c.List(s.ctx, &ccs, client.InNamespace(s.mr.Namespace)); err != nil {
		return err
	}
	for i := range ccs.Items {
		if cc := &ccs.Items[i]; metav1.IsControlledBy(cc, s.mr) {
			if err := s.undeliver(cc); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadObjects reads the Bids and ComputeContracts the requester owns.
func (s *session) loadObjects() error {
	s.bids, s.contracts = map[string]*marketv1alpha1.Bid{}, map[string]*marketv1alpha1.ComputeContract{}
	var bids marketv1alpha1.BidList
	if err := s.c.List(s.ctx, &bids, client.InNamespace(s.mr.Namespace)); err != nil {
		return err
	}
	for i := range bids.Items {
		if b := &bids.Items[i]; metav1.IsControlledBy(b, s.mr) && b.Spec.Side == marketv1alpha1.SideRequester {
			s.bids[b.Name] = b
		}
	}
	var ccs marketv1alpha1.ComputeContractList
	if err := s.c.List(s.ctx, &ccs, client.InNamespace(s.mr.Namespace)); err != nil {
		return err
	}
	for i := range ccs.Items {
		if cc := &ccs.Items[i]; metav1.IsControlledBy(cc, s.mr) && cc.Spec.Side == marketv1alpha1.SideRequester {
			s.contracts[cc.Name] = cc
		}
	}
	return nil
}

// replicaRecords are one replica's own records.
type replicaRecords struct {
	index int32
	// attempts are the request records, by the time part of their key.
	attempts map[int64]*ownRecord
	// current is the newest request (its stamp).
	current *ownRecord
	stamp   int64
	// attempt counts the requests made (status.requests[].attempt).
	attempt int32
}

type ownRecord struct {
	uri, cid, rkey string
	request        *market.Request
}

// replicaRecords reads the requester's own request records by replica,
// with the replicas it wants (desired), those its status names and those
// a live contract holds.
func (s *session) replicaRecords(desired int32) map[int32]*replicaRecords {
	replicas := map[int32]*replicaRecords{}
	get := func(i int32) *replicaRecords {
		if replicas[i] == nil {
			replicas[i] = &replicaRecords{index: i, attempts: map[int64]*ownRecord{}}
		}
		return replicas[i]
	}
	for _, rec := range s.inv.List(lexicon.Request) {
		_, _, rkey := market.SplitURI(rec.URI)
		i, stamp, ok := market.ParseRequestKey(s.owner, rkey)
		if !ok {
			continue
		}
		var req market.Request
		if err := market.Decode(lexicon.Request, rec.Value, &req); err != nil {
			continue // not ours to trust; replaced by the next request
		}
		rr := get(i)
		rr.attempts[stamp] = &ownRecord{uri: rec.URI, cid: rec.CID, rkey: rkey, request: &req}
		if stamp > rr.stamp {
			rr.stamp, rr.current = stamp, rr.attempts[stamp]
		}
	}
	for i := range desired {
		get(i)
	}
	for _, rs := range s.st.Requests {
		rr := get(rs.Index)
		rr.attempt = max(rr.attempt, rs.Attempt)
	}
	for _, cc := range s.contracts {
		if deal.LiveContract(cc) {
			get(cc.Spec.ReplicaIndex)
		}
	}
	return replicas
}

// trade runs every replica's deal and summarises them in s.st.
func (s *session) trade() error {
	desired := s.mr.Spec.Replicas
	if s.stop != "" {
		desired = 0
	}
	replicas := s.replicaRecords(desired)
	var errs []error
	type result struct {
		rs   marketv1alpha1.RequestStatus
		keep bool
	}
	var results []result
	var buying []*deal.Replica
	for _, i := range sortedKeys(replicas) {
		rs, keep, buy, err := s.replica(replicas[i], i < desired)
		if err != nil {
			errs = append(errs, fmt.Errorf("replica %d: %w", i, err))
		}
		if buy != nil {
			buying = append(buying, buy)
		}
		results = append(results, result{rs, keep})
	}
	// The replicas that need a VM: their rounds are decided together.
	if len(buying) > 0 {
		bought, err := s.buy(buying, replicas)
		if err != nil {
			errs = append(errs, err)
		}
		for i := range results {
			if rs, ok := bought[results[i].rs.Index]; ok {
				results[i].rs = rs
			}
		}
	}
	var out []marketv1alpha1.RequestStatus
	for _, r := range results {
		if r.keep {
			out = append(out, r.rs)
		}
	}
	if err := s.prune(); err != nil {
		errs = append(errs, err)
	}
	s.st.Requests = out
	s.st.IgnoredRecords = int64(len(s.ignored))
	s.summarise(desired)
	if s.deleting && len(out) == 0 && len(errs) == 0 {
		s.done = true
	}
	return errors.Join(errs...)
}

func sortedKeys[V any](m map[int32]V) []int32 {
	keys := make([]int32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// summarise sets the phase, counters and Ready condition.
func (s *session) summarise(desired int32) {
	st, gen := s.st, s.mr.Generation
	st.Contracted = 0
	counts := map[marketv1alpha1.RequestState]int{}
	var noBids, reading bool
	for _, rs := range st.Requests {
		counts[rs.State]++
		if rs.State == marketv1alpha1.RequestContracted {
			st.Contracted++
		}
		if rs.State == marketv1alpha1.RequestOpen && rs.NextAttempt != nil {
			noBids = true
		}
		if rs.Message == market.ErrIncomplete.Error() {
			reading = true
		}
	}
	provisioning := s.provisioning()
	switch {
	case s.deleting:
		st.Phase = marketv1alpha1.PhaseDeleting
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionFalse, marketv1alpha1.ReasonReleasing, fmt.Sprintf("being deleted: %d replica(s) to release", len(st.Requests)))
	case s.stop != "":
		st.Phase = marketv1alpha1.PhaseSuspended
		msg := s.stop + ": no new requests"
		if n := len(st.Requests); n > 0 {
			msg += fmt.Sprintf("; %d replica(s) being released", n)
		}
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionTrue, marketv1alpha1.ReasonSuspended, msg)
	case st.Contracted >= desired && counts[marketv1alpha1.RequestReleasing] == 0:
		st.Phase = marketv1alpha1.PhaseReady
		msg := fmt.Sprintf("%d of %d replica(s) contracted", st.Contracted, desired)
		if provisioning > 0 {
			msg += fmt.Sprintf("; %d VM(s) not running yet", provisioning)
		}
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionTrue, marketv1alpha1.ReasonContracted, msg)
	default:
		st.Phase = marketv1alpha1.PhasePending
		reason := s.pendingReason(desired, counts, reading, noBids)
		msg := fmt.Sprintf("%d of %d replica(s) contracted", st.Contracted, desired)
		for _, rs := range st.Requests {
			if rs.State != marketv1alpha1.RequestContracted && rs.Message != "" {
				msg += fmt.Sprintf("; replica %d: %s", rs.Index, rs.Message)
				break
			}
		}
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionFalse, reason, msg)
	}
}

// provisioning counts the live contracts whose VM is not running yet (not
// Active).
func (s *session) provisioning() int {
	n := 0
	for _, cc := range s.contracts {
		if deal.LiveContract(cc) && cc.Status.Phase != marketv1alpha1.ContractActive {
			n++
		}
	}
	return n
}

// pendingReason is the Ready reason of a Pending requester, from its
// requests counted by state: reading the market, releasing replicas it no
// longer needs, accepting a bid, without bids, or else bidding.
func (s *session) pendingReason(desired int32, counts map[marketv1alpha1.RequestState]int, reading, noBids bool) string {
	switch {
	case reading:
		return marketv1alpha1.ReasonReadingMarket
	case counts[marketv1alpha1.RequestReleasing] > 0 && s.st.Contracted >= desired:
		return marketv1alpha1.ReasonReleasing
	case counts[marketv1alpha1.RequestAccepted] > 0:
		return marketv1alpha1.ReasonAccepting
	case noBids:
		return marketv1alpha1.ReasonNoBids
	}
	return marketv1alpha1.ReasonBidding
}

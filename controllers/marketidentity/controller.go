// Package marketidentity reconciles MarketIdentities: it publishes one
// dev.knotless.market.association record per approved association in the
// identity's repo (and deletes the ones no longer approved), and reads the
// network operator's association records from the network's firehoses to
// report whether the identity is vouched for. Everything in status is
// rebuilt from spec and from records after a restart (seed defect D21). It
// is the only status writer of MarketIdentity (field manager FieldManager)
// and never writes spec.
package marketidentity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/network"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "marketidentity"
	// FieldManager owns MarketIdentity status and finalizer.
	FieldManager = "knotless-marketidentity"
	// Finalizer deletes the identity's association records before it goes.
	Finalizer = "market.knotless.dev/associations"

	byRepo    = "market.knotless.dev/identity-repo"
	byNetwork = "market.knotless.dev/identity-network"
	// maxAssociations bounds the association records of one repo that
	// knotless lists (an operator's, or an identity's own).
	maxAssociations = 10000
)

// Reconciler reconciles MarketIdentities in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	Hub        *firehose.Hub
	// Poll is how often a followed identity's vouchers are read from the
	// operator's feeds (default 3s; reading is skipped while a feed has
	// not changed).
	Poll time.Duration
	// Resync is how often the association records are read back from the
	// PDS (default 2m).
	Resync time.Duration
	// Invalid counts association records from firehoses that did not
	// match their lexicon (may be nil).
	Invalid prometheus.Counter
	// Connect returns the Publisher of a repo (default market.Client with
	// Pool); tests replace it.
	Connect market.Connector

	mu sync.Mutex
	// published is when each identity (by key) last published its
	// associations, for its uid.
	published map[string]publishedAt
	// feeds are the operator's association records on one source, shared
	// by every identity that follows that operator there (by source|DID).
	feeds map[string]*feed
	// following lists the feeds each identity (by key) uses.
	following map[string][]string
}

type publishedAt struct {
	uid  types.UID
	gen  int64
	time time.Time
}

// SetupWithManager registers the controller and its indexes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketIdentity{}, byRepo, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketIdentity).Spec.RepoRef.Name}
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketIdentity{}, byNetwork, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketIdentity).Spec.NetworkRef.Name}
	}); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketIdentity{}, predicates.SpecOrLifecycleChanged()).
		// An identity that lost its repo to an older one gets it when that
		// one goes.
		Watches(&marketv1alpha1.MarketIdentity{}, mapping.ByIndex(func() client.ObjectList { return &marketv1alpha1.MarketIdentityList{} }, byRepo,
			func(o client.Object) string { return o.(*marketv1alpha1.MarketIdentity).Spec.RepoRef.Name }), predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false }, UpdateFunc: func(event.UpdateEvent) bool { return false },
		}).
		Watches(&atprotov1alpha1.AtprotoRepo{}, mapping.ByIndex(func() client.ObjectList { return &marketv1alpha1.MarketIdentityList{} }, byRepo, client.Object.GetName)).
		Watches(&marketv1alpha1.MarketNetwork{}, enqueueByNetwork()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter:           workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout: time.Minute,
		}).
		Complete(r)
}

func enqueueByNetwork() mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return mapping.ByClusterIndex(func() client.ObjectList { return &marketv1alpha1.MarketIdentityList{} }, byNetwork, client.Object.GetName)
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		if errors.Is(err, multicluster.ErrClusterNotFound) {
			r.drop(engage.Key(req)) // the workspace is no longer engaged
		}
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	c := cl.GetClient()
	id := &marketv1alpha1.MarketIdentity{}
	if err := c.Get(ctx, req.NamespacedName, id); err != nil {
		if apierrors.IsNotFound(err) {
			r.drop(engage.Key(req))
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !id.DeletionTimestamp.IsZero() {
		r.drop(engage.Key(req))
		return r.finalize(ctx, cl, string(req.ClusterName), id)
	}
	if !controllerutil.ContainsFinalizer(id, Finalizer) {
		if err := ssa.Metadata(ctx, c, id, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}

	st := id.Status.DeepCopy()
	st.ObservedGeneration = id.Generation
	resync := clock.Resync(r.Resync)
	result, cause := r.sync(ctx, c, string(req.ClusterName), engage.Key(req), id, st)
	var ce *conditions.Error
	switch {
	case cause == nil:
	case errors.As(cause, &ce):
		st.Phase = marketv1alpha1.PhasePending
		if ce.Reason == marketv1alpha1.ReasonInvalidSpec || ce.Reason == marketv1alpha1.ReasonInvalidRecord || ce.Reason == marketv1alpha1.ReasonPDSNotInNetwork {
			st.Phase = marketv1alpha1.PhaseFailed
		}
		r.notReady(engage.Key(req), id, st, ce.Reason, ce.Message)
		if ce.Reason == marketv1alpha1.ReasonNotFound || ce.Reason == marketv1alpha1.ReasonNotReady || st.Phase == marketv1alpha1.PhaseFailed {
			// Waiting for a reference (its watch brings the identity back)
			// or for a spec edit: look again at the resync, no retry storm.
			cause, result = nil, reconcile.Result{RequeueAfter: resync}
		}
	default:
		st.Phase = marketv1alpha1.PhasePending
		r.notReady(engage.Key(req), id, st, "Error", cause.Error())
	}
	if err := ssa.WriteStatus(ctx, c, id, &id.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Replace:  true,
		Event:    ssa.ConditionChanged(id.Status.Conditions, st.Conditions, marketv1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name),
		Action:   "Publish",
	}); err != nil {
		return reconcile.Result{}, err
	}
	if cause != nil {
		return reconcile.Result{}, cause
	}
	return result, nil
}

// notReady sets every condition of an identity that could not be
// reconciled to the reason, and stops following its operator: nothing in
// status claims what was not checked.
func (r *Reconciler) notReady(k string, id *marketv1alpha1.MarketIdentity, st *marketv1alpha1.MarketIdentityStatus, reason, msg string) {
	r.unfollow(k, nil)
	st.VouchedBy, st.InvalidRecords = nil, 0
	for _, typ := range []string{marketv1alpha1.ConditionReady, marketv1alpha1.ConditionPublished, marketv1alpha1.ConditionVouched} {
		conditions.Set(&st.Conditions, typ, id.Generation, metav1.ConditionFalse, reason, msg)
	}
}

// sync resolves the identity's network and repo, publishes its
// associations and reads its vouchers into st.
func (r *Reconciler) sync(ctx context.Context, c client.Client, lc, k string, id *marketv1alpha1.MarketIdentity, st *marketv1alpha1.MarketIdentityStatus) (reconcile.Result, error) {
	net := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, client.ObjectKey{Name: id.Spec.NetworkRef.Name}, net); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketNetwork %s not found", id.Spec.NetworkRef.Name)
		}
		return reconcile.Result{}, err
	}
	if err := network.Validate(&net.Spec); err != nil {
		return reconcile.Result{}, conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s is not usable: %v", net.Name, err)
	}
	repo, err := market.Repo(ctx, c, id)
	if err != nil {
		return reconcile.Result{}, err
	}
	if other, err := r.owner(ctx, c, id, repo); err != nil {
		return reconcile.Result{}, err
	} else if other != "" {
		return reconcile.Result{}, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil,
			"the account of AtprotoRepo %s is already the identity of MarketIdentity %s; one account is one identity", repo.Name, other)
	}
	if err := onNetworkPDS(net, repo); err != nil {
		return reconcile.Result{}, err
	}
	st.DID = repo.Status.DID

	resync := clock.Resync(r.Resync)
	r.mu.Lock()
	last := r.published[k]
	r.mu.Unlock()
	if last.uid != id.UID || last.gen != id.Generation || time.Since(last.time) > resync ||
		!meta.IsStatusConditionTrue(id.Status.Conditions, marketv1alpha1.ConditionPublished) {
		pc, err := market.Connect(ctx, r.Connect, r.Pool, c, lc, repo)
		if err != nil {
			return reconcile.Result{}, err
		}
		published, err := publish(ctx, pc, id)
		if err != nil {
			return reconcile.Result{}, err
		}
		st.Associations = published
		r.mu.Lock()
		if r.published == nil {
			r.published = map[string]publishedAt{}
		}
		r.published[k] = publishedAt{uid: id.UID, gen: id.Generation, time: time.Now()}
		r.mu.Unlock()
	}
	st.Phase = marketv1alpha1.PhaseReady
	conditions.Set(&st.Conditions, marketv1alpha1.ConditionPublished, id.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonPublished,
		fmt.Sprintf("%d association record(s) published", len(st.Associations)))
	conditions.SetReady(&st.Conditions, id.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonReady, "participant "+st.DID)
	if r.vouch(k, id, net, st) {
		return reconcile.Result{RequeueAfter: cmp.Or(r.Poll, 3*time.Second)}, nil
	}
	return reconcile.Result{RequeueAfter: resync}, nil
}

// owner returns the name of an older identity of the namespace whose
// account is repo's (named by the same repo, or holding the same DID), or
// "" when id is the account's identity. Two identities of one account
// would delete each other's association records.
func (r *Reconciler) owner(ctx context.Context, c client.Client, id *marketv1alpha1.MarketIdentity, repo *atprotov1alpha1.AtprotoRepo) (string, error) {
	var list marketv1alpha1.MarketIdentityList
	if err := c.List(ctx, &list, client.InNamespace(id.Namespace)); err != nil {
		return "", err
	}
	for i := range list.Items {
		o := &list.Items[i]
		same := o.Spec.RepoRef.Name == id.Spec.RepoRef.Name || (o.Status.DID != "" && o.Status.DID == repo.Status.DID)
		if o.UID == id.UID || !same {
			continue
		}
		if o.CreationTimestamp.Before(&id.CreationTimestamp) || (o.CreationTimestamp.Equal(&id.CreationTimestamp) && o.Name < id.Name) {
			return o.Name, nil
		}
	}
	return "", nil
}

// onNetworkPDS refuses a repo whose PDS the network does not list.
func onNetworkPDS(net *marketv1alpha1.MarketNetwork, repo *atprotov1alpha1.AtprotoRepo) error {
	if len(net.Spec.PDSHosts) == 0 {
		return nil
	}
	host, err := network.NormalizeHost(repo.Spec.PDS.URL)
	if err != nil {
		return conditions.Errorf(marketv1alpha1.ReasonPDSNotInNetwork, err, "AtprotoRepo %s: %v", repo.Name, err)
	}
	for _, h := range net.Spec.PDSHosts {
		if n, _ := network.NormalizeHost(h); n == host {
			return nil
		}
	}
	return conditions.Errorf(marketv1alpha1.ReasonPDSNotInNetwork, nil, "AtprotoRepo %s is on a PDS that MarketNetwork %s does not list in spec.pdsHosts", repo.Name, net.Name)
}

// publish makes the repo's association records equal the spec: one per
// approved association (rkey: its DID), none other (the association
// collection of an identity's repo is the identity's). Writes of one repo
// that overlap are one applyWrites batch.
func publish(ctx context.Context, pc market.Publisher, id *marketv1alpha1.MarketIdentity) ([]marketv1alpha1.PublishedRecord, error) {
	createdAt := id.CreationTimestamp.UTC().Format(time.RFC3339)
	want := map[string]bool{}
	for i, a := range id.Spec.ApprovedAssociations {
		if _, err := syntax.ParseDID(a.DID); err != nil {
			return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, err, "spec.approvedAssociations[%d].did: %v", i, err)
		}
		if _, err := syntax.ParseRecordKey(a.DID); err != nil {
			return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, err, "spec.approvedAssociations[%d].did: %s cannot name a record (characters outside A-Za-z0-9._:~-, or longer than 512)", i, a.DID)
		}
		want[a.DID] = true
	}
	existing, err := pc.ListRecords(ctx, lexicon.Association, maxAssociations)
	if err != nil {
		return nil, err
	}
	out := make([]marketv1alpha1.PublishedRecord, len(id.Spec.ApprovedAssociations))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i, a := range id.Spec.ApprovedAssociations {
		g.Go(func() error {
			roles := make([]string, len(a.Roles))
			for j, role := range a.Roles {
				roles[j] = string(role)
			}
			slices.Sort(roles)
			res, err := pc.Publish(gctx, lexicon.Association, a.DID, market.Association{Type: lexicon.Association, Subject: a.DID, Roles: roles, CreatedAt: createdAt})
			if err != nil {
				return err
			}
			out[i] = marketv1alpha1.PublishedRecord{URI: res.After.URI, CID: res.After.CID, Rev: res.Rev}
			return nil
		})
	}
	for _, rkey := range rkeys(existing) {
		if !want[rkey] {
			g.Go(func() error { _, err := pc.Publish(gctx, lexicon.Association, rkey, nil); return err })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b marketv1alpha1.PublishedRecord) int { return cmp.Compare(a.URI, b.URI) })
	return out, nil
}

// rkeys returns the record keys of records, skipping any that is not a
// valid record key (it could not be deleted by key anyway).
func rkeys(records []pds.Record) []string {
	var out []string
	for _, rec := range records {
		rkey := rec.URI[strings.LastIndex(rec.URI, "/")+1:]
		if _, err := syntax.ParseRecordKey(rkey); err == nil {
			out = append(out, rkey)
		}
	}
	return out
}

// finalize deletes the records knotless wrote for the identity in its
// repo (its associations and the presences of the bidders that publish as
// it), then lets it go. An identity that is not its account's (an older
// one is) deletes nothing. Without its repo the records cannot be
// deleted: the identity goes and a Warning Event says so.
func (r *Reconciler) finalize(ctx context.Context, cl cluster.Cluster, lc string, id *marketv1alpha1.MarketIdentity) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(id, Finalizer) {
		return reconcile.Result{}, nil
	}
	c := cl.GetClient()
	repo, err := market.Repo(ctx, c, id)
	var ce *conditions.Error
	switch {
	case err == nil:
		other, err := r.owner(ctx, c, id, repo)
		if err != nil {
			return reconcile.Result{}, err
		}
		if other == "" {
			if err := r.deleteRecords(ctx, c, lc, id, repo); err != nil {
				return reconcile.Result{}, r.deleting(ctx, cl, id, err)
			}
		}
	case errors.As(err, &ce) && ce.Reason == marketv1alpha1.ReasonNotReady && id.Status.DID == "" && neverConnected(ctx, c, id):
		// Nothing was published through a repo that never logged in (a
		// wrong credential must not keep a workspace from going).
	case errors.As(err, &ce) && ce.Reason == marketv1alpha1.ReasonNotFound:
		if len(id.Status.Associations) > 0 {
			cl.GetEventRecorder(Name).Eventf(id, nil, corev1.EventTypeWarning, "RecordsLeft", "Delete",
				"AtprotoRepo %s is gone; the identity's association records could not be deleted", id.Spec.RepoRef.Name)
		}
	default:
		return reconcile.Result{}, r.deleting(ctx, cl, id, err)
	}
	if err := ssa.RemoveFinalizer(ctx, c, id, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}

// neverConnected reports whether the identity's AtprotoRepo never logged
// in (it has no DID).
func neverConnected(ctx context.Context, c client.Client, id *marketv1alpha1.MarketIdentity) bool {
	repo := &atprotov1alpha1.AtprotoRepo{}
	return c.Get(ctx, client.ObjectKey{Namespace: id.Namespace, Name: id.Spec.RepoRef.Name}, repo) == nil && repo.Status.DID == ""
}

// deleteRecords deletes the identity's association records, the presence
// records of the MarketPresences that name it and the records of every
// deal made in its repo.
func (r *Reconciler) deleteRecords(ctx context.Context, c client.Client, lc string, id *marketv1alpha1.MarketIdentity, repo *atprotov1alpha1.AtprotoRepo) error {
	pc, err := market.Connect(ctx, r.Connect, r.Pool, c, lc, repo)
	if err != nil {
		return err
	}
	existing, err := pc.ListRecords(ctx, lexicon.Association, maxAssociations)
	if err != nil {
		return err
	}
	var presences marketv1alpha1.MarketPresenceList
	if err := c.List(ctx, &presences, client.InNamespace(id.Namespace)); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, rkey := range rkeys(existing) {
		g.Go(func() error { _, err := pc.Publish(gctx, lexicon.Association, rkey, nil); return err })
	}
	for _, p := range presences.Items {
		if p.Spec.IdentityRef.Name == id.Name {
			g.Go(func() error { _, err := pc.Publish(gctx, lexicon.Presence, p.Name, nil); return err })
		}
	}
	// The repo is the inventory of the deals its requesters and bidders
	// made: their records go with the identity (the other side of a deal
	// takes a missing record for its end), so nothing stays published
	// when a namespace or an account goes.
	for _, col := range []string{lexicon.Request, lexicon.Bid, lexicon.Accept, lexicon.Lease, lexicon.Release, lexicon.Reclaim} {
		recs, err := pc.ListRecords(ctx, col, maxAssociations)
		if err != nil {
			return err
		}
		for _, rkey := range rkeys(recs) {
			if market.Written(rkey) {
				g.Go(func() error { _, err := pc.Publish(gctx, col, rkey, nil); return err })
			}
		}
	}
	return g.Wait()
}

// deleting reports on a deleted identity that its records are not deleted
// yet, and returns err for the rate-limited retry.
func (r *Reconciler) deleting(ctx context.Context, cl cluster.Cluster, id *marketv1alpha1.MarketIdentity, err error) error {
	st := id.Status.DeepCopy()
	st.Phase = marketv1alpha1.PhaseDeleting
	conditions.SetReady(&st.Conditions, id.Generation, metav1.ConditionFalse, conditions.ReasonOf(err, "Error"),
		"deleting the identity's records: "+err.Error())
	if werr := ssa.WriteStatus(ctx, cl.GetClient(), id, &id.Status, st, ssa.StatusOptions{Manager: FieldManager, Replace: true}); werr != nil {
		return werr
	}
	return err
}

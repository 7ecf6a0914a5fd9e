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
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/marketnetwork"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
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
	// maxVouchers bounds the operator's association records one identity
	// keeps from a firehose.
	maxVouchers = 10000
)

// Reconciler reconciles MarketIdentities in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	Hub        *firehose.Hub
	// Poll is how often a followed identity's vouchers are read from its
	// subscriptions (default 3s).
	Poll time.Duration
	// Resync is how often the association records are read back from the
	// PDS (default 2m).
	Resync time.Duration
	// Invalid counts market records from firehoses that did not match
	// their lexicon, by collection (may be nil).
	Invalid *prometheus.CounterVec
	// Connect returns the Publisher of a repo (default market.Client with
	// Pool); tests replace it.
	Connect func(ctx context.Context, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (market.Publisher, error)

	mu      sync.Mutex
	follows map[string]*follow
}

// follow is one identity's subscriptions to its network's firehoses and
// when its associations were last published.
type follow struct {
	uid        types.UID
	generation int64
	network    string // what the subscriptions were made for
	subs       []*firehose.Subscription
	published  time.Time
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

func (r *Reconciler) connect(ctx context.Context, c client.Client, lc string, repo *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
	if r.Connect != nil {
		return r.Connect(ctx, c, lc, repo)
	}
	return market.Client(ctx, r.Pool, c, lc, repo)
}

func key(req mcreconcile.Request) string {
	return string(req.ClusterName) + "|" + req.Namespace + "/" + req.Name
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	c := cl.GetClient()
	id := &marketv1alpha1.MarketIdentity{}
	if err := c.Get(ctx, req.NamespacedName, id); err != nil {
		r.drop(key(req))
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !id.DeletionTimestamp.IsZero() {
		r.drop(key(req))
		return r.finalize(ctx, c, string(req.ClusterName), id)
	}
	if !controllerutil.ContainsFinalizer(id, Finalizer) {
		if err := ssa.Metadata(ctx, c, id, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}

	st := id.Status.DeepCopy()
	st.ObservedGeneration = id.Generation
	result, cause := r.sync(ctx, c, string(req.ClusterName), key(req), id, st)
	var ce *conditions.Error
	switch {
	case cause == nil:
	case errors.As(cause, &ce):
		st.Phase = marketv1alpha1.PhasePending
		if ce.Reason == marketv1alpha1.ReasonInvalidSpec || ce.Reason == marketv1alpha1.ReasonInvalidRecord || ce.Reason == marketv1alpha1.ReasonPDSNotInNetwork {
			st.Phase = marketv1alpha1.PhaseFailed
		}
		setCondition(st, id.Generation, marketv1alpha1.ConditionReady, metav1.ConditionFalse, ce.Reason, ce.Message)
		if ce.Reason != marketv1alpha1.ReasonNotFound && ce.Reason != marketv1alpha1.ReasonNotReady && st.Phase != marketv1alpha1.PhaseFailed {
			result = reconcile.Result{}
		} else {
			// Waiting for a reference (its watch brings the identity back)
			// or for a spec edit: no retry storm.
			cause = nil
		}
	default:
		setCondition(st, id.Generation, marketv1alpha1.ConditionReady, metav1.ConditionFalse, "Error", cause.Error())
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
	return result, cause
}

// sync resolves the identity's network and repo, publishes its
// associations and reads its vouchers into st.
func (r *Reconciler) sync(ctx context.Context, c client.Client, lc, k string, id *marketv1alpha1.MarketIdentity, st *marketv1alpha1.MarketIdentityStatus) (reconcile.Result, error) {
	if err := r.exclusive(ctx, c, id); err != nil {
		return reconcile.Result{}, err
	}
	net := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, client.ObjectKey{Name: id.Spec.NetworkRef.Name}, net); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketNetwork %s not found", id.Spec.NetworkRef.Name)
		}
		return reconcile.Result{}, err
	}
	if err := marketnetwork.Validate(&net.Spec); err != nil {
		return reconcile.Result{}, conditions.Errorf(marketv1alpha1.ReasonNotReady, err, "MarketNetwork %s is not usable: %v", net.Name, err)
	}
	repo, err := market.Repo(ctx, c, id)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := onNetworkPDS(net, repo); err != nil {
		return reconcile.Result{}, err
	}
	st.DID = repo.Status.DID

	f := r.follow(k, id, net)
	if st.ObservedGeneration != id.Status.ObservedGeneration || f.published.IsZero() || time.Since(f.published) > cmp.Or(r.Resync, 2*time.Minute) ||
		!meta.IsStatusConditionTrue(id.Status.Conditions, marketv1alpha1.ConditionReady) {
		pc, err := r.connect(ctx, c, lc, repo)
		if err != nil {
			return reconcile.Result{}, err
		}
		published, err := publish(ctx, pc, id)
		if err != nil {
			return reconcile.Result{}, err
		}
		st.Associations = published
		r.mu.Lock()
		f.published = time.Now()
		r.mu.Unlock()
	}
	st.Phase = marketv1alpha1.PhaseReady
	setCondition(st, id.Generation, marketv1alpha1.ConditionPublished, metav1.ConditionTrue, marketv1alpha1.ReasonPublished,
		fmt.Sprintf("%d association record(s) published", len(st.Associations)))
	setCondition(st, id.Generation, marketv1alpha1.ConditionReady, metav1.ConditionTrue, marketv1alpha1.ReasonReady, "participant "+st.DID)
	r.vouch(id, net, f, st)
	if len(f.subs) > 0 {
		return reconcile.Result{RequeueAfter: cmp.Or(r.Poll, 3*time.Second)}, nil
	}
	return reconcile.Result{RequeueAfter: cmp.Or(r.Resync, 2*time.Minute)}, nil
}

// exclusive refuses an identity whose repo is already the repo of an
// older identity in the namespace: two identities would delete each
// other's association records.
func (r *Reconciler) exclusive(ctx context.Context, c client.Client, id *marketv1alpha1.MarketIdentity) error {
	var list marketv1alpha1.MarketIdentityList
	if err := c.List(ctx, &list, client.InNamespace(id.Namespace), client.MatchingFields{byRepo: id.Spec.RepoRef.Name}); err != nil {
		return err
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID == id.UID {
			continue
		}
		if o.CreationTimestamp.Before(&id.CreationTimestamp) || (o.CreationTimestamp.Equal(&id.CreationTimestamp) && o.Name < id.Name) {
			return conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, nil, "AtprotoRepo %s is already the repo of MarketIdentity %s; one repo is one identity", id.Spec.RepoRef.Name, o.Name)
		}
	}
	return nil
}

// onNetworkPDS refuses a repo whose PDS the network does not list.
func onNetworkPDS(net *marketv1alpha1.MarketNetwork, repo *atprotov1alpha1.AtprotoRepo) error {
	if len(net.Spec.PDSHosts) == 0 {
		return nil
	}
	host, err := marketnetwork.NormalizeHost(repo.Spec.PDS.URL)
	if err != nil {
		return conditions.Errorf(marketv1alpha1.ReasonPDSNotInNetwork, err, "AtprotoRepo %s: %v", repo.Name, err)
	}
	for _, h := range net.Spec.PDSHosts {
		if n, _ := marketnetwork.NormalizeHost(h); n == host {
			return nil
		}
	}
	return conditions.Errorf(marketv1alpha1.ReasonPDSNotInNetwork, nil, "AtprotoRepo %s is on a PDS that MarketNetwork %s does not list in spec.pdsHosts", repo.Name, net.Name)
}

// publish makes the repo's association records equal the spec: one per
// approved association (rkey: its DID), none other. Writes of one repo
// that overlap are one applyWrites batch.
func publish(ctx context.Context, pc market.Publisher, id *marketv1alpha1.MarketIdentity) ([]marketv1alpha1.PublishedRecord, error) {
	createdAt := id.CreationTimestamp.UTC().Format(time.RFC3339)
	want := map[string]bool{}
	for i, a := range id.Spec.ApprovedAssociations {
		if _, err := syntax.ParseDID(a.DID); err != nil {
			return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, err, "spec.approvedAssociations[%d].did: %v", i, err)
		}
		if _, err := syntax.ParseRecordKey(a.DID); err != nil {
			return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidSpec, err, "spec.approvedAssociations[%d].did: %s cannot name a record (characters outside A-Za-z0-9._:~-)", i, a.DID)
		}
		want[a.DID] = true
	}
	existing, err := pc.ListRecords(ctx, lexicon.Association, 10000)
	if err != nil {
		return nil, repoconn.Classify(err)
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
	for _, rec := range existing {
		rkey := rec.URI[strings.LastIndex(rec.URI, "/")+1:]
		if want[rkey] {
			continue
		}
		g.Go(func() error {
			_, err := pc.Publish(gctx, lexicon.Association, rkey, nil)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b marketv1alpha1.PublishedRecord) int { return cmp.Compare(a.URI, b.URI) })
	return out, nil
}

// follow returns the identity's subscriptions, made again when the
// identity or its network's firehoses or operator changed.
func (r *Reconciler) follow(k string, id *marketv1alpha1.MarketIdentity, net *marketv1alpha1.MarketNetwork) *follow {
	sig := net.Spec.OperatorDID + "|" + strings.Join(net.Spec.Firehoses, ",")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.follows == nil {
		r.follows = map[string]*follow{}
	}
	f := r.follows[k]
	if f != nil && f.uid == id.UID && f.network == sig {
		f.generation = id.Generation
		return f
	}
	if f != nil {
		r.unsubscribe(f)
	}
	f = &follow{uid: id.UID, generation: id.Generation, network: sig}
	if net.Spec.OperatorDID != "" && r.Hub != nil {
		for _, src := range net.Spec.Firehoses {
			sub, err := r.Hub.Subscribe(src, firehose.Filter{Collections: []string{lexicon.Association}, DIDs: []string{net.Spec.OperatorDID}, Check: r.check}, maxVouchers, firehose.State{})
			if err == nil { // the network's Validate already checked every source
				f.subs = append(f.subs, sub)
			}
		}
	}
	r.follows[k] = f
	return f
}

func (r *Reconciler) unsubscribe(f *follow) {
	for _, s := range f.subs {
		r.Hub.Unsubscribe(s)
	}
	f.subs = nil
}

func (r *Reconciler) drop(k string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.follows[k]; f != nil {
		r.unsubscribe(f)
		delete(r.follows, k)
	}
}

// vouch sets st.VouchedBy, st.InvalidRecords and the Vouched condition
// from the operator's association records the subscriptions hold.
func (r *Reconciler) vouch(id *marketv1alpha1.MarketIdentity, net *marketv1alpha1.MarketNetwork, f *follow, st *marketv1alpha1.MarketIdentityStatus) {
	op := net.Spec.OperatorDID
	switch op {
	case "":
		st.VouchedBy, st.InvalidRecords = nil, 0
		setCondition(st, id.Generation, marketv1alpha1.ConditionVouched, metav1.ConditionFalse, marketv1alpha1.ReasonNoOperator, "MarketNetwork "+net.Name+" names no operator")
		return
	case st.DID:
		st.VouchedBy, st.InvalidRecords = nil, 0
		setCondition(st, id.Generation, marketv1alpha1.ConditionVouched, metav1.ConditionTrue, marketv1alpha1.ReasonVouched, "this identity is the network's operator")
		return
	}
	vouchers := map[string]marketv1alpha1.Voucher{}
	var invalid int64
	connected := false
	for _, sub := range f.subs {
		state, health, _ := sub.Snapshot()
		connected = connected || health.Connected
		invalid += state.Invalid
		for _, rec := range state.Records {
			// Every record here passed check (the association lexicon).
			a, err := market.DecodeAssociation(rec.Value)
			if err != nil || rec.DID() != op || a.Subject != st.DID {
				continue
			}
			roles := make([]marketv1alpha1.Role, len(a.Roles))
			for i, role := range a.Roles {
				roles[i] = marketv1alpha1.Role(role)
			}
			vouchers[rec.URI] = marketv1alpha1.Voucher{DID: op, Roles: roles, URI: rec.URI, CID: rec.CID}
		}
	}
	st.VouchedBy = nil
	for _, v := range vouchers {
		st.VouchedBy = append(st.VouchedBy, v)
	}
	slices.SortFunc(st.VouchedBy, func(a, b marketv1alpha1.Voucher) int { return cmp.Compare(a.URI, b.URI) })
	st.InvalidRecords = invalid
	switch {
	case len(st.VouchedBy) > 0:
		setCondition(st, id.Generation, marketv1alpha1.ConditionVouched, metav1.ConditionTrue, marketv1alpha1.ReasonVouched, "vouched for by the operator "+op)
	case !connected:
		setCondition(st, id.Generation, marketv1alpha1.ConditionVouched, metav1.ConditionFalse, marketv1alpha1.ReasonConnecting, "connecting to the network's firehoses")
	default:
		setCondition(st, id.Generation, marketv1alpha1.ConditionVouched, metav1.ConditionFalse, marketv1alpha1.ReasonNotVouched, "no association record of the operator "+op+" names this identity")
	}
}

// check validates a record from a firehose against the association
// lexicon before the subscription keeps it; an invalid one is counted and
// ignored.
func (r *Reconciler) check(collection string, value json.RawMessage) error {
	_, err := market.DecodeAssociation(value)
	if err != nil && r.Invalid != nil {
		r.Invalid.WithLabelValues(collection).Inc()
	}
	return err
}

// finalize deletes the association records the identity published, then
// lets it go. Without its repo the records cannot be deleted: the
// identity goes and an Event says so.
func (r *Reconciler) finalize(ctx context.Context, c client.Client, lc string, id *marketv1alpha1.MarketIdentity) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(id, Finalizer) {
		return reconcile.Result{}, nil
	}
	repo, err := market.Repo(ctx, c, id)
	var ce *conditions.Error
	switch {
	case err == nil:
		pc, err := r.connect(ctx, c, lc, repo)
		if err != nil {
			return reconcile.Result{}, err
		}
		g, gctx := errgroup.WithContext(ctx)
		for _, a := range id.Spec.ApprovedAssociations {
			g.Go(func() error { _, err := pc.Publish(gctx, lexicon.Association, a.DID, nil); return err })
		}
		if err := g.Wait(); err != nil {
			return reconcile.Result{}, err
		}
	case errors.As(err, &ce) && ce.Reason == marketv1alpha1.ReasonNotFound:
		// The repo is gone: nothing can delete its records any more.
	case errors.As(err, &ce):
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	default:
		return reconcile.Result{}, err
	}
	if err := ssa.RemoveFinalizer(ctx, c, id, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}

func setCondition(st *marketv1alpha1.MarketIdentityStatus, gen int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

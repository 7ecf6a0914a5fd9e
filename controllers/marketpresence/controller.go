// Package marketpresence publishes each MarketPresence as the bidder's
// dev.knotless.market.presence record (rkey: the presence's name) in the
// repo of its MarketIdentity, after checking it against the lexicon, and
// reports what the PDS returned when the record was read back (R01). The
// record's updatedAt changes only when its content does, so a restart
// publishes nothing again. It is the only status writer of MarketPresence
// (field manager FieldManager) and never writes spec.
package marketpresence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

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

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "marketpresence"
	// FieldManager owns MarketPresence status and finalizer.
	FieldManager = "knotless-marketpresence"
	// Finalizer deletes the presence record before the object goes.
	Finalizer = "market.knotless.dev/presence"

	byIdentity = "market.knotless.dev/presence-identity"
)

// Reconciler reconciles MarketPresences in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	// Resync is how often a published presence is read back from its PDS
	// (a change made behind knotless's back is undone). Zero means 2m.
	Resync time.Duration
	// Connect returns the Publisher of a repo (default market.Client with
	// Pool); tests replace it.
	Connect market.Connector
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// SetupWithManager registers the controller and its index.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &marketv1alpha1.MarketPresence{}, byIdentity, func(o client.Object) []string {
		return []string{o.(*marketv1alpha1.MarketPresence).Spec.IdentityRef.Name}
	}); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketPresence{}, predicates.SpecOrLifecycleChanged()).
		Watches(&marketv1alpha1.MarketIdentity{}, mapping.ByIndex(func() client.ObjectList { return &marketv1alpha1.MarketPresenceList{} }, byIdentity, client.Object.GetName)).
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
	lc := string(req.ClusterName)
	p := &marketv1alpha1.MarketPresence{}
	if err := c.Get(ctx, req.NamespacedName, p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !p.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, cl, lc, p)
	}
	if !controllerutil.ContainsFinalizer(p, Finalizer) {
		if err := ssa.Metadata(ctx, c, p, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}

	st := p.Status.DeepCopy()
	st.ObservedGeneration = p.Generation
	result := reconcile.Result{RequeueAfter: clock.Resync(r.Resync)}
	cause := r.publish(ctx, c, lc, p, st)
	var ce *conditions.Error
	switch {
	case cause == nil:
		st.Phase = marketv1alpha1.PhaseReady
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionPublished, p.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonPublished, "published as "+st.Record.URI)
		conditions.SetReady(&st.Conditions, p.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonReady, "published as "+st.Record.URI)
	case errors.As(cause, &ce):
		st.Phase = marketv1alpha1.PhasePending
		if ce.Reason == marketv1alpha1.ReasonInvalidRecord {
			st.Phase = marketv1alpha1.PhaseFailed
		}
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionPublished, p.Generation, metav1.ConditionFalse, ce.Reason, ce.Message)
		conditions.SetReady(&st.Conditions, p.Generation, metav1.ConditionFalse, ce.Reason, ce.Message)
		if ce.Reason == marketv1alpha1.ReasonNotFound || ce.Reason == marketv1alpha1.ReasonNotReady || ce.Reason == marketv1alpha1.ReasonInvalidRecord {
			// The identity's watch or a spec edit brings it back.
			cause, result = nil, reconcile.Result{}
		}
	default:
		st.Phase = marketv1alpha1.PhasePending
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionPublished, p.Generation, metav1.ConditionFalse, "Error", cause.Error())
		conditions.SetReady(&st.Conditions, p.Generation, metav1.ConditionFalse, "Error", cause.Error())
	}
	if err := ssa.WriteStatus(ctx, c, p, &p.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(p.Status.Conditions, st.Conditions, marketv1alpha1.ConditionReady),
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

// publish makes the presence record equal the spec. A record whose
// content (all but updatedAt) already equals it is left alone.
func (r *Reconciler) publish(ctx context.Context, c client.Client, lc string, p *marketv1alpha1.MarketPresence, st *marketv1alpha1.MarketPresenceStatus) error {
	_, repo, err := market.IdentityRepo(ctx, c, p.Namespace, p.Spec.IdentityRef.Name)
	if err != nil {
		return err
	}
	pub, err := market.Connect(ctx, r.Connect, r.Pool, c, lc, repo)
	if err != nil {
		return err
	}
	now := clock.Now(r.Now)
	desired := market.PresenceOf(&p.Spec, p.CreationTimestamp.Time, now)
	current, err := pub.Get(ctx, lexicon.Presence, p.Name)
	if err != nil {
		return err
	}
	// A record someone else changed so that it no longer matches the
	// lexicon is written again.
	if current != nil && lexicon.ValidateRecord(lexicon.Presence, current.Value) == nil && sameContent(current.Value, desired) {
		st.Record = &marketv1alpha1.PublishedRecord{URI: current.URI, CID: current.CID, Rev: rev(p.Status.Record, current.CID)}
		st.UpdatedAt = updatedAt(current.Value, st.UpdatedAt)
		return nil
	}
	res, err := pub.Publish(ctx, lexicon.Presence, p.Name, desired)
	if err != nil {
		return err
	}
	st.Record = &marketv1alpha1.PublishedRecord{URI: res.After.URI, CID: res.After.CID, Rev: res.Rev}
	st.UpdatedAt = updatedAt(res.After.Value, st.UpdatedAt)
	return nil
}

// rev keeps the revision of the last write while the record's CID is
// unchanged.
func rev(prev *marketv1alpha1.PublishedRecord, cid string) string {
	if prev != nil && prev.CID == cid {
		return prev.Rev
	}
	return ""
}

// sameContent reports whether the record read from the PDS equals the
// desired one in everything but updatedAt.
func sameContent(have json.RawMessage, want *market.Presence) bool {
	w, err := json.Marshal(want)
	if err != nil {
		return false
	}
	a, b := decode(have), decode(w)
	if a == nil || b == nil {
		return false
	}
	delete(a, "updatedAt")
	delete(b, "updatedAt")
	return reflect.DeepEqual(a, b)
}

func decode(raw []byte) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if dec.Decode(&m) != nil {
		return nil
	}
	return m
}

// updatedAt is the record's updatedAt, or prev when it has none.
func updatedAt(raw json.RawMessage, prev *metav1.Time) *metav1.Time {
	var v struct {
		UpdatedAt string `json:"updatedAt"`
	}
	if json.Unmarshal(raw, &v) != nil {
		return prev
	}
	t, err := time.Parse(time.RFC3339, v.UpdatedAt)
	if err != nil {
		return prev
	}
	mt := metav1.NewTime(t)
	return &mt
}

// finalize deletes the presence record, then lets the object go. The
// repo is the one of the namespace whose DID published the record (or,
// before it was published, the identity's). Without that repo the record
// cannot be deleted: the object goes and a Warning Event says so.
func (r *Reconciler) finalize(ctx context.Context, cl cluster.Cluster, lc string, p *marketv1alpha1.MarketPresence) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(p, Finalizer) {
		return reconcile.Result{}, nil
	}
	c := cl.GetClient()
	repo, err := r.repoOf(ctx, c, p)
	if err != nil {
		return reconcile.Result{}, err
	}
	switch {
	case repo == nil && p.Status.Record != nil:
		cl.GetEventRecorder(Name).Eventf(p, nil, corev1.EventTypeWarning, "RecordLeft", "Delete",
			"the repo that holds %s is gone; the record could not be deleted", p.Status.Record.URI)
	case repo != nil:
		if err := r.unpublish(ctx, c, lc, p, repo); err != nil {
			st := p.Status.DeepCopy()
			st.Phase = marketv1alpha1.PhaseDeleting
			conditions.SetReady(&st.Conditions, p.Generation, metav1.ConditionFalse, conditions.ReasonOf(err, "Error"), "deleting the presence record: "+err.Error())
			if werr := ssa.WriteStatus(ctx, c, p, &p.Status, st, ssa.StatusOptions{Manager: FieldManager}); werr != nil {
				return reconcile.Result{}, werr
			}
			return reconcile.Result{}, err // retried with backoff
		}
	}
	if err := ssa.RemoveFinalizer(ctx, c, p, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}

func (r *Reconciler) unpublish(ctx context.Context, c client.Client, lc string, p *marketv1alpha1.MarketPresence, repo *atprotov1alpha1.AtprotoRepo) error {
	if !meta.IsStatusConditionTrue(repo.Status.Conditions, atprotov1alpha1.ConditionReady) {
		return conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "AtprotoRepo %s is not Ready", repo.Name)
	}
	pub, err := market.Connect(ctx, r.Connect, r.Pool, c, lc, repo)
	if err != nil {
		return err
	}
	_, err = pub.Publish(ctx, lexicon.Presence, p.Name, nil)
	return err
}

// repoOf finds the repo of the presence's namespace that holds its
// record: the one with the DID of the published record, else the
// identity's. nil when there is none.
func (r *Reconciler) repoOf(ctx context.Context, c client.Client, p *marketv1alpha1.MarketPresence) (*atprotov1alpha1.AtprotoRepo, error) {
	name := ""
	if p.Status.Record == nil {
		id := &marketv1alpha1.MarketIdentity{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: p.Spec.IdentityRef.Name}, id); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		name = id.Spec.RepoRef.Name
	}
	did, _, _ := strings.Cut(strings.TrimPrefix(recordURI(p), "at://"), "/")
	var repos atprotov1alpha1.AtprotoRepoList
	if err := c.List(ctx, &repos, client.InNamespace(p.Namespace)); err != nil {
		return nil, err
	}
	for i := range repos.Items {
		if repo := &repos.Items[i]; (name != "" && repo.Name == name) || (did != "" && repo.Status.DID == did) {
			return repo, nil
		}
	}
	return nil, nil
}

func recordURI(p *marketv1alpha1.MarketPresence) string {
	if p.Status.Record == nil {
		return ""
	}
	return p.Status.Record.URI
}

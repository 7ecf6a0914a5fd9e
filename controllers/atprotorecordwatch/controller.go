// Package atprotorecordwatch follows a PDS or relay firehose for every
// AtprotoRecordWatch, through one shared internal/firehose.Hub (one
// connection per source, whatever workspace the watches are in). It is the
// only writer of AtprotoRecordWatch status (field manager FieldManager):
// every few seconds, when something changed, it writes the matched
// records, the per-repo revs and the cursor they are complete up to in one
// patch, so a restarted provider resumes from a consistent point.
package atprotorecordwatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "atprotorecordwatch"
	// FieldManager owns AtprotoRecordWatch status.
	FieldManager = "knotless-atprotorecordwatch"
	// ValueLimit is the largest record value (JSON bytes) kept in status.
	ValueLimit = 1024
	// DefaultMaxRecords applies when spec.maxRecords is not set.
	DefaultMaxRecords = 100
)

// Reconciler keeps one firehose subscription per AtprotoRecordWatch and
// writes its state to the watch's status.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Hub        *firehose.Hub
	// FlushInterval is how often a changed state is written (default 2s).
	FlushInterval time.Duration

	mu      sync.Mutex
	watches map[string]*watch
}

// watch is one AtprotoRecordWatch's subscription and what was last
// written for it.
type watch struct {
	sub        *firehose.Subscription
	uid        types.UID
	generation int64

	mu      sync.Mutex
	c       client.Client
	obj     *atprotov1alpha1.AtprotoRecordWatch
	written *atprotov1alpha1.AtprotoRecordWatchStatus
}

// SetupWithManager registers the controller and its shutdown flush.
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	if err := mgr.GetLocalManager().Add(r); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		// Status writes (ours) do not change the generation: they do not
		// come back as reconciles; the periodic requeue flushes.
		For(&atprotov1alpha1.AtprotoRecordWatch{}, predicate.GenerationChangedPredicate{}).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: 8,
			ReconciliationTimeout:   time.Minute,
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
	obj := &atprotov1alpha1.AtprotoRecordWatch{}
	if err := c.Get(ctx, req.NamespacedName, obj); err != nil || obj.DeletionTimestamp != nil {
		r.drop(engage.Key(req))
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if err := Validate(&obj.Spec); err != nil {
		r.drop(engage.Key(req))
		st := obj.Status.DeepCopy()
		st.ObservedGeneration = obj.Generation
		conditions.SetReady(&st.Conditions, obj.Generation, metav1.ConditionFalse, atprotov1alpha1.ReasonInvalidSpec, err.Error())
		return reconcile.Result{}, ssa.WriteStatus(ctx, c, obj, &obj.Status, st, ssa.StatusOptions{Manager: FieldManager})
	}
	w, err := r.ensure(engage.Key(req), c, obj)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := w.flush(ctx); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: cmp.Or(r.FlushInterval, 2*time.Second)}, nil
}

// Validate checks a watch's spec beyond what the schema checks.
func Validate(spec *atprotov1alpha1.AtprotoRecordWatchSpec) error {
	if _, err := firehose.NormalizeSource(spec.Source.URL); err != nil {
		return fmt.Errorf("spec.source.url: %w", err)
	}
	if len(spec.Collections) == 0 {
		return fmt.Errorf("spec.collections: at least one NSID is required")
	}
	for i, col := range spec.Collections {
		if _, err := syntax.ParseNSID(col); err != nil {
			return fmt.Errorf("spec.collections[%d]: %w", i, err)
		}
	}
	for i, did := range spec.DIDs {
		if _, err := syntax.ParseDID(did); err != nil {
			return fmt.Errorf("spec.dids[%d]: %w", i, err)
		}
	}
	return nil
}

// ensure returns the watch's subscription, (re)made when the object is new
// to this process, was recreated or its spec changed. A status written for
// the current generation is resumed from; otherwise the watch starts over.
func (r *Reconciler) ensure(k string, c client.Client, obj *atprotov1alpha1.AtprotoRecordWatch) (*watch, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watches == nil {
		r.watches = map[string]*watch{}
	}
	if w := r.watches[k]; w != nil {
		if w.uid == obj.UID && w.generation == obj.Generation {
			w.mu.Lock()
			w.c, w.obj = c, obj.DeepCopy()
			w.mu.Unlock()
			return w, nil
		}
		r.Hub.Unsubscribe(w.sub)
		delete(r.watches, k)
	}
	var initial firehose.State
	if obj.Status.ObservedGeneration == obj.Generation && obj.Status.Cursor > 0 {
		initial = stateFromStatus(&obj.Status)
	}
	maxRecords := int(cmp.Or(obj.Spec.MaxRecords, DefaultMaxRecords))
	sub, err := r.Hub.Subscribe(obj.Spec.Source.URL, firehose.Filter{Collections: obj.Spec.Collections, DIDs: obj.Spec.DIDs}, maxRecords, initial)
	if err != nil {
		return nil, err
	}
	w := &watch{sub: sub, uid: obj.UID, generation: obj.Generation, c: c, obj: obj.DeepCopy()}
	r.watches[k] = w
	return w, nil
}

func (r *Reconciler) drop(k string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.watches[k]; w != nil {
		r.Hub.Unsubscribe(w.sub)
		delete(r.watches, k)
	}
}

// Start implements manager.Runnable: at shutdown it writes every watch's
// state one last time, so a restart replays as little as possible.
func (r *Reconciler) Start(ctx context.Context) error {
	<-ctx.Done()
	// The manager's context is done; keep its values, not its cancellation.
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r.mu.Lock()
	watches := make([]*watch, 0, len(r.watches))
	for _, w := range r.watches {
		watches = append(watches, w)
	}
	r.mu.Unlock()
	for _, w := range watches {
		if err := w.flush(flushCtx); err != nil {
			log.FromContext(ctx).Info("final write of a watch's state failed; it resumes from the previous one", "watch", w.obj.Name, "err", err)
		}
	}
	return nil
}

// flush writes the watch's state if it differs from what was written.
func (w *watch) flush(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, health, _ := w.sub.Snapshot()
	prev := w.written
	if prev == nil {
		prev = &w.obj.Status
	}
	status := buildStatus(w.obj, prev, st, health)
	// Replace: records the watch no longer keeps must leave the list (see
	// ssa.ReplaceStatus).
	if err := ssa.WriteStatus(ctx, w.c, w.obj, prev, status, ssa.StatusOptions{Manager: FieldManager, Replace: true}); err != nil {
		return err
	}
	w.written = status
	return nil
}

func buildStatus(obj *atprotov1alpha1.AtprotoRecordWatch, prev *atprotov1alpha1.AtprotoRecordWatchStatus, st firehose.State, health firehose.Health) *atprotov1alpha1.AtprotoRecordWatchStatus {
	out := &atprotov1alpha1.AtprotoRecordWatchStatus{
		ObservedGeneration: obj.Generation,
		Cursor:             st.Cursor,
		Seen:               st.Seen,
		Matched:            st.Matched,
		Errors:             st.Errors,
		Evicted:            st.Evicted,
		RecordCount:        int64(len(st.Records)),
		Conditions:         slices.Clone(prev.Conditions),
	}
	if !st.LastEventTime.IsZero() {
		t := metav1.NewTime(st.LastEventTime.Truncate(time.Second))
		out.LastEventTime = &t
	}
	for _, rec := range st.RecordsNewestFirst() {
		wr := atprotov1alpha1.WatchedRecord{URI: rec.URI, CID: rec.CID, Rev: rec.Rev, ValueBytes: int32(max(len(rec.Value), rec.Size))}
		if len(rec.Value) > 0 && len(rec.Value) <= ValueLimit {
			wr.Value = &apiextensionsv1.JSON{Raw: rec.Value}
		}
		out.Records = append(out.Records, wr)
	}
	for did, repo := range st.Repos {
		out.Repos = append(out.Repos, atprotov1alpha1.WatchedRepo{DID: did, Rev: repo.Rev, Data: repo.Data})
	}
	slices.SortFunc(out.Repos, func(a, b atprotov1alpha1.WatchedRepo) int { return cmp.Compare(a.DID, b.DID) })
	if st.LastResync != nil {
		out.LastResync = &atprotov1alpha1.WatchResync{Reason: st.LastResync.Reason, Time: metav1.NewTime(st.LastResync.Time.Truncate(time.Second)), DID: st.LastResync.DID}
	}
	cond := metav1.Condition{Type: atprotov1alpha1.ConditionReady, ObservedGeneration: obj.Generation, Status: metav1.ConditionFalse}
	switch {
	case health.Connected && health.ResyncErr != nil:
		cond.Reason, cond.Message = failure(atprotov1alpha1.ReasonResyncing, health.ResyncErr)
	case health.Connected && health.Resyncing:
		cond.Reason, cond.Message = atprotov1alpha1.ReasonResyncing, "listing records from "+obj.Spec.Source.URL
	case health.Connected:
		cond.Status, cond.Reason = metav1.ConditionTrue, atprotov1alpha1.ReasonFollowing
		cond.Message = "following " + obj.Spec.Source.URL
	case health.Err != nil:
		cond.Reason, cond.Message = failure(atprotov1alpha1.ReasonSourceUnreachable, health.Err)
	default:
		cond.Reason, cond.Message = atprotov1alpha1.ReasonConnecting, "connecting to "+obj.Spec.Source.URL
	}
	meta.SetStatusCondition(&out.Conditions, cond)
	return out
}

// failure is the Ready reason and message of a connection or listing
// error: AddressNotAllowed when the address policy refused it,
// ListingTooLarge when a listing passed the provider's limits, otherwise
// reason. A source, or a PDS a listing reads, at a loopback, private or
// shared address that could not be reached has one message whatever the
// cause (R17): the firehose logged it in the provider's log.
func failure(reason string, err error) (string, string) {
	switch {
	case errors.Is(err, netpolicy.ErrDenied):
		reason = atprotov1alpha1.ReasonAddressNotAllowed
	case errors.Is(err, firehose.ErrPrivateUnreachable) && reason == atprotov1alpha1.ReasonResyncing:
		return reason, "a listing could not reach its server " + privateUnreachable
	case errors.Is(err, firehose.ErrPrivateUnreachable):
		return reason, "the source could not be reached " + privateUnreachable
	case errors.Is(err, firehose.ErrListingTooLarge):
		reason = atprotov1alpha1.ReasonListingTooLarge
	}
	return reason, err.Error()
}

// privateUnreachable ends the message of every failed connection to a
// source or PDS at a loopback, private or shared address.
const privateUnreachable = "(the provider's log says why)"

// stateFromStatus is the state a status was written from.
func stateFromStatus(s *atprotov1alpha1.AtprotoRecordWatchStatus) firehose.State {
	st := firehose.State{
		Cursor: s.Cursor, Seen: s.Seen, Matched: s.Matched, Errors: s.Errors, Evicted: s.Evicted,
		Repos: map[string]firehose.Repo{},
	}
	if s.LastEventTime != nil {
		st.LastEventTime = s.LastEventTime.Time
	}
	recs := make([]firehose.Record, 0, len(s.Records))
	for _, r := range s.Records {
		rec := firehose.Record{URI: r.URI, CID: r.CID, Rev: r.Rev, Size: int(r.ValueBytes)}
		if r.Value != nil {
			rec.Value = r.Value.Raw
		}
		recs = append(recs, rec)
	}
	st.Records = firehose.LoadRecords(recs)
	for _, r := range s.Repos {
		st.Repos[r.DID] = firehose.Repo{Rev: r.Rev, Data: r.Data}
	}
	if s.LastResync != nil {
		st.LastResync = &firehose.Resync{Reason: s.LastResync.Reason, Time: s.LastResync.Time.Time, DID: s.LastResync.DID}
	}
	return st
}

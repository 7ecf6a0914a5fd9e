// Package atprotorecord keeps each AtprotoRecord equal to its spec on the
// PDS of its AtprotoRepo. Status comes from reading the record back from
// the PDS, never from what the controller intended (R01). It is the only
// writer of AtprotoRecord status and of the record's finalizer (field
// manager FieldManager); it never writes spec.
package atprotorecord

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/suspend"
)

const (
	// Name is the controller's name.
	Name = "atprotorecord"
	// FieldManager owns AtprotoRecord status, finalizer and owner reference.
	FieldManager = "knotless-atprotorecord"
	// Finalizer deletes the record from the PDS before the object goes.
	Finalizer = "atproto.knotless.dev/record"
)

// Reconciler reconciles AtprotoRecords in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	// Resync is how often a Synced record is read back from the PDS to
	// detect changes made behind knotless's back. Zero means 2 minutes.
	Resync time.Duration
	// Scheme knows the kinds of the records' owner chains (suspend).
	Scheme *runtime.Scheme
	// Workers is the number of concurrent reconciles. A reconcile waits
	// while its record's write is batched with the other records of the
	// same repo, so more workers make larger batches. Zero means 64.
	Workers int
}

// SetupWithManager registers the controller. The repo controller's
// SetupWithManager registers the index of records by repo
// (names.RecordsByRepo).
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&atprotov1alpha1.AtprotoRecord{}, predicates.SpecOrLifecycleChanged()).
		Watches(&atprotov1alpha1.AtprotoRepo{}, enqueueRecordsOfRepo()).
		// A Component's suspend or resume reaches the record it owns.
		Watches(&appsv1alpha1.Component{}, componentToRecord(), predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicates.PhaseChanged())).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: cmp.Or(r.Workers, 64),
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			// A reconcile never waits forever: a read from a workspace whose cache
			// is not started yet (engagement still running) ends and is retried.
			ReconciliationTimeout: time.Minute,
		}).
		Complete(r)
}

// validate checks a record before anything is sent: its key and value
// (pds.ValidateRecord) and, for a collection knotless has a lexicon of
// (the market's), the value against that lexicon.
func validate(spec *atprotov1alpha1.AtprotoRecordSpec) error {
	if err := pds.ValidateRecord(spec.Collection, spec.RKey, spec.Value.Raw); err != nil {
		return err
	}
	if lexicon.Known(spec.Collection) {
		return lexicon.ValidateRecord(spec.Collection, spec.Value.Raw)
	}
	return nil
}

// componentToRecord maps a Component whose template is a record to that
// record (named like the Component) in the same workspace.
func componentToRecord() func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, _ cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []mcreconcile.Request {
			comp, ok := o.(*appsv1alpha1.Component)
			if !ok || comp.Spec.Template.AtprotoRecord == nil {
				return nil
			}
			return []mcreconcile.Request{{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKeyFromObject(comp)}}}
		})
	}
}

// enqueueRecordsOfRepo maps a repo to its records.
func enqueueRecordsOfRepo() mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return mapping.ByIndex(func() client.ObjectList { return &atprotov1alpha1.AtprotoRecordList{} }, names.RecordsByRepo,
		func(o client.Object) string { return o.GetName() })
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	lc := string(req.ClusterName)
	c := cl.GetClient()
	rec := &atprotov1alpha1.AtprotoRecord{}
	if err := c.Get(ctx, req.NamespacedName, rec); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	s := &syncer{r: r, c: c, cluster: lc, events: cl.GetEventRecorder(Name), rec: rec}
	return s.sync(ctx)
}

// syncer reconciles one record.
type syncer struct {
	r       *Reconciler
	c       client.Client
	cluster string
	events  events.EventRecorder
	rec     *atprotov1alpha1.AtprotoRecord
	// suspended is the record's effective suspend, once known.
	suspended suspend.State
}

func (s *syncer) sync(ctx context.Context) (reconcile.Result, error) {
	rec := s.rec
	if !rec.DeletionTimestamp.IsZero() {
		return s.finalize(ctx)
	}
	if err := validate(&rec.Spec); err != nil {
		// Bad input: say what is wrong, write nothing, wait for a spec edit.
		return reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonInvalidSpec, err.Error(), nil)
	}
	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: rec.Namespace, Name: rec.Spec.RepoRef.Name}, repo); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonRepoNotReady,
				fmt.Sprintf("AtprotoRepo %s not found in this namespace", rec.Spec.RepoRef.Name), nil)
		}
		return reconcile.Result{}, err
	}
	if err := s.ensureMetadata(ctx); err != nil {
		return reconcile.Result{}, err
	}
	// Suspended (by the record's Component or Application): write nothing.
	state, err := suspend.Effective(ctx, s.c, s.r.Scheme, rec)
	var ce *conditions.Error
	switch {
	case errors.As(err, &ce):
		return reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, ce.Reason, ce.Message, nil)
	case err != nil:
		return reconcile.Result{}, err
	}
	if s.suspended = state; state.Suspended {
		// Resume reaches the record through its Component; the resync is
		// a backstop should that event be missed.
		return reconcile.Result{RequeueAfter: s.resync()}, s.status(ctx, metav1.ConditionFalse, suspend.ReasonSuspended, "suspended by "+state.By+": the record is not written until it resumes", nil)
	}
	if !repo.DeletionTimestamp.IsZero() {
		// A repo being deleted deletes its records; nothing new is written
		// into it.
		return reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonRepoNotReady,
			fmt.Sprintf("AtprotoRepo %s is being deleted", repo.Name), nil)
	}
	if !meta.IsStatusConditionTrue(repo.Status.Conditions, atprotov1alpha1.ConditionReady) {
		msg := fmt.Sprintf("AtprotoRepo %s is not Ready", repo.Name)
		if c := meta.FindStatusCondition(repo.Status.Conditions, atprotov1alpha1.ConditionReady); c != nil {
			msg += ": " + c.Reason
		}
		// The repo watch brings the record back when the repo is Ready.
		return reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonRepoNotReady, msg, nil)
	}
	pc := s.r.Pool.Get(s.cluster, repo)
	if pc == nil {
		var err error
		if pc, err = s.r.Pool.Connect(ctx, s.c, s.cluster, repo); err != nil {
			return s.failed(ctx, err)
		}
	}

	res, err := pc.Ensure(ctx, rec.Spec.Collection, rec.Spec.RKey, rec.Spec.Value.Raw)
	if errors.Is(err, pds.ErrInvalidSwap) {
		// Another writer kept moving the repo: read again later.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return s.failed(ctx, err)
	}
	if res.Wrote && rec.Status.CID != "" && rec.Status.ObservedGeneration == rec.Generation {
		// Spec did not change since the last sync, yet the PDS differed.
		what := "changed"
		if res.Before == nil {
			what = "deleted"
		}
		s.events.Eventf(rec, nil, corev1.EventTypeWarning, "Restored", "Sync", "the record was %s on the PDS behind knotless's back; restoring it from spec", what)
	}
	if res.After == nil {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{RequeueAfter: s.resync()}, s.status(ctx, metav1.ConditionTrue, atprotov1alpha1.ReasonSynced,
		"the record on the PDS equals spec", &atprotov1alpha1.AtprotoRecordStatus{URI: res.After.URI, CID: res.After.CID, Rev: res.Rev})
}

// resync is the Reconciler's Resync or its default.
func (s *syncer) resync() time.Duration {
	return cmp.Or(s.r.Resync, 2*time.Minute)
}

// failed reports a PDS or connection error and backs off.
func (s *syncer) failed(ctx context.Context, err error) (reconcile.Result, error) {
	reason := conditions.ReasonOf(repoconn.Classify(err), atprotov1alpha1.ReasonWriteFailed)
	if serr := s.status(ctx, metav1.ConditionFalse, reason, err.Error(), nil); serr != nil {
		return reconcile.Result{}, serr
	}
	var rl *pds.RateLimitedError
	if errors.As(err, &rl) {
		return reconcile.Result{RequeueAfter: max(time.Until(rl.Reset), 0) + time.Second}, nil
	}
	return reconcile.Result{}, err
}

// ensureMetadata sets the finalizer. The record gets no owner reference to
// its repo: the repo's finalizer deletes its records, and a second owner
// would keep kcp's garbage collector from deleting a record whose
// Component goes (it deletes a dependent only when all owners are gone).
// An owner reference that an older knotless applied is removed.
func (s *syncer) ensureMetadata(ctx context.Context) error {
	oldOwner := slices.ContainsFunc(s.rec.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "AtprotoRepo" && o.APIVersion == atprotov1alpha1.GroupVersion.String()
	})
	if controllerutil.ContainsFinalizer(s.rec, Finalizer) && !oldOwner {
		return nil
	}
	return ssa.Metadata(ctx, s.c, s.rec, []string{Finalizer}, nil, FieldManager)
}

// finalize deletes the record from the PDS, then drops the finalizer.
func (s *syncer) finalize(ctx context.Context) (reconcile.Result, error) {
	rec := s.rec
	if !controllerutil.ContainsFinalizer(rec, Finalizer) {
		return reconcile.Result{}, nil
	}
	repo := &atprotov1alpha1.AtprotoRepo{}
	err := s.c.Get(ctx, client.ObjectKey{Namespace: rec.Namespace, Name: rec.Spec.RepoRef.Name}, repo)
	switch {
	case apierrors.IsNotFound(err):
		s.events.Eventf(rec, nil, corev1.EventTypeWarning, "RecordLeft", "Delete", "AtprotoRepo %s is gone: the record stays on the PDS", rec.Spec.RepoRef.Name)
	case err != nil:
		return reconcile.Result{}, err
	case pds.ValidateRecord(rec.Spec.Collection, rec.Spec.RKey, rec.Spec.Value.Raw) != nil && rec.Status.CID == "":
		// Never written: nothing to delete.
	default:
		pc := s.r.Pool.Get(s.cluster, repo)
		if pc == nil {
			if pc, err = s.r.Pool.Connect(ctx, s.c, s.cluster, repo); err != nil {
				if rec.Status.CID == "" {
					// Never synced and no way to reach the PDS: do not block
					// the deletion on a record that most likely never existed.
					s.events.Eventf(rec, nil, corev1.EventTypeWarning, "RecordLeft", "Delete", "the record was never synced and the repo cannot connect (%v); not deleting it from the PDS", err)
					break
				}
				return s.failed(ctx, err)
			}
		}
		if _, err := pc.Ensure(ctx, rec.Spec.Collection, rec.Spec.RKey, nil); err != nil {
			return s.failed(ctx, err)
		}
	}
	err = ssa.RemoveFinalizer(ctx, s.c, rec, Finalizer)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, err
}

// status applies the Synced condition and, when given, the read-back
// fields. Status is written only when it changed.
func (s *syncer) status(ctx context.Context, cond metav1.ConditionStatus, reason, msg string, readBack *atprotov1alpha1.AtprotoRecordStatus) error {
	st := s.rec.Status.DeepCopy()
	if readBack != nil {
		st.URI, st.CID, st.Rev = readBack.URI, readBack.CID, readBack.Rev
	}
	// While suspended, observedGeneration and Synced keep describing what
	// was last written; the Suspended condition says why nothing is.
	suspended := reason == suspend.ReasonSuspended
	if !suspended {
		st.ObservedGeneration = s.rec.Generation
		// Ready mirrors Synced, for kubectl wait and GitOps health checks.
		for _, typ := range []string{atprotov1alpha1.ConditionSynced, atprotov1alpha1.ConditionReady} {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: cond, Reason: reason, Message: msg, ObservedGeneration: s.rec.Generation})
		}
	}
	suspend.SetCondition(&st.Conditions, s.suspended, s.rec.Generation)
	return ssa.WriteStatus(ctx, s.c, s.rec, &s.rec.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    syncEvent(s.rec.Status.Conditions, st.Conditions, suspended, msg),
		Recorder: s.events,
		Action:   "Sync",
	})
}

// syncEvent announces a change of the Synced condition, except the first
// Synced of a new record: that one is the normal case and would double
// the writes to kcp per record (the condition says it). A status written
// while suspended is announced as Suspended, with msg.
func syncEvent(before, after []metav1.Condition, suspended bool, msg string) *ssa.StatusEvent {
	if suspended {
		return &ssa.StatusEvent{Type: corev1.EventTypeNormal, Reason: suspend.ReasonSuspended, Note: msg}
	}
	if meta.IsStatusConditionTrue(after, atprotov1alpha1.ConditionSynced) && meta.FindStatusCondition(before, atprotov1alpha1.ConditionSynced) == nil {
		return nil
	}
	return ssa.ConditionChanged(before, after, atprotov1alpha1.ConditionSynced)
}

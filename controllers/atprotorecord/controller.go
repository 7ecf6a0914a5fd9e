// Package atprotorecord keeps each AtprotoRecord equal to its spec on the
// PDS of its AtprotoRepo. Status comes from reading the record back from
// the PDS, never from what the controller intended (R01). It is the only
// writer of AtprotoRecord status (field manager FieldManager); it never
// writes spec.
//
// A record costs kcp two writes: the user's create and this controller's
// status. There is no finalizer per record: every record is written
// together with its marker in the repo's inventory on the PDS
// (pds.EnsureOwned, one commit), and a deleted AtprotoRecord's record is
// pruned through that inventory, by this controller when it sees the
// deletion and by the repo controller for deletions it did not see
// (provider down). Objects that still carry the finalizer of older
// knotless versions (LegacyFinalizer) are handled as before and lose it.
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/inventory"
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
	// FieldManager owns AtprotoRecord status.
	FieldManager = "knotless-atprotorecord"
	// LegacyFinalizer is the finalizer older knotless versions put on
	// every record. An object that carries it is written into the
	// inventory and loses it; one being deleted has its record deleted
	// first, as before.
	LegacyFinalizer = "atproto.knotless.dev/record"
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

	// deleted holds the AtprotoRecords seen deleted whose records are not
	// pruned yet.
	deleted tombstones
}

// SetupWithManager registers the controller. The repo controller's
// SetupWithManager registers the index of records by repo
// (names.RecordsByRepo).
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&atprotov1alpha1.AtprotoRecord{}, predicates.SpecOrLifecycleChanged()).
		// A deletion is remembered (spec included) so that its reconcile
		// prunes the record although the object is gone.
		Watches(&atprotov1alpha1.AtprotoRecord{}, r.remember()).
		Watches(&atprotov1alpha1.AtprotoRepo{}, enqueueRecordsOfRepo(), repoChangedForRecords()).
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

// validate checks a record before anything is sent: its collection is
// not one another kind owns (atprotov1alpha1.OwnedCollection: the schema
// refuses those, but not in objects made before it did), and its key and
// value pass pds.ValidateRecord.
func validate(spec *atprotov1alpha1.AtprotoRecordSpec) error {
	if owner := atprotov1alpha1.OwnedCollection(spec.Collection); owner != "" {
		return &pds.SpecError{Field: "collection", Reason: owner}
	}
	return pds.ValidateRecord(spec.Collection, spec.RKey, spec.Value.Raw)
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

// repoChangedForRecords passes the repo updates its records act on: its
// spec, its deletion, its Ready status and its account (DID). A repo's
// other status writes (its revision, every check) would otherwise make
// every record of the repo read its record again and write its status.
func repoChangedForRecords() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*atprotov1alpha1.AtprotoRepo)
			n, ok2 := e.ObjectNew.(*atprotov1alpha1.AtprotoRepo)
			if !ok1 || !ok2 {
				return true
			}
			return o.Generation != n.Generation || !o.DeletionTimestamp.Equal(n.DeletionTimestamp) || o.Status.DID != n.Status.DID ||
				meta.IsStatusConditionTrue(o.Status.Conditions, atprotov1alpha1.ConditionReady) != meta.IsStatusConditionTrue(n.Status.Conditions, atprotov1alpha1.ConditionReady)
		},
	}
}

// enqueueRecordsOfRepo maps a repo to its records.
func enqueueRecordsOfRepo() mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return mapping.ByIndex(func() client.ObjectList { return &atprotov1alpha1.AtprotoRecordList{} }, names.RecordsByRepo,
		func(o client.Object) string { return o.GetName() })
}

// Reconcile implements mcreconcile.Reconciler. It first prunes the
// records of deleted AtprotoRecords of this name (another object of the
// same name may exist by now: a Component that moved its record), then
// syncs the object, if there is one.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	lc := string(req.ClusterName)
	c := cl.GetClient()
	rec := &atprotov1alpha1.AtprotoRecord{}
	if err := c.Get(ctx, req.NamespacedName, rec); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		rec = nil
	}
	var uid types.UID
	if rec != nil {
		uid = rec.UID
	}
	if res, err := r.pruneDeleted(ctx, cl, req, uid); err != nil || res.RequeueAfter > 0 {
		return res, err
	}
	if rec == nil {
		return reconcile.Result{}, nil
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
	repo, result, err := s.writableRepo(ctx)
	if repo == nil {
		return result, err
	}
	return s.write(ctx, repo)
}

// writableRepo returns the record's repo when the record may be written
// into it now. Otherwise it returns nil, with the result and the error of
// the status that says why not: no such repo, the record suspended, the
// repo being deleted or not Ready.
func (s *syncer) writableRepo(ctx context.Context) (*atprotov1alpha1.AtprotoRepo, reconcile.Result, error) {
	rec := s.rec
	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: rec.Namespace, Name: rec.Spec.RepoRef.Name}, repo); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonRepoNotReady,
				fmt.Sprintf("AtprotoRepo %s not found in this namespace", rec.Spec.RepoRef.Name), nil)
		}
		return nil, reconcile.Result{}, err
	}
	// Suspended (by the record's Component or Application): write nothing.
	state, err := suspend.Effective(ctx, s.c, s.r.Scheme, rec)
	var ce *conditions.Error
	switch {
	case errors.As(err, &ce):
		return nil, reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, ce.Reason, ce.Message, nil)
	case err != nil:
		return nil, reconcile.Result{}, err
	}
	if s.suspended = state; state.Suspended {
		// Resume reaches the record through its Component; the resync is
		// a backstop should that event be missed.
		return nil, reconcile.Result{RequeueAfter: clock.Resync(s.r.Resync)}, s.status(ctx, metav1.ConditionFalse, suspend.ReasonSuspended, "suspended by "+state.By+": the record is not written until it resumes", nil)
	}
	if !repo.DeletionTimestamp.IsZero() {
		// A repo being deleted deletes its records; nothing new is written
		// into it.
		return nil, reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonRepoNotReady,
			fmt.Sprintf("AtprotoRepo %s is being deleted", repo.Name), nil)
	}
	if !meta.IsStatusConditionTrue(repo.Status.Conditions, atprotov1alpha1.ConditionReady) {
		msg := fmt.Sprintf("AtprotoRepo %s is not Ready", repo.Name)
		if c := meta.FindStatusCondition(repo.Status.Conditions, atprotov1alpha1.ConditionReady); c != nil {
			msg += ": " + c.Reason
		}
		// The repo watch brings the record back when the repo is Ready.
		return nil, reconcile.Result{}, s.status(ctx, metav1.ConditionFalse, atprotov1alpha1.ReasonRepoNotReady, msg, nil)
	}
	return repo, reconcile.Result{}, nil
}

// write writes the record and its inventory marker into repo and reads
// the status back from what the PDS holds.
func (s *syncer) write(ctx context.Context, repo *atprotov1alpha1.AtprotoRepo) (reconcile.Result, error) {
	rec := s.rec
	pc := s.r.Pool.Get(s.cluster, repo)
	if pc == nil {
		var err error
		if pc, err = s.r.Pool.Connect(ctx, s.c, s.cluster, repo); err != nil {
			return s.failed(ctx, err)
		}
	}

	// The record and its marker in the repo's inventory, in one commit;
	// nothing is written once the object or the repo went meanwhile.
	res, err := pc.EnsureOwned(ctx, inventory.Owner(repo), inventory.KeyOf(rec), rec.Spec.Value.Raw, s.wanted(repo))
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
	if res.Skipped || res.After == nil {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if err := s.dropLegacy(ctx); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, err
	}
	// status.rev is the repo's revision when the record was last written
	// or found changed: a record read back unchanged keeps it, so that a
	// resync of an unchanged record in a repo that moved writes nothing.
	rev := res.Rev
	if !res.Wrote && res.After.CID == rec.Status.CID && rec.Status.Rev != "" {
		rev = rec.Status.Rev
	}
	return reconcile.Result{RequeueAfter: clock.Resync(s.r.Resync)}, s.status(ctx, metav1.ConditionTrue, atprotov1alpha1.ReasonSynced,
		"the record on the PDS equals spec", &atprotov1alpha1.AtprotoRecordStatus{URI: res.After.URI, CID: res.After.CID, Rev: rev})
}

// failed reports a PDS or connection error and backs off.
func (s *syncer) failed(ctx context.Context, err error) (reconcile.Result, error) {
	reason := conditions.ReasonOf(repoconn.Classify(err), atprotov1alpha1.ReasonWriteFailed)
	if serr := s.status(ctx, metav1.ConditionFalse, reason, err.Error(), nil); serr != nil {
		return reconcile.Result{}, serr
	}
	if wait, ok := pds.RateLimitWait(err, time.Now()); ok {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	return reconcile.Result{}, err
}

// wanted is the want of the record's EnsureOwned: asked inside the batch,
// it reports whether the object (this one, by UID) and its repo still
// exist and are not being deleted, as the workspace's cache sees them.
func (s *syncer) wanted(repo *atprotov1alpha1.AtprotoRepo) func(context.Context) bool {
	return func(ctx context.Context) bool {
		cur := &atprotov1alpha1.AtprotoRecord{}
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(s.rec), cur); err != nil || cur.UID != s.rec.UID || !cur.DeletionTimestamp.IsZero() {
			return false
		}
		r := &atprotov1alpha1.AtprotoRepo{}
		err := s.c.Get(ctx, client.ObjectKeyFromObject(repo), r)
		return err == nil && r.UID == repo.UID && r.DeletionTimestamp.IsZero()
	}
}

// isRepoOwner reports whether o is an owner reference to an AtprotoRepo,
// which older knotless versions put on records.
func isRepoOwner(o metav1.OwnerReference) bool {
	return o.Kind == "AtprotoRepo" && o.APIVersion == atprotov1alpha1.GroupVersion.String()
}

// dropLegacy removes what older knotless versions put on the object once
// its record is in the inventory: LegacyFinalizer and an owner reference
// to the repo (a second owner would keep kcp's garbage collector from
// deleting a record whose Component goes). One merge patch of metadata,
// guarded by the resourceVersion (an apply through the virtual workspace
// would keep the entries it leaves out).
func (s *syncer) dropLegacy(ctx context.Context) error {
	rec := s.rec
	if !controllerutil.ContainsFinalizer(rec, LegacyFinalizer) && !slices.ContainsFunc(rec.OwnerReferences, isRepoOwner) {
		return nil
	}
	orig := rec.DeepCopy()
	controllerutil.RemoveFinalizer(rec, LegacyFinalizer)
	rec.OwnerReferences = slices.DeleteFunc(slices.Clone(rec.OwnerReferences), isRepoOwner)
	if err := s.c.Patch(ctx, rec, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("removing the finalizer and repo owner of older knotless versions from %s/%s: %w", rec.Namespace, rec.Name, err)
	}
	return nil
}

// finalize handles an object being deleted. Without LegacyFinalizer there
// is nothing to do: when the object is gone, its deletion prunes the
// record. With it, the record and its marker are deleted from the PDS,
// then the finalizer is removed, as older versions did.
func (s *syncer) finalize(ctx context.Context) (reconcile.Result, error) {
	rec := s.rec
	if !controllerutil.ContainsFinalizer(rec, LegacyFinalizer) {
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
		if _, err := pc.EnsureOwned(ctx, inventory.Owner(repo), inventory.KeyOf(rec), nil, nil); err != nil {
			return s.failed(ctx, err)
		}
	}
	err = ssa.RemoveFinalizer(ctx, s.c, rec, LegacyFinalizer)
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
			conditions.Set(&st.Conditions, typ, s.rec.Generation, cond, reason, msg)
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

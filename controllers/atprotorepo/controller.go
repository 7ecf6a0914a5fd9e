// Package atprotorepo reconciles AtprotoRepos: it logs in to the PDS with
// the repo's credential and reports the account's DID, handle and latest
// revision as the PDS reports them. It is the only status writer of
// AtprotoRepo (field manager FieldManager) and never writes spec.
//
// It also prunes the repo's inventory on the PDS (internal/inventory):
// at every check of the repo, the records knotless wrote whose
// AtprotoRecords are gone (deleted while no provider ran) are deleted, and
// when the repo is deleted, every record it wrote.
package atprotorepo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
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
	Name = "atprotorepo"
	// FieldManager owns AtprotoRepo status and the repo finalizer, and
	// the session Secrets internal/repoconn writes.
	FieldManager = names.AtprotoRepoManager
	// Finalizer makes a deleted repo delete its AtprotoRecords and the
	// records it wrote (from the PDS) before it goes.
	Finalizer = "atproto.knotless.dev/records"
	// refIndex indexes repos by the Secrets and ConfigMaps they reference.
	refIndex = "atproto.knotless.dev/refs"
)

// Reconciler reconciles AtprotoRepos in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Pool       *repoconn.Pool
	// Resync is how often a Ready repo is checked again (revision, and a
	// changed Vault credential). Zero means 5 minutes.
	Resync time.Duration
	// Scheme knows the kinds of the repos' owner chains (suspend).
	Scheme *runtime.Scheme
}

// SetupWithManager registers the controller, the index of repos by the
// objects they reference and the index of records by repo
// (names.RecordsByRepo, which the record controller uses too).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &atprotov1alpha1.AtprotoRepo{}, refIndex, refsOf); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &atprotov1alpha1.AtprotoRecord{}, names.RecordsByRepo, func(o client.Object) []string {
		return []string{o.(*atprotov1alpha1.AtprotoRecord).Spec.RepoRef.Name}
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &atprotov1alpha1.AtprotoRecord{}, names.RecordsByKey, inventory.IndexByKey); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&atprotov1alpha1.AtprotoRepo{}, predicates.SpecOrLifecycleChanged()).
		Watches(&corev1.Secret{}, enqueueReferrers("Secret")).
		Watches(&corev1.ConfigMap{}, enqueueReferrers("ConfigMap")).
		// A Component's suspend or resume reaches the repo it owns.
		Watches(&appsv1alpha1.Component{}, componentToRepo(), predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicates.PhaseChanged())).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			// A reconcile never waits forever: a read from a workspace whose cache
			// is not started yet (engagement still running) ends and is retried.
			ReconciliationTimeout: time.Minute,
		}).
		Complete(r)
}

func refsOf(o client.Object) []string {
	repo := o.(*atprotov1alpha1.AtprotoRepo)
	var refs []string
	if ref := repo.Spec.Credential.SecretKeyRef; ref != nil {
		refs = append(refs, "Secret/"+ref.Name)
	}
	if ref := repo.Spec.PDS.CABundle; ref != nil {
		refs = append(refs, ref.Kind+"/"+ref.Name)
	}
	return refs
}

// componentToRepo maps a Component whose template is a repo to that repo
// (named like the Component) in the same workspace.
func componentToRepo() func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, _ cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []mcreconcile.Request {
			comp, ok := o.(*appsv1alpha1.Component)
			if !ok || comp.Spec.Template.AtprotoRepo == nil {
				return nil
			}
			return []mcreconcile.Request{{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKeyFromObject(comp)}}}
		})
	}
}

// enqueueReferrers maps a Secret or ConfigMap to the repos of its
// namespace that reference it, so a changed credential or CA bundle is
// picked up without a restart (R08).
func enqueueReferrers(kind string) mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return mapping.ByIndex(func() client.ObjectList { return &atprotov1alpha1.AtprotoRepoList{} }, refIndex,
		func(o client.Object) string { return kind + "/" + o.GetName() })
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	lc := string(req.ClusterName)
	c := cl.GetClient()
	rec := cl.GetEventRecorder(Name)
	p := &pruner{r: r, cl: cl, cluster: lc, events: rec}

	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := c.Get(ctx, req.NamespacedName, repo); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !repo.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, c, lc, repo, p)
	}
	if !controllerutil.ContainsFinalizer(repo, Finalizer) {
		if err := addFinalizer(ctx, c, repo); err != nil {
			return reconcile.Result{}, err
		}
	}

	resync := r.Resync
	if resync == 0 {
		resync = 5 * time.Minute
	}
	st := repo.Status.DeepCopy()
	// Suspended (by the repo's Component or Application): no login, no
	// session refresh, no status but the Suspended condition. Deletion
	// and clean-up above still run.
	state, err := suspend.Effective(ctx, c, r.Scheme, repo)
	var sce *conditions.Error
	switch {
	case errors.As(err, &sce):
		st.ObservedGeneration = repo.Generation
		conditions.SetReady(&st.Conditions, repo.Generation, metav1.ConditionFalse, sce.Reason, sce.Message)
		return reconcile.Result{}, ssa.WriteStatus(ctx, c, repo, &repo.Status, st, ssa.StatusOptions{Manager: FieldManager})
	case err != nil:
		return reconcile.Result{}, err
	}
	if suspend.SetCondition(&st.Conditions, state, repo.Generation); state.Suspended {
		return reconcile.Result{}, r.suspended(ctx, c, lc, repo, st, state, p)
	}
	st.ObservedGeneration = repo.Generation
	pc, err := r.Pool.Connect(ctx, c, lc, repo)
	var pruneErr error
	if err == nil {
		did, handle := pc.Info()
		st.DID, st.Handle = did, handle
		// Records whose AtprotoRecords went while no provider ran (the
		// record controller prunes the deletions it sees itself). Before
		// the revision is read: a prune makes a commit.
		pruneErr = p.pruneWith(ctx, pc, repo, inventory.Declared(c, repo))
		st.Rev, err = pc.LatestRev(ctx)
		if err != nil {
			err = repoconn.Classify(err)
		}
	}
	result, cause := setReady(st, repo.Generation, err, resync)
	if err := ssa.WriteStatus(ctx, c, repo, &repo.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(repo.Status.Conditions, st.Conditions, atprotov1alpha1.ConditionReady),
		Recorder: rec,
		Action:   "Connect",
	}); err != nil {
		return reconcile.Result{}, err
	}
	if cause != nil {
		return reconcile.Result{}, cause
	}
	if pruneErr != nil {
		return reconcile.Result{}, pruneErr
	}
	return result, nil
}

// dependentsOf are the objects that must go before the repo: its
// AtprotoRecords and the MarketIdentities whose account it is (their
// finalizers delete what they published with its credential), and the
// MarketPresences being deleted whose record is in it.
func dependentsOf(ctx context.Context, c client.Client, repo *atprotov1alpha1.AtprotoRepo) ([]client.Object, error) {
	var records atprotov1alpha1.AtprotoRecordList
	if err := c.List(ctx, &records, client.InNamespace(repo.Namespace), client.MatchingFields{names.RecordsByRepo: repo.Name}); err != nil {
		return nil, err
	}
	var identities marketv1alpha1.MarketIdentityList
	if err := c.List(ctx, &identities, client.InNamespace(repo.Namespace)); err != nil {
		return nil, err
	}
	var dependents []client.Object
	for i := range records.Items {
		dependents = append(dependents, &records.Items[i])
	}
	for i := range identities.Items {
		if identities.Items[i].Spec.RepoRef.Name == repo.Name {
			dependents = append(dependents, &identities.Items[i])
		}
	}
	// Presences being deleted (a namespace going) delete their records
	// with this repo's credential: wait for them too.
	var presences marketv1alpha1.MarketPresenceList
	if err := c.List(ctx, &presences, client.InNamespace(repo.Namespace)); err != nil {
		return nil, err
	}
	for i := range presences.Items {
		p := &presences.Items[i]
		if !p.DeletionTimestamp.IsZero() && p.Status.Record != nil && repo.Status.DID != "" && strings.HasPrefix(p.Status.Record.URI, "at://"+repo.Status.DID+"/") {
			dependents = append(dependents, p)
		}
	}
	return dependents, nil
}

// suspended writes the status of a suspended repo and goes on with its
// clean-up. Not Ready while suspended: records and market objects that
// are not suspended themselves must not log in through it either.
func (r *Reconciler) suspended(ctx context.Context, c client.Client, lc string, repo *atprotov1alpha1.AtprotoRepo, st *atprotov1alpha1.AtprotoRepoStatus, state suspend.State, p *pruner) error {
	st.ObservedGeneration = repo.Generation
	conditions.SetReady(&st.Conditions, repo.Generation, metav1.ConditionFalse, suspend.ReasonSuspended, "suspended by "+state.By+": no login until it resumes")
	if err := ssa.WriteStatus(ctx, c, repo, &repo.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(repo.Status.Conditions, st.Conditions, suspend.ConditionType),
		Recorder: p.events,
		Action:   "Suspend",
	}); err != nil {
		return err
	}
	// Clean-up goes on while suspended (R04): records whose
	// AtprotoRecords went while no provider ran are deleted. A repo
	// that never connected wrote nothing.
	var err error
	if repo.Status.DID != "" {
		err = p.prune(ctx, repo, inventory.Declared(c, repo))
	}
	r.Pool.Forget(lc, repo.UID)
	return err
}

// setReady sets the Ready condition of st from the outcome err of
// connecting to the repo's PDS, and returns when to look again: at the
// resync when Ready, at a rate limit's reset, or through the rate-limited
// workqueue (the cause returned) for other failures.
func setReady(st *atprotov1alpha1.AtprotoRepoStatus, gen int64, err error, resync time.Duration) (reconcile.Result, error) {
	var ce *conditions.Error
	switch {
	case err == nil:
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionTrue, atprotov1alpha1.ReasonReady, "logged in to the PDS as "+st.Handle)
		return reconcile.Result{RequeueAfter: resync}, nil
	case errors.As(err, &ce):
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionFalse, ce.Reason, ce.Message)
		if wait, ok := pds.RateLimitWait(err, time.Now()); ok {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		// Back off through the rate-limited workqueue.
		return reconcile.Result{}, err
	default:
		conditions.SetReady(&st.Conditions, gen, metav1.ConditionFalse, "Error", err.Error())
		return reconcile.Result{}, err
	}
}

// finalize deletes the repo's AtprotoRecords and the MarketIdentities
// whose account it is (their own finalizers delete what they published
// from the PDS while the repo and its credential still exist), waits
// until they are gone, deletes every record the repo's inventory lists
// (what it wrote), then lets the repo go.
func (r *Reconciler) finalize(ctx context.Context, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo, p *pruner) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(repo, Finalizer) {
		return reconcile.Result{}, nil
	}
	dependents, err := dependentsOf(ctx, c, repo)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(dependents) > 0 {
		for _, o := range dependents {
			if !o.GetDeletionTimestamp().IsZero() {
				continue
			}
			if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, err
			}
		}
		log.FromContext(ctx).Info("waiting for the repo's records and market identities to be deleted", "objects", len(dependents))
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
	}
	// No AtprotoRecord of the repo is left: nothing it wrote is kept. A
	// repo that never connected wrote nothing.
	if repo.Status.DID != "" {
		if err := p.prune(ctx, repo, inventory.Nothing); err != nil {
			return reconcile.Result{}, p.reportDeletion(ctx, repo, err)
		}
	}
	if err := ssa.RemoveFinalizer(ctx, c, repo, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.Pool.Forget(cluster, repo.UID)
	return reconcile.Result{}, nil
}

// addFinalizer adds the controller's finalizer with a server-side apply of
// metadata only.
func addFinalizer(ctx context.Context, c client.Client, repo *atprotov1alpha1.AtprotoRepo) error {
	err := ssa.Metadata(ctx, c, repo, []string{Finalizer}, nil, FieldManager)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

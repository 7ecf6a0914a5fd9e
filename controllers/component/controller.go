// Package component reconciles Components: each owns exactly one child
// object made from its template (an AtprotoRepo, an AtprotoRecord or a
// MarketRequester, named like the Component) and mirrors that child's
// readiness in its status.
// While the Component or its Application is suspended it creates and
// changes nothing; the child stays as it is, and deletions (by kcp's
// garbage collector through the owner references) still complete.
//
// It is the only writer of Component status (field manager FieldManager)
// and of the children's spec (it generates them); it never writes a
// Component's spec.
package component

import (
	"context"
	"errors"
	"fmt"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
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
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/suspend"
)

const (
	// Name is the controller's name.
	Name = "component"
	// FieldManager owns Component status and the children's spec.
	FieldManager = "knotless-component"
	// OwnerIndex indexes Components by the name of their controller owner.
	OwnerIndex = "apps.knotless.dev/controller-owner"
)

// failedReasons are child condition reasons that need a user's action.
var failedReasons = map[string]bool{
	atprotov1alpha1.ReasonInvalidSpec:          true,
	atprotov1alpha1.ReasonAuthenticationFailed: true,
	atprotov1alpha1.ReasonCredentialNotFound:   true,
	atprotov1alpha1.ReasonCABundleNotFound:     true,
}

// Reconciler reconciles Components in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Scheme     *runtime.Scheme
}

// SetupWithManager registers the controller and the index of Components by
// controller owner.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &appsv1alpha1.Component{}, OwnerIndex, func(o client.Object) []string {
		if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "Application" {
			return []string{ref.Name}
		}
		return nil
	}); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&appsv1alpha1.Component{}, predicate.Or(predicates.SpecOrLifecycleChanged(), predicates.OwnersChanged(), predicates.PhaseChanged())).
		// The Application's suspend reaches its Components at once.
		Watches(&appsv1alpha1.Application{}, applicationToComponents(), predicate.GenerationChangedPredicate{}).
		Watches(&atprotov1alpha1.AtprotoRepo{}, childToComponent()).
		Watches(&atprotov1alpha1.AtprotoRecord{}, childToComponent()).
		Watches(&marketv1alpha1.MarketRequester{}, childToComponent()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: 8,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			// A reconcile never waits forever: a read from a workspace whose cache
			// is not started yet (engagement still running) ends and is retried.
			ReconciliationTimeout: 30 * time.Second,
		}).
		Complete(r)
}

// applicationToComponents enqueues the Components an Application controls.
func applicationToComponents() mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return mapping.ByIndex(func() client.ObjectList { return &appsv1alpha1.ComponentList{} }, OwnerIndex,
		func(o client.Object) string { return o.GetName() })
}

// childToComponent maps a child to its controlling Component in the same
// workspace.
func childToComponent() func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, _ cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []mcreconcile.Request {
			ref := metav1.GetControllerOf(o)
			if ref == nil || ref.Kind != "Component" || ref.APIVersion != appsv1alpha1.GroupVersion.String() {
				return nil
			}
			return []mcreconcile.Request{{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}}}}
		})
	}
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	lc := string(req.ClusterName)
	c := cl.GetClient()
	comp := &appsv1alpha1.Component{}
	if err := c.Get(ctx, req.NamespacedName, comp); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !comp.DeletionTimestamp.IsZero() {
		// kcp's garbage collector deletes the child through its owner
		// reference; nothing to create or change.
		return reconcile.Result{}, r.status(ctx, c, cl.GetEventRecorder(Name), comp, appsv1alpha1.ComponentDeleting, metav1.ConditionFalse, appsv1alpha1.ReasonDeleting, "the component is being deleted", suspend.State{}, comp.Status.Child)
	}
	s := &syncer{r: r, c: c, lc: lc, events: cl.GetEventRecorder(Name), comp: comp}
	return s.sync(ctx)
}

type syncer struct {
	r      *Reconciler
	c      client.Client
	lc     string
	events events.EventRecorder
	comp   *appsv1alpha1.Component
}

func (s *syncer) sync(ctx context.Context) (reconcile.Result, error) {
	comp := s.comp
	fail := func(reason, msg string, child *appsv1alpha1.ChildRef) (reconcile.Result, error) {
		return reconcile.Result{}, s.r.status(ctx, s.c, s.events, comp, appsv1alpha1.ComponentFailed, metav1.ConditionFalse, reason, msg, suspend.State{}, child)
	}
	state, err := suspend.Effective(ctx, s.c, s.r.Scheme, comp)
	var ce *conditions.Error
	switch {
	case errors.As(err, &ce):
		reason := ce.Reason
		if reason == suspend.ReasonOwnerNotFound {
			reason = appsv1alpha1.ReasonApplicationNotFound
		}
		return fail(reason, ce.Message, nil)
	case err != nil:
		return reconcile.Result{}, err
	}
	if _, ok := state.Root.(*appsv1alpha1.Application); !ok {
		return fail(appsv1alpha1.ReasonApplicationNotFound, "the component has no owning Application: components are made from an Application's spec.components", nil)
	}

	child, ref, err := childOf(comp)
	if err != nil {
		return fail(appsv1alpha1.ReasonInvalidSpec, err.Error(), nil)
	}
	cc := s.c
	existing, found, err := current(ctx, cc, child)
	if err != nil {
		return reconcile.Result{}, err
	}
	if found && !metav1.IsControlledBy(existing, comp) {
		return fail(appsv1alpha1.ReasonConflict, fmt.Sprintf("%s %s exists and is not controlled by this component; rename the component or delete the object", ref.Kind, ref.Name), nil)
	}
	if state.Suspended {
		return reconcile.Result{}, s.r.status(ctx, s.c, s.events, comp, appsv1alpha1.ComponentSuspended, metav1.ConditionFalse, appsv1alpha1.ReasonSuspended,
			"suspended by "+state.By+": the "+ref.Kind+" is neither created nor changed", state, ref)
	}
	if found && (!existing.GetDeletionTimestamp().IsZero() || movesRecord(existing, child)) {
		return reconcile.Result{}, s.replace(ctx, existing, ref, state)
	}
	if !found {
		if repo := repoBeingDeleted(ctx, cc, child); repo != "" {
			// The repo's finalizer would delete a record made now: look
			// again shortly (the repo is not watched from here).
			return reconcile.Result{RequeueAfter: 5 * time.Second}, s.r.status(ctx, s.c, s.events, comp, appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing,
				"AtprotoRepo "+repo+" is being deleted; the record is not made until it is gone or back", state, ref)
		}
	}
	if !found || !sameSpec(existing, child) {
		if err := ssa.Child(ctx, cc, child, comp, FieldManager); err != nil {
			return reconcile.Result{}, err
		}
		if !found {
			// The child's own controller reports on it; come back through the watch.
			return reconcile.Result{}, s.r.status(ctx, s.c, s.events, comp, appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing, ref.Kind+" created", state, ref)
		}
	}
	phase, status, reason, msg := mirror(existing, ref.Kind)
	if !sameSpec(existing, child) {
		phase, status, reason, msg = appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing, ref.Kind+" updated from the template"
	}
	return reconcile.Result{}, s.r.status(ctx, s.c, s.events, comp, phase, status, reason, msg, state, ref)
}

// current returns the object of child's kind and name as it is, and
// whether it exists.
func current(ctx context.Context, c client.Client, child client.Object) (client.Object, bool, error) {
	existing, ok := child.DeepCopyObject().(client.Object)
	if !ok {
		return nil, false, fmt.Errorf("%T is not a client.Object", child)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(child), existing); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, false, err
		}
		return existing, false, nil
	}
	return existing, true, nil
}

// replace deletes the existing child that the template moved, or that is
// being deleted, and says so. An AtprotoRecord's repoRef, collection and
// rkey are immutable: a template that changes them moves the record. The
// old object goes first (its finalizer deletes the old record from the
// PDS); its deletion brings the component back to create the new one.
func (s *syncer) replace(ctx context.Context, existing client.Object, ref *appsv1alpha1.ChildRef, state suspend.State) error {
	if existing.GetDeletionTimestamp().IsZero() {
		if err := s.c.Delete(ctx, existing); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	// Say why the old object does not go (its PDS unreachable, its
	// credential gone): that is what holds the move up.
	phase, status, reason, msg := appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing,
		ref.Kind+" "+ref.Name+" is being deleted; it is made again from the template once it is gone"
	if p, _, why, detail := mirror(existing, ref.Kind); p == appsv1alpha1.ComponentFailed || (why != "" && why != appsv1alpha1.ReasonProgressing && why != atprotov1alpha1.ReasonSynced) {
		if p == appsv1alpha1.ComponentFailed {
			phase = p
		}
		reason, msg = why, msg+"; the old "+ref.Kind+" reports "+why+": "+detail
	}
	return s.r.status(ctx, s.c, s.events, s.comp, phase, status, reason, msg, state, ref)
}

// childOf builds the child object from the template.
func childOf(comp *appsv1alpha1.Component) (client.Object, *appsv1alpha1.ChildRef, error) {
	t := comp.Spec.Template
	meta := metav1.ObjectMeta{Name: comp.Name, Namespace: comp.Namespace}
	gv := atprotov1alpha1.GroupVersion.String()
	switch {
	case (t.AtprotoRepo != nil && t.AtprotoRecord != nil) || (t.MarketRequester != nil && (t.AtprotoRepo != nil || t.AtprotoRecord != nil)):
		return nil, nil, errors.New("spec.template sets more than one child kind; set exactly one of atprotoRepo, atprotoRecord and marketRequester")
	case t.MarketRequester != nil:
		return &marketv1alpha1.MarketRequester{ObjectMeta: meta, Spec: *t.MarketRequester},
			&appsv1alpha1.ChildRef{APIVersion: marketv1alpha1.GroupVersion.String(), Kind: "MarketRequester", Name: comp.Name}, nil
	case t.AtprotoRepo != nil:
		return &atprotov1alpha1.AtprotoRepo{ObjectMeta: meta, Spec: *t.AtprotoRepo}, &appsv1alpha1.ChildRef{APIVersion: gv, Kind: "AtprotoRepo", Name: comp.Name}, nil
	case t.AtprotoRecord != nil:
		return &atprotov1alpha1.AtprotoRecord{ObjectMeta: meta, Spec: *t.AtprotoRecord}, &appsv1alpha1.ChildRef{APIVersion: gv, Kind: "AtprotoRecord", Name: comp.Name}, nil
	default:
		return nil, nil, errors.New("spec.template sets no child kind; set atprotoRepo, atprotoRecord or marketRequester")
	}
}

// repoBeingDeleted returns the name of the AtprotoRepo an AtprotoRecord
// child names when that repo is being deleted, else "".
func repoBeingDeleted(ctx context.Context, c client.Client, child client.Object) string {
	rec, ok := child.(*atprotov1alpha1.AtprotoRecord)
	if !ok {
		return ""
	}
	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: rec.Namespace, Name: rec.Spec.RepoRef.Name}, repo); err != nil || repo.DeletionTimestamp.IsZero() {
		return ""
	}
	return repo.Name
}

// movesRecord reports whether the template names another record than the
// existing AtprotoRecord (repo, collection or rkey differ), which an
// update cannot do.
func movesRecord(existing, want client.Object) bool {
	e, ok := existing.(*atprotov1alpha1.AtprotoRecord)
	if !ok {
		return false
	}
	w := want.(*atprotov1alpha1.AtprotoRecord).Spec
	return e.Spec.RepoRef != w.RepoRef || e.Spec.Collection != w.Collection || e.Spec.RKey != w.RKey
}

// sameSpec reports whether the existing child's spec equals the template's.
func sameSpec(existing, want client.Object) bool {
	switch e := existing.(type) {
	case *atprotov1alpha1.AtprotoRepo:
		return apiequality.Semantic.DeepEqual(e.Spec, want.(*atprotov1alpha1.AtprotoRepo).Spec)
	case *atprotov1alpha1.AtprotoRecord:
		w := want.(*atprotov1alpha1.AtprotoRecord)
		return e.Spec.RepoRef == w.Spec.RepoRef && e.Spec.Collection == w.Spec.Collection && e.Spec.RKey == w.Spec.RKey &&
			pds.JSONEqual(e.Spec.Value.Raw, w.Spec.Value.Raw)
	case *marketv1alpha1.MarketRequester:
		return apiequality.Semantic.DeepEqual(e.Spec, want.(*marketv1alpha1.MarketRequester).Spec)
	}
	return false
}

// mirror turns the child's readiness condition into the component's phase.
func mirror(child client.Object, kind string) (appsv1alpha1.ComponentPhase, metav1.ConditionStatus, string, string) {
	var cond *metav1.Condition
	var gen, observed int64 = child.GetGeneration(), 0
	switch c := child.(type) {
	case *atprotov1alpha1.AtprotoRepo:
		cond, observed = meta.FindStatusCondition(c.Status.Conditions, atprotov1alpha1.ConditionReady), c.Status.ObservedGeneration
	case *atprotov1alpha1.AtprotoRecord:
		cond, observed = meta.FindStatusCondition(c.Status.Conditions, atprotov1alpha1.ConditionSynced), c.Status.ObservedGeneration
	case *marketv1alpha1.MarketRequester:
		cond, observed = meta.FindStatusCondition(c.Status.Conditions, marketv1alpha1.ConditionReady), c.Status.ObservedGeneration
	}
	switch {
	case cond == nil || observed != gen:
		return appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing, "waiting for the " + kind + " to be reconciled"
	case cond.Status == metav1.ConditionTrue:
		return appsv1alpha1.ComponentReady, metav1.ConditionTrue, appsv1alpha1.ReasonReady, kind + " " + cond.Reason + ": " + cond.Message
	case failedReasons[cond.Reason]:
		return appsv1alpha1.ComponentFailed, metav1.ConditionFalse, cond.Reason, kind + ": " + cond.Message
	default:
		return appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, cond.Reason, kind + ": " + cond.Message
	}
}

// status applies the Component's status when it changed and records an
// Event when the phase changes.
func (r *Reconciler) status(ctx context.Context, c client.Client, rec events.EventRecorder, comp *appsv1alpha1.Component, phase appsv1alpha1.ComponentPhase,
	cond metav1.ConditionStatus, reason, msg string, state suspend.State, child *appsv1alpha1.ChildRef) error {
	st := comp.Status.DeepCopy()
	st.ObservedGeneration, st.Phase = comp.Generation, phase
	if child != nil {
		st.Child = child
	}
	conditions.SetReady(&st.Conditions, comp.Generation, cond, reason, msg)
	suspend.SetCondition(&st.Conditions, state, comp.Generation)
	return ssa.WriteStatus(ctx, c, comp, &comp.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseChanged(comp.Status.Phase, phase, appsv1alpha1.ComponentFailed, appsv1alpha1.ComponentSuspended, msg),
		Recorder: rec,
		Action:   "Reconcile",
	})
}

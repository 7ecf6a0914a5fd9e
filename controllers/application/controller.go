// Package application reconciles Applications: it keeps one Component per
// entry of spec.components (owned by the Application, applied with field
// manager FieldManager), deletes the Components of removed entries, and
// summarises the Components in the Application's status (phase, Ready,
// observedGeneration).
//
// While the Application is suspended it creates and changes no Component,
// but it still deletes the Components of removed entries (R04: clean-up is
// never blocked). It is the only writer of Application status except
// status.market, which belongs to the market controller; it never writes
// an Application's spec.
package application

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "application"
	// FieldManager owns Application status (except status.market) and the
	// Components' metadata and spec.template.
	FieldManager = "knotless-application"
)

// Reconciler reconciles Applications in every engaged workspace.
type Reconciler struct {
	// GetCluster returns an engaged workspace.
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
}

// SetupWithManager registers the controller for every engaged workspace.
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&appsv1alpha1.Application{}, predicate.Or(predicates.SpecOrLifecycleChanged(), predicates.PhaseChanged())).
		Owns(&appsv1alpha1.Component{}).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: 8,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			// A reconcile never waits forever: a read from a workspace whose cache
			// is not started yet (engagement still running) ends and is retried.
			ReconciliationTimeout: 30 * time.Second,
		}).
		Complete(r)
}

// Reconcile implements mcreconcile.Reconciler. Errors go back to the
// controller's rate-limited workqueue.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	return Reconcile(ctx, cl.GetClient(), cl.GetEventRecorder(Name), req.NamespacedName)
}

// Reconcile brings one Application and its Components up to date in c.
func Reconcile(ctx context.Context, c client.Client, rec events.EventRecorder, key client.ObjectKey) (reconcile.Result, error) {
	app := &appsv1alpha1.Application{}
	if err := c.Get(ctx, key, app); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var list appsv1alpha1.ComponentList
	if err := c.List(ctx, &list, client.InNamespace(app.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	byName := map[string]*appsv1alpha1.Component{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}

	invalid := validate(app)
	var conflicts []string
	if app.DeletionTimestamp.IsZero() && invalid == nil {
		// Clean-up first, whatever suspend says.
		want := map[string]bool{}
		for _, e := range app.Spec.Components {
			want[e.Name] = true
		}
		for name, comp := range byName {
			if metav1.IsControlledBy(comp, app) && !want[name] {
				// Background propagation: kcp's default for bound resources
				// would orphan the child instead of deleting it.
				if err := c.Delete(ctx, comp, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
					return reconcile.Result{}, err
				}
				delete(byName, name)
			}
		}
		for _, e := range app.Spec.Components {
			comp, found := byName[e.Name]
			if found && !metav1.IsControlledBy(comp, app) {
				conflicts = append(conflicts, e.Name)
				continue
			}
			if app.Spec.Suspend || found && apiequality.Semantic.DeepEqual(comp.Spec.Template, e.Template) {
				continue
			}
			desired := &appsv1alpha1.Component{
				ObjectMeta: metav1.ObjectMeta{Name: e.Name, Namespace: app.Namespace},
				Spec:       appsv1alpha1.ComponentSpec{Template: e.Template},
			}
			if err := ssa.Child(ctx, c, desired, app, FieldManager); err != nil {
				return reconcile.Result{}, err
			}
		}
	}

	want := desiredStatus(app, byName, invalid, conflicts)
	current := app.Status
	current.Market = nil // not ours: neither compared nor written
	return reconcile.Result{}, ssa.WriteStatus(ctx, c, app, &current, &want, ssa.StatusOptions{
		Manager: FieldManager,
		Event: ssa.PhaseChanged(current.Phase, want.Phase, appsv1alpha1.ApplicationFailed, appsv1alpha1.ApplicationSuspended,
			meta.FindStatusCondition(want.Conditions, appsv1alpha1.ConditionReady).Message),
		Recorder: rec,
		Action:   "Reconcile",
	})
}

// validate checks what the schema cannot: component names are DNS-1123
// labels and each template sets exactly one child kind.
func validate(app *appsv1alpha1.Application) error {
	var errs []string
	for i, e := range app.Spec.Components {
		if msgs := validation.IsDNS1123Label(e.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Sprintf("spec.components[%d].name %q: %s", i, e.Name, strings.Join(msgs, "; ")))
		}
		switch n := btoi(e.Template.AtprotoRepo != nil) + btoi(e.Template.AtprotoRecord != nil) + btoi(e.Template.MarketRequester != nil); n {
		case 0:
			errs = append(errs, fmt.Sprintf("spec.components[%d].template sets no child kind (atprotoRepo, atprotoRecord or marketRequester)", i))
		case 1:
		default:
			errs = append(errs, fmt.Sprintf("spec.components[%d].template sets %d child kinds; set exactly one", i, n))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// desiredStatus derives the status from the Application and the
// Components it controls.
func desiredStatus(app *appsv1alpha1.Application, comps map[string]*appsv1alpha1.Component, invalid error, conflicts []string) appsv1alpha1.ApplicationStatus {
	st := appsv1alpha1.ApplicationStatus{
		ObservedGeneration: app.Generation,
		Conditions:         append([]metav1.Condition(nil), app.Status.Conditions...),
	}
	ready := metav1.Condition{Type: appsv1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: app.Generation}
	total := len(app.Spec.Components)
	var nReady int
	var failed []string
	for _, e := range app.Spec.Components {
		comp, ok := comps[e.Name]
		if !ok || !metav1.IsControlledBy(comp, app) || comp.Status.ObservedGeneration != comp.Generation {
			continue
		}
		switch comp.Status.Phase {
		case appsv1alpha1.ComponentReady:
			nReady++
		case appsv1alpha1.ComponentFailed:
			failed = append(failed, e.Name)
		}
	}
	switch {
	case !app.DeletionTimestamp.IsZero():
		st.Phase, ready.Reason, ready.Message = appsv1alpha1.ApplicationDeleting, appsv1alpha1.ReasonDeleting, "the application is being deleted"
	case invalid != nil:
		st.Phase, ready.Reason, ready.Message = appsv1alpha1.ApplicationFailed, appsv1alpha1.ReasonInvalidSpec, invalid.Error()
	case app.Spec.Suspend:
		st.Phase, ready.Reason, ready.Message = appsv1alpha1.ApplicationSuspended, appsv1alpha1.ReasonSuspended,
			fmt.Sprintf("spec.suspend is true: nothing is created or changed (%d/%d components Ready)", nReady, total)
	case len(conflicts) > 0:
		st.Phase, ready.Reason, ready.Message = appsv1alpha1.ApplicationFailed, appsv1alpha1.ReasonConflict,
			"a Component of another owner already has the name of component(s) "+strings.Join(conflicts, ", ")
	case len(failed) > 0:
		st.Phase, ready.Reason, ready.Message = appsv1alpha1.ApplicationFailed, appsv1alpha1.ReasonFailed,
			fmt.Sprintf("component(s) %s failed (%d/%d Ready)", strings.Join(failed, ", "), nReady, total)
	case nReady == total:
		st.Phase, ready.Status, ready.Reason, ready.Message = appsv1alpha1.ApplicationReady, metav1.ConditionTrue, appsv1alpha1.ReasonReady,
			fmt.Sprintf("%d/%d components Ready", nReady, total)
	default:
		st.Phase, ready.Reason, ready.Message = appsv1alpha1.ApplicationProgressing, appsv1alpha1.ReasonProgressing,
			fmt.Sprintf("%d/%d components Ready", nReady, total)
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	return st
}

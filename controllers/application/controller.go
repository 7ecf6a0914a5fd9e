// Package application reconciles the status of Applications: phase,
// observedGeneration and the Ready condition. It is the status writer of
// Application (field manager FieldManager); it never writes spec.
package application

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "application"
	// FieldManager owns Application status.
	FieldManager = "knotless-application"
	// Export is the APIExport that serves Application.
	Export = "apps.knotless.dev"
)

// Reconciler reconciles Applications in every engaged workspace.
type Reconciler struct {
	// GetCluster returns an engaged workspace.
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
}

// SetupWithManager registers the controller for the workspaces bound to
// the apps export.
func SetupWithManager(mgr mcmanager.Manager) error {
	r := &Reconciler{GetCluster: mgr.GetCluster}
	return mcbuilder.ControllerManagedBy(mgr).
		Named(Name).
		For(&appsv1alpha1.Application{}, engage.ForExport(Export)).
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

// Reconcile brings one Application's status up to date in c.
func Reconcile(ctx context.Context, c client.Client, rec events.EventRecorder, key client.ObjectKey) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	app := &appsv1alpha1.Application{}
	if err := c.Get(ctx, key, app); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}

	want := desiredStatus(app)
	if apiequality.Semantic.DeepEqual(app.Status, want) {
		return reconcile.Result{}, nil
	}

	if err := ssa.Status(ctx, c, app, &want, FieldManager); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if app.Status.Phase != want.Phase {
		logger.Info("application phase changed", "from", app.Status.Phase, "to", want.Phase)
		if rec != nil {
			typ := corev1.EventTypeNormal
			if want.Phase == appsv1alpha1.ApplicationFailed {
				typ = corev1.EventTypeWarning
			}
			rec.Eventf(app, nil, typ, string(want.Phase), "Reconcile", "Application is %s", want.Phase)
		}
	}
	return reconcile.Result{}, nil
}

// desiredStatus derives the status from the object alone. Later controllers
// add the components' readiness.
func desiredStatus(app *appsv1alpha1.Application) appsv1alpha1.ApplicationStatus {
	st := appsv1alpha1.ApplicationStatus{
		ObservedGeneration: app.Generation,
		Conditions:         append([]metav1.Condition(nil), app.Status.Conditions...),
	}
	ready := metav1.Condition{Type: appsv1alpha1.ConditionReady, ObservedGeneration: app.Generation}
	switch {
	case app.DeletionTimestamp != nil:
		st.Phase = appsv1alpha1.ApplicationDeleting
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, "Deleting", "the application is being deleted"
	case app.Spec.Suspend:
		st.Phase = appsv1alpha1.ApplicationSuspended
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, "Suspended", "spec.suspend is true: nothing is created or changed"
	default:
		st.Phase = appsv1alpha1.ApplicationReady
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, "Reconciled", "the application is reconciled"
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	return st
}

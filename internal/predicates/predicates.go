// Package predicates holds event filters shared by controllers.
package predicates

import (
	"slices"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
)

// SpecOrLifecycleChanged passes an update only when the object's spec
// (generation) or deletion timestamp changed, or a finalizer was removed.
// A controller's own status writes and finalizer additions then do not
// re-trigger it: an error message that differs on every attempt would
// otherwise bypass the workqueue's backoff and turn into a retry storm.
func SpecOrLifecycleChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			if o == nil || n == nil {
				return true
			}
			return o.GetGeneration() != n.GetGeneration() ||
				!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
				slices.ContainsFunc(o.GetFinalizers(), func(f string) bool { return !slices.Contains(n.GetFinalizers(), f) })
		},
	}
}

// OwnersChanged passes an update when the object's owner references
// changed (for kinds whose reconcile depends on their owner chain).
func OwnersChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld != nil && e.ObjectNew != nil &&
				!apiequality.Semantic.DeepEqual(e.ObjectOld.GetOwnerReferences(), e.ObjectNew.GetOwnerReferences())
		},
	}
}

// Phase returns status.phase of the knotless kinds that have one.
func Phase(o client.Object) string {
	switch x := o.(type) {
	case *appsv1alpha1.Application:
		return string(x.Status.Phase)
	case *appsv1alpha1.Component:
		return string(x.Status.Phase)
	}
	return ""
}

// PhaseChanged passes updates that change status.phase (Phase). A
// controller that skips a status write when the cached status already
// equals what it computed passes its own phase changes through this: when
// its previous write reaches the cache after the reconcile that compared
// against the older status, the reconcile runs again and sees the truth
// (otherwise a suspend quickly followed by a resume can leave a stale
// Suspended phase behind).
func PhaseChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld != nil && e.ObjectNew != nil && Phase(e.ObjectOld) != Phase(e.ObjectNew)
		},
	}
}

// Package predicates holds event filters shared by controllers.
package predicates

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
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
				!equality.Semantic.DeepEqual(e.ObjectOld.GetOwnerReferences(), e.ObjectNew.GetOwnerReferences())
		},
	}
}

// Package predicates holds event filters shared by controllers.
package predicates

import (
	"slices"

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

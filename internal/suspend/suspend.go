// Package suspend answers, for any knotless object, "is it suspended?":
// an object is suspended when it or any object up its chain of controller
// owner references (Component, then Application, the root) asks to be
// (R04: effective suspend = root suspend OR own suspend). An own suspend
// can only add to the root's: nothing under a suspended root runs, whatever
// its own field says.
//
// Suspend stops creating and changing things. It never blocks release or
// clean-up: callers check it only on the paths that create or change, not
// in finalizers or deletions.
package suspend

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/internal/conditions"
)

// ConditionType is the condition every kind under an Application sets
// to True while it is suspended (and to False when it resumes).
const ConditionType = "Suspended"

// Condition reasons.
const (
	// ReasonSuspended: the object or an owner has spec.suspend set.
	ReasonSuspended = "Suspended"
	// ReasonResumed: the object was suspended and no longer is.
	ReasonResumed = "Resumed"
	// ReasonOwnerNotFound: a controller owner reference names an object
	// that does not exist (or has another UID).
	ReasonOwnerNotFound = "OwnerNotFound"
	// ReasonOwnerCycle: the controller owner references form a cycle.
	ReasonOwnerCycle = "OwnerCycle"
)

// maxDepth bounds the owner chain (Application → Component → child is 3).
const maxDepth = 8

// Requester is implemented by kinds that have their own spec.suspend.
type Requester interface {
	client.Object
	SuspendRequested() bool
}

// State is the effective suspend of an object.
type State struct {
	// Suspended is true when the object or an owner asks to be suspended.
	Suspended bool
	// By names the object that asks, as "Kind/name" (the topmost one when
	// several do); empty when not suspended.
	By string
	// Root is the top of the controller owner chain (the object itself
	// when it has no controller owner).
	Root client.Object
}

// Effective walks obj's controller owner references up to the root and
// reports whether obj is suspended. Owners of kinds that scheme does not
// know end the walk (they cannot ask knotless to suspend). A missing owner
// or a cycle is a *conditions.Error with reason ReasonOwnerNotFound or
// ReasonOwnerCycle; reading errors are returned as they are.
// r reads obj's workspace (every knotless kind of a workspace is served by
// the one export, so one reader sees the whole chain).
func Effective(ctx context.Context, r client.Reader, scheme *runtime.Scheme, obj client.Object) (State, error) {
	var st State
	cur := obj
	seen := map[string]bool{}
	for depth := 0; ; depth++ {
		if r, ok := cur.(Requester); ok && r.SuspendRequested() {
			st.Suspended = true
			st.By = kindOf(scheme, cur) + "/" + cur.GetName()
		}
		seen[string(cur.GetUID())] = true
		ref := metav1.GetControllerOf(cur)
		if ref == nil {
			st.Root = cur
			return st, nil
		}
		if depth == maxDepth {
			return st, conditions.Errorf(ReasonOwnerCycle, nil, "the owner chain of %s is longer than %d", obj.GetName(), maxDepth)
		}
		if seen[string(ref.UID)] {
			return st, conditions.Errorf(ReasonOwnerCycle, nil, "the controller owner references of %s form a cycle through %s/%s", obj.GetName(), ref.Kind, ref.Name)
		}
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			return st, conditions.Errorf(ReasonOwnerNotFound, nil, "owner %s/%s has an invalid apiVersion %q", ref.Kind, ref.Name, ref.APIVersion)
		}
		o, err := scheme.New(gv.WithKind(ref.Kind))
		if err != nil {
			st.Root = cur // not a kind knotless serves: the chain ends here
			return st, nil
		}
		owner, ok := o.(client.Object)
		if !ok {
			st.Root = cur
			return st, nil
		}
		if err := r.Get(ctx, client.ObjectKey{Namespace: cur.GetNamespace(), Name: ref.Name}, owner); err != nil {
			if apierrors.IsNotFound(err) {
				return st, conditions.Errorf(ReasonOwnerNotFound, nil, "owner %s %s of %s does not exist", ref.Kind, ref.Name, cur.GetName())
			}
			return st, err
		}
		if owner.GetUID() != ref.UID {
			return st, conditions.Errorf(ReasonOwnerNotFound, nil, "owner %s %s of %s was replaced by another object of that name", ref.Kind, ref.Name, cur.GetName())
		}
		cur = owner
	}
}

func kindOf(scheme *runtime.Scheme, o client.Object) string {
	if gvks, _, err := scheme.ObjectKinds(o); err == nil && len(gvks) > 0 {
		return gvks[0].Kind
	}
	return o.GetObjectKind().GroupVersionKind().Kind
}

// SetCondition makes the Suspended condition in conds reflect st: True
// (reason Suspended, naming what suspended it) while suspended; False
// (reason Resumed) once resumed; absent on objects never suspended. It
// reports whether conds changed.
func SetCondition(conds *[]metav1.Condition, st State, generation int64) bool {
	if !st.Suspended {
		if c := meta.FindStatusCondition(*conds, ConditionType); c == nil || c.Status == metav1.ConditionFalse {
			return false
		}
		return meta.SetStatusCondition(conds, metav1.Condition{
			Type: ConditionType, Status: metav1.ConditionFalse, Reason: ReasonResumed, ObservedGeneration: generation,
			Message: "not suspended",
		})
	}
	return meta.SetStatusCondition(conds, metav1.Condition{
		Type: ConditionType, Status: metav1.ConditionTrue, Reason: ReasonSuspended, ObservedGeneration: generation,
		Message: fmt.Sprintf("suspended by %s: nothing is created or changed until it resumes; deletions still complete", st.By),
	})
}

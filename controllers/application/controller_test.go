package application

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
)

func TestDesiredStatus(t *testing.T) {
	now := metav1.NewTime(time.Now())
	for _, tc := range []struct {
		name   string
		app    appsv1alpha1.Application
		phase  appsv1alpha1.ApplicationPhase
		ready  metav1.ConditionStatus
		reason string
	}{
		{"new", appsv1alpha1.Application{}, appsv1alpha1.ApplicationReady, metav1.ConditionTrue, "Reconciled"},
		{"suspended", appsv1alpha1.Application{Spec: appsv1alpha1.ApplicationSpec{Suspend: true}}, appsv1alpha1.ApplicationSuspended, metav1.ConditionFalse, "Suspended"},
		{"deleting", appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, appsv1alpha1.ApplicationDeleting, metav1.ConditionFalse, "Deleting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.app.Generation = 7
			st := desiredStatus(&tc.app)
			c := meta.FindStatusCondition(st.Conditions, appsv1alpha1.ConditionReady)
			if st.Phase != tc.phase || st.ObservedGeneration != 7 || c == nil || c.Status != tc.ready || c.Reason != tc.reason || c.ObservedGeneration != 7 {
				t.Fatalf("got %+v", st)
			}
		})
	}
}

// A status that already matches yields an identical desired status, so the
// controller does not patch (status is patched only when it changed).
func TestDesiredStatusIsStable(t *testing.T) {
	app := &appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	app.Status = desiredStatus(app)
	again := desiredStatus(app)
	if again.Phase != app.Status.Phase || len(again.Conditions) != 1 ||
		!again.Conditions[0].LastTransitionTime.Equal(&app.Status.Conditions[0].LastTransitionTime) {
		t.Fatalf("desired status moved: %+v vs %+v", again, app.Status)
	}
}

package predicates

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
)

func TestSpecOrLifecycleChanged(t *testing.T) {
	p := SpecOrLifecycleChanged()
	base := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Generation: 1, Finalizers: []string{"a"}}}
	now := metav1.NewTime(time.Now())
	for name, tc := range map[string]struct {
		mutate func(*corev1.ConfigMap)
		want   bool
	}{
		"status only":       {func(*corev1.ConfigMap) {}, false},
		"generation":        {func(c *corev1.ConfigMap) { c.Generation = 2 }, true},
		"deletion":          {func(c *corev1.ConfigMap) { c.DeletionTimestamp = &now }, true},
		"finalizer added":   {func(c *corev1.ConfigMap) { c.Finalizers = []string{"a", "x"} }, false},
		"finalizer removed": {func(c *corev1.ConfigMap) { c.Finalizers = nil }, true},
		"finalizer swapped": {func(c *corev1.ConfigMap) { c.Finalizers = []string{"x"} }, true},
		"resourceVersion":   {func(c *corev1.ConfigMap) { c.ResourceVersion = "9" }, false},
	} {
		n := base.DeepCopy()
		tc.mutate(n)
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != tc.want {
			t.Errorf("%s: got %v, want %v", name, got, tc.want)
		}
	}
}

func TestPhaseChanged(t *testing.T) {
	p := PhaseChanged()
	old := &appsv1alpha1.Component{Status: appsv1alpha1.ComponentStatus{Phase: appsv1alpha1.ComponentReady}}
	same, moved := old.DeepCopy(), old.DeepCopy()
	same.Status.Conditions = []metav1.Condition{{Type: "x"}}
	moved.Status.Phase = appsv1alpha1.ComponentSuspended
	if p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: same}) {
		t.Error("a status change without a phase change passed")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: moved}) {
		t.Error("a phase change did not pass")
	}
	if p.Create(event.CreateEvent{Object: old}) {
		t.Error("PhaseChanged passed a create")
	}
}

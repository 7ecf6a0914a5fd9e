package predicates

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
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

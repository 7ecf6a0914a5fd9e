package application

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
)

func TestDesiredStatus(t *testing.T) {
	now := metav1.NewTime(time.Now())
	repo := appsv1alpha1.ComponentTemplate{AtprotoRepo: &atprotov1alpha1.AtprotoRepoSpec{}}
	app := func(suspend bool, names ...string) appsv1alpha1.Application {
		a := appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Name: "shop", UID: "app", Generation: 7}, Spec: appsv1alpha1.ApplicationSpec{Suspend: suspend}}
		for _, n := range names {
			a.Spec.Components = append(a.Spec.Components, appsv1alpha1.ApplicationComponent{Name: n, Template: repo})
		}
		return a
	}
	comp := func(name string, phase appsv1alpha1.ComponentPhase, owner string) *appsv1alpha1.Component {
		return &appsv1alpha1.Component{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, OwnerReferences: []metav1.OwnerReference{{Kind: "Application", Name: "shop", UID: "app", Controller: ptr.To(true)}}},
			Status:     appsv1alpha1.ComponentStatus{ObservedGeneration: 1, Phase: phase},
		}
	}
	foreign := comp("b", appsv1alpha1.ComponentReady, "")
	foreign.OwnerReferences[0].UID = "other"
	comps := func(cs ...*appsv1alpha1.Component) map[string]*appsv1alpha1.Component {
		m := map[string]*appsv1alpha1.Component{}
		for _, c := range cs {
			m[c.Name] = c
		}
		return m
	}
	deleting := app(false, "a")
	deleting.DeletionTimestamp = &now
	for _, tc := range []struct {
		name      string
		app       appsv1alpha1.Application
		comps     map[string]*appsv1alpha1.Component
		invalid   error
		conflicts []string
		phase     appsv1alpha1.ApplicationPhase
		ready     metav1.ConditionStatus
		reason    string
	}{
		{"no components", app(false), nil, nil, nil, appsv1alpha1.ApplicationReady, metav1.ConditionTrue, "Ready"},
		{"all ready", app(false, "a", "b"), comps(comp("a", "Ready", ""), comp("b", "Ready", "")), nil, nil, appsv1alpha1.ApplicationReady, metav1.ConditionTrue, "Ready"},
		{"one progressing", app(false, "a", "b"), comps(comp("a", "Ready", ""), comp("b", "Progressing", "")), nil, nil, appsv1alpha1.ApplicationProgressing, metav1.ConditionFalse, "Progressing"},
		{"one missing", app(false, "a", "b"), comps(comp("a", "Ready", "")), nil, nil, appsv1alpha1.ApplicationProgressing, metav1.ConditionFalse, "Progressing"},
		{"a foreign component does not count", app(false, "a", "b"), comps(comp("a", "Ready", ""), foreign), nil, nil, appsv1alpha1.ApplicationProgressing, metav1.ConditionFalse, "Progressing"},
		{"one failed", app(false, "a", "b"), comps(comp("a", "Ready", ""), comp("b", "Failed", "")), nil, nil, appsv1alpha1.ApplicationFailed, metav1.ConditionFalse, "Failed"},
		{"suspended wins over failed", app(true, "a"), comps(comp("a", "Failed", "")), nil, nil, appsv1alpha1.ApplicationSuspended, metav1.ConditionFalse, "Suspended"},
		{"invalid", app(false, "a"), nil, errors.New("bad"), nil, appsv1alpha1.ApplicationFailed, metav1.ConditionFalse, "InvalidSpec"},
		{"conflict", app(false, "a"), nil, nil, []string{"a"}, appsv1alpha1.ApplicationFailed, metav1.ConditionFalse, "Conflict"},
		{"deleting", deleting, nil, nil, nil, appsv1alpha1.ApplicationDeleting, metav1.ConditionFalse, "Deleting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := desiredStatus(&tc.app, tc.comps, tc.invalid, tc.conflicts)
			c := meta.FindStatusCondition(st.Conditions, appsv1alpha1.ConditionReady)
			if st.Phase != tc.phase || st.ObservedGeneration != 7 || c == nil || c.Status != tc.ready || c.Reason != tc.reason || c.ObservedGeneration != 7 {
				t.Fatalf("got %+v", st)
			}
			if st.Market != nil {
				t.Fatal("the application controller must never write status.market")
			}
		})
	}
}

// A status that already matches yields an identical desired status, so the
// controller does not patch (status is patched only when it changed).
func TestDesiredStatusIsStable(t *testing.T) {
	app := &appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	app.Status = desiredStatus(app, nil, nil, nil)
	again := desiredStatus(app, nil, nil, nil)
	if again.Phase != app.Status.Phase || len(again.Conditions) != 1 ||
		!again.Conditions[0].LastTransitionTime.Equal(&app.Status.Conditions[0].LastTransitionTime) {
		t.Fatalf("desired status moved: %+v vs %+v", again, app.Status)
	}
}

func TestValidate(t *testing.T) {
	repo := &atprotov1alpha1.AtprotoRepoSpec{}
	rec := &atprotov1alpha1.AtprotoRecordSpec{}
	for _, tc := range []struct {
		name string
		c    appsv1alpha1.ApplicationComponent
		ok   bool
	}{
		{"repo", appsv1alpha1.ApplicationComponent{Name: "repo", Template: appsv1alpha1.ComponentTemplate{AtprotoRepo: repo}}, true},
		{"bad name", appsv1alpha1.ApplicationComponent{Name: "Repo_1", Template: appsv1alpha1.ComponentTemplate{AtprotoRepo: repo}}, false},
		{"no kind", appsv1alpha1.ApplicationComponent{Name: "x"}, false},
		{"two kinds", appsv1alpha1.ApplicationComponent{Name: "x", Template: appsv1alpha1.ComponentTemplate{AtprotoRepo: repo, AtprotoRecord: rec}}, false},
	} {
		err := validate(&appsv1alpha1.Application{Spec: appsv1alpha1.ApplicationSpec{Components: []appsv1alpha1.ApplicationComponent{tc.c}}})
		if (err == nil) != tc.ok {
			t.Errorf("%s: validate = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

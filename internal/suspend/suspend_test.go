package suspend_test

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/knotless-dev/knotless/apis"
	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/suspend"
)

func controlledBy(apiVersion, kind, name string, uid types.UID) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}}
}

func TestEffective(t *testing.T) {
	scheme := apis.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	apps := appsv1alpha1.GroupVersion.String()
	app := func(suspended bool) *appsv1alpha1.Application {
		return &appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "default", UID: "app"}, Spec: appsv1alpha1.ApplicationSpec{Suspend: suspended}}
	}
	comp := func(suspended bool, owners []metav1.OwnerReference) *appsv1alpha1.Component {
		return &appsv1alpha1.Component{ObjectMeta: metav1.ObjectMeta{Name: "profile", Namespace: "default", UID: "comp", OwnerReferences: owners}, Spec: appsv1alpha1.ComponentSpec{Suspend: suspended}}
	}
	record := func(owners []metav1.OwnerReference) *atprotov1alpha1.AtprotoRecord {
		return &atprotov1alpha1.AtprotoRecord{ObjectMeta: metav1.ObjectMeta{Name: "profile", Namespace: "default", UID: "rec", OwnerReferences: owners}}
	}
	toApp := controlledBy(apps, "Application", "shop", "app")
	toComp := controlledBy(apps, "Component", "profile", "comp")

	for name, tc := range map[string]struct {
		objs      []client.Object
		obj       client.Object
		suspended bool
		by        string
		reason    string // reason of the *conditions.Error
	}{
		"no owner":                  {obj: record(nil)},
		"root not suspended":        {objs: []client.Object{app(false), comp(false, toApp)}, obj: record(toComp)},
		"root suspended":            {objs: []client.Object{app(true), comp(false, toApp)}, obj: record(toComp), suspended: true, by: "Application/shop"},
		"own override suspends":     {objs: []client.Object{app(false), comp(true, toApp)}, obj: record(toComp), suspended: true, by: "Component/profile"},
		"override cannot resume":    {objs: []client.Object{app(true)}, obj: comp(false, toApp), suspended: true, by: "Application/shop"},
		"both: topmost named":       {objs: []client.Object{app(true), comp(true, toApp)}, obj: record(toComp), suspended: true, by: "Application/shop"},
		"the root itself":           {obj: app(true), suspended: true, by: "Application/shop"},
		"missing owner":             {objs: []client.Object{comp(false, toApp)}, obj: record(toComp), reason: suspend.ReasonOwnerNotFound},
		"owner with another UID":    {objs: []client.Object{app(false), comp(false, controlledBy(apps, "Application", "shop", "old"))}, obj: record(toComp), reason: suspend.ReasonOwnerNotFound},
		"cycle":                     {objs: []client.Object{comp(false, controlledBy(atprotov1alpha1.GroupVersion.String(), "AtprotoRecord", "profile", "rec"))}, obj: record(toComp), reason: suspend.ReasonOwnerCycle},
		"owner of a foreign kind":   {obj: record(controlledBy("example.com/v1", "Widget", "w", "w"))},
		"owner that is a ConfigMap": {objs: []client.Object{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "default", UID: "cm"}}}, obj: record(controlledBy("v1", "ConfigMap", "cm", "cm"))},
	} {
		t.Run(name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objs...).Build()
			st, err := suspend.Effective(context.Background(), c, scheme, tc.obj)
			var ce *conditions.Error
			if tc.reason != "" {
				if !errors.As(err, &ce) || ce.Reason != tc.reason {
					t.Fatalf("error %v, want a *conditions.Error with reason %s", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.Suspended != tc.suspended || st.By != tc.by {
				t.Fatalf("state %+v, want suspended=%v by %q", st, tc.suspended, tc.by)
			}
		})
	}
}

func TestSetCondition(t *testing.T) {
	var conds []metav1.Condition
	if suspend.SetCondition(&conds, suspend.State{}, 1) || len(conds) != 0 {
		t.Fatalf("never suspended: %+v", conds)
	}
	if !suspend.SetCondition(&conds, suspend.State{Suspended: true, By: "Application/shop"}, 3) || len(conds) != 1 || conds[0].ObservedGeneration != 3 || conds[0].Status != metav1.ConditionTrue {
		t.Fatalf("set: %+v", conds)
	}
	if suspend.SetCondition(&conds, suspend.State{Suspended: true, By: "Application/shop"}, 3) {
		t.Fatal("setting the same condition again reported a change")
	}
	if !suspend.SetCondition(&conds, suspend.State{}, 3) || len(conds) != 1 || conds[0].Status != metav1.ConditionFalse || conds[0].Reason != suspend.ReasonResumed {
		t.Fatalf("resume: %+v", conds)
	}
	if suspend.SetCondition(&conds, suspend.State{}, 3) {
		t.Fatal("resuming again reported a change")
	}
}

package component

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
)

func TestChildOf(t *testing.T) {
	comp := &appsv1alpha1.Component{ObjectMeta: metav1.ObjectMeta{Name: "profile", Namespace: "default"}}
	if _, _, err := childOf(comp); err == nil {
		t.Fatal("a template without a kind was accepted")
	}
	comp.Spec.Template.AtprotoRecord = &atprotov1alpha1.AtprotoRecordSpec{RKey: "self"}
	child, ref, err := childOf(comp)
	if err != nil || ref.Kind != "AtprotoRecord" || ref.Name != "profile" || child.GetName() != "profile" || child.GetNamespace() != "default" {
		t.Fatalf("record child %v %+v %v", child, ref, err)
	}
	comp.Spec.Template.AtprotoRepo = &atprotov1alpha1.AtprotoRepoSpec{}
	if _, _, err := childOf(comp); err == nil {
		t.Fatal("a template with two kinds was accepted")
	}
}

func TestSameSpecComparesJSONByValue(t *testing.T) {
	rec := func(v string) *atprotov1alpha1.AtprotoRecord {
		return &atprotov1alpha1.AtprotoRecord{Spec: atprotov1alpha1.AtprotoRecordSpec{Collection: "a.b.c", RKey: "k", Value: apiextensionsv1.JSON{Raw: []byte(v)}}}
	}
	if !sameSpec(rec(`{"a":1,"b":"x"}`), rec(`{"b": "x", "a": 1}`)) {
		t.Fatal("equal values in another key order differ")
	}
	if sameSpec(rec(`{"a":1}`), rec(`{"a":2}`)) {
		t.Fatal("different values are the same")
	}
}

func TestMirror(t *testing.T) {
	rec := func(gen, observed int64, status metav1.ConditionStatus, reason string) *atprotov1alpha1.AtprotoRecord {
		r := &atprotov1alpha1.AtprotoRecord{ObjectMeta: metav1.ObjectMeta{Generation: gen}}
		r.Status.ObservedGeneration = observed
		if reason != "" {
			r.Status.Conditions = []metav1.Condition{{Type: atprotov1alpha1.ConditionSynced, Status: status, Reason: reason}}
		}
		return r
	}
	for _, tc := range []struct {
		name  string
		child *atprotov1alpha1.AtprotoRecord
		phase appsv1alpha1.ComponentPhase
	}{
		{"not reconciled", rec(1, 0, "", ""), appsv1alpha1.ComponentProgressing},
		{"synced", rec(2, 2, metav1.ConditionTrue, "Synced"), appsv1alpha1.ComponentReady},
		{"synced for an older generation", rec(3, 2, metav1.ConditionTrue, "Synced"), appsv1alpha1.ComponentProgressing},
		{"PDS down", rec(1, 1, metav1.ConditionFalse, "PDSUnreachable"), appsv1alpha1.ComponentProgressing},
		{"invalid", rec(1, 1, metav1.ConditionFalse, "InvalidSpec"), appsv1alpha1.ComponentFailed},
	} {
		if phase, _, _, _ := mirror(tc.child, "AtprotoRecord"); phase != tc.phase {
			t.Errorf("%s: phase %s, want %s", tc.name, phase, tc.phase)
		}
	}
}

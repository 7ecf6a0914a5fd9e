package component

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/suspend"
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

const (
	lc = "2x7uf0bml0q9ms3b"
	ns = "shop"
)

var (
	repoSpec = &atprotov1alpha1.AtprotoRepoSpec{
		PDS:        atprotov1alpha1.PDS{URL: "https://pds.example"},
		Credential: atprotov1alpha1.Credential{Identifier: "alice.test", SecretKeyRef: &atprotov1alpha1.SecretKeyRef{Name: "cred", Key: "password"}},
	}
	recordSpec = &atprotov1alpha1.AtprotoRecordSpec{
		RepoRef: atprotov1alpha1.LocalObjectRef{Name: "repo"}, Collection: "dev.knotless.test.thing", RKey: "self",
		Value: apiextensionsv1.JSON{Raw: []byte(`{"text":"hello"}`)},
	}
)

func application(suspended bool) *appsv1alpha1.Application {
	return &appsv1alpha1.Application{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app", UID: "app-uid", Generation: 1},
		Spec:       appsv1alpha1.ApplicationSpec{Suspend: suspended},
	}
}

// component is the Component "profile", controlled by the Application
// "app" unless owners says otherwise.
func component(tmpl appsv1alpha1.ComponentTemplate, owners ...metav1.OwnerReference) *appsv1alpha1.Component {
	if owners == nil {
		owners = []metav1.OwnerReference{{APIVersion: appsv1alpha1.GroupVersion.String(), Kind: "Application", Name: "app", UID: "app-uid", Controller: ptr.To(true)}}
	}
	return &appsv1alpha1.Component{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "profile", UID: "comp-uid", Generation: 1, OwnerReferences: owners},
		Spec:       appsv1alpha1.ComponentSpec{Template: tmpl},
	}
}

func setup(objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	ws := clustertest.New(objs...)
	return &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}), Scheme: apis.NewScheme()}, ws
}

func reconcileComponent(t *testing.T, r *Reconciler) {
	t.Helper()
	res, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "profile"}}})
	if err != nil || res != (reconcile.Result{}) {
		t.Fatalf("reconcile: %+v, %v", res, err)
	}
}

func getComponent(t *testing.T, ws *clustertest.Cluster) *appsv1alpha1.Component {
	t.Helper()
	comp := &appsv1alpha1.Component{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "profile"}, comp); err != nil {
		t.Fatal(err)
	}
	return comp
}

// checkReady fails unless the Component has phase and a Ready condition
// with status and reason for its generation; it returns the condition.
func checkReady(t *testing.T, comp *appsv1alpha1.Component, phase appsv1alpha1.ComponentPhase, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(comp.Status.Conditions, appsv1alpha1.ConditionReady)
	if comp.Status.Phase != phase || comp.Status.ObservedGeneration != comp.Generation || c == nil ||
		c.Status != status || c.Reason != reason || c.ObservedGeneration != comp.Generation {
		t.Fatalf("status %+v, want phase %s and Ready=%s/%s", comp.Status, phase, status, reason)
	}
	return c
}

// noChildren fails if any AtprotoRepo or AtprotoRecord exists.
func noChildren(t *testing.T, ws *clustertest.Cluster) {
	t.Helper()
	ctx := context.Background()
	var repos atprotov1alpha1.AtprotoRepoList
	var recs atprotov1alpha1.AtprotoRecordList
	if err := ws.Client.List(ctx, &repos); err != nil {
		t.Fatal(err)
	}
	if err := ws.Client.List(ctx, &recs); err != nil {
		t.Fatal(err)
	}
	if len(repos.Items)+len(recs.Items) != 0 {
		t.Fatalf("children were created: %d AtprotoRepos, %d AtprotoRecords", len(repos.Items), len(recs.Items))
	}
}

// A Component under an Application creates its child from the template,
// named like it and controlled by it, and mirrors the child's readiness.
func TestComponentCreatesItsChild(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind     string
		tmpl     appsv1alpha1.ComponentTemplate
		child    client.Object
		spec     func(client.Object) any
		want     any
		setReady func(client.Object)
	}{
		{
			kind: "AtprotoRepo", tmpl: appsv1alpha1.ComponentTemplate{AtprotoRepo: repoSpec}, child: &atprotov1alpha1.AtprotoRepo{},
			spec: func(o client.Object) any { return o.(*atprotov1alpha1.AtprotoRepo).Spec }, want: *repoSpec,
			setReady: func(o client.Object) {
				r := o.(*atprotov1alpha1.AtprotoRepo)
				r.Status.ObservedGeneration = r.Generation
				r.Status.Conditions = []metav1.Condition{{Type: atprotov1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: atprotov1alpha1.ReasonReady, LastTransitionTime: metav1.Now()}}
			},
		},
		{
			kind: "AtprotoRecord", tmpl: appsv1alpha1.ComponentTemplate{AtprotoRecord: recordSpec}, child: &atprotov1alpha1.AtprotoRecord{},
			spec: func(o client.Object) any { return o.(*atprotov1alpha1.AtprotoRecord).Spec }, want: *recordSpec,
			setReady: func(o client.Object) {
				r := o.(*atprotov1alpha1.AtprotoRecord)
				r.Status.ObservedGeneration = r.Generation
				r.Status.Conditions = []metav1.Condition{{Type: atprotov1alpha1.ConditionSynced, Status: metav1.ConditionTrue, Reason: atprotov1alpha1.ReasonSynced, LastTransitionTime: metav1.Now()}}
			},
		},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			r, ws := setup(application(false), component(tc.tmpl))
			reconcileComponent(t, r)

			child := tc.child
			if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "profile"}, child); err != nil {
				t.Fatalf("the %s was not created: %v", tc.kind, err)
			}
			ref := metav1.GetControllerOf(child)
			if ref == nil || ref.UID != "comp-uid" || ref.Kind != "Component" || ref.Name != "profile" || ref.APIVersion != appsv1alpha1.GroupVersion.String() {
				t.Fatalf("%s owners %+v, want the Component as controller", tc.kind, child.GetOwnerReferences())
			}
			if got := tc.spec(child); !equalJSON(t, got, tc.want) {
				t.Fatalf("%s spec %+v, want the template %+v", tc.kind, got, tc.want)
			}
			comp := getComponent(t, ws)
			checkReady(t, comp, appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing)
			if comp.Status.Child == nil || comp.Status.Child.Kind != tc.kind || comp.Status.Child.Name != "profile" {
				t.Fatalf("status.child %+v", comp.Status.Child)
			}
			if meta.FindStatusCondition(comp.Status.Conditions, suspend.ConditionType) != nil {
				t.Fatalf("a never-suspended component has a Suspended condition: %+v", comp.Status.Conditions)
			}

			// The child's controller reports it ready: so is the Component.
			tc.setReady(child)
			if err := ws.Client.Status().Update(ctx, child); err != nil {
				t.Fatal(err)
			}
			reconcileComponent(t, r)
			checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentReady, metav1.ConditionTrue, appsv1alpha1.ReasonReady)
			if got, want := ws.Events.Reasons(), []string{"Progressing", "Ready"}; !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
		})
	}
}

// equalJSON reports whether a and b marshal to the same JSON value (a
// JSON field's raw bytes may be reformatted by the store).
func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	var va, vb any
	for _, p := range []struct {
		in  any
		out *any
	}{{a, &va}, {b, &vb}} {
		raw, err := json.Marshal(p.in)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, p.out); err != nil {
			t.Fatal(err)
		}
	}
	return reflect.DeepEqual(va, vb)
}

// While the Application is suspended, the Component is Suspended (Ready
// False and a Suspended condition naming the Application) and neither
// creates nor changes its child; a Component's own suspend does the same.
func TestSuspendedComponentCreatesAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	repo := appsv1alpha1.ComponentTemplate{AtprotoRepo: repoSpec}
	own := component(repo)
	own.Spec.Suspend = true
	for _, tc := range []struct {
		name string
		app  *appsv1alpha1.Application
		comp *appsv1alpha1.Component
		by   string
	}{
		{"application suspended", application(true), component(repo), "Application/app"},
		{"component suspended", application(false), own, "Component/profile"},
	} {
		t.Run(tc.name+", no child yet", func(t *testing.T) {
			r, ws := setup(tc.app, tc.comp)
			reconcileComponent(t, r)
			noChildren(t, ws)
			comp := getComponent(t, ws)
			checkReady(t, comp, appsv1alpha1.ComponentSuspended, metav1.ConditionFalse, appsv1alpha1.ReasonSuspended)
			s := meta.FindStatusCondition(comp.Status.Conditions, suspend.ConditionType)
			if s == nil || s.Status != metav1.ConditionTrue || s.Reason != suspend.ReasonSuspended || !strings.Contains(s.Message, tc.by) {
				t.Fatalf("Suspended condition %+v, want True naming %s", s, tc.by)
			}
			if got := ws.Events.Reasons(); !slices.Equal(got, []string{"Suspended"}) {
				t.Fatalf("events %v", got)
			}
		})
		t.Run(tc.name+", child exists", func(t *testing.T) {
			// The child was made from an older template.
			stale := &atprotov1alpha1.AtprotoRepo{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "profile", OwnerReferences: []metav1.OwnerReference{{
					APIVersion: appsv1alpha1.GroupVersion.String(), Kind: "Component", Name: "profile", UID: "comp-uid", Controller: ptr.To(true),
				}}},
				Spec: *repoSpec.DeepCopy(),
			}
			stale.Spec.PDS.URL = "https://old.example"
			r, ws := setup(tc.app, tc.comp, stale)
			reconcileComponent(t, r)
			got := &atprotov1alpha1.AtprotoRepo{}
			if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "profile"}, got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.PDS.URL != "https://old.example" {
				t.Fatalf("a suspended component changed its child: pds %s", got.Spec.PDS.URL)
			}
			checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentSuspended, metav1.ConditionFalse, appsv1alpha1.ReasonSuspended)
		})
	}
}

// A Component that no Application controls, or whose Application is gone,
// is Failed with ApplicationNotFound and creates nothing.
func TestComponentWithoutApplicationIsApplicationNotFound(t *testing.T) {
	repo := appsv1alpha1.ComponentTemplate{AtprotoRepo: repoSpec}
	for _, tc := range []struct {
		name string
		objs []client.Object
	}{
		{"no owner", []client.Object{component(repo, []metav1.OwnerReference{}...)}},
		{"owner deleted", []client.Object{component(repo)}},
		{"owner recreated", []client.Object{func() client.Object { a := application(false); a.UID = "new-uid"; return a }(), component(repo)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ws := setup(tc.objs...)
			reconcileComponent(t, r)
			noChildren(t, ws)
			checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentFailed, metav1.ConditionFalse, appsv1alpha1.ReasonApplicationNotFound)
			if ev := ws.Events.Events(); len(ev) != 1 || ev[0].Type != "Warning" || ev[0].Reason != "Failed" {
				t.Fatalf("events %+v, want one Warning Failed", ev)
			}
		})
	}
}

// A template that sets no child kind, or both, is Failed with InvalidSpec
// and creates nothing.
func TestInvalidTemplateIsInvalidSpec(t *testing.T) {
	for name, tmpl := range map[string]appsv1alpha1.ComponentTemplate{
		"no kind":   {},
		"two kinds": {AtprotoRepo: repoSpec, AtprotoRecord: recordSpec},
	} {
		t.Run(name, func(t *testing.T) {
			r, ws := setup(application(false), component(tmpl))
			reconcileComponent(t, r)
			noChildren(t, ws)
			checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentFailed, metav1.ConditionFalse, appsv1alpha1.ReasonInvalidSpec)
		})
	}
}

// An object of the child's name that the Component does not control is a
// Conflict and is left as it is.
func TestForeignChildIsConflict(t *testing.T) {
	foreign := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "profile"}, Spec: *repoSpec.DeepCopy()}
	foreign.Spec.PDS.URL = "https://theirs.example"
	r, ws := setup(application(false), component(appsv1alpha1.ComponentTemplate{AtprotoRepo: repoSpec}), foreign)
	reconcileComponent(t, r)
	checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentFailed, metav1.ConditionFalse, appsv1alpha1.ReasonConflict)
	got := &atprotov1alpha1.AtprotoRepo{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "profile"}, got); err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 0 || got.Spec.PDS.URL != "https://theirs.example" {
		t.Fatalf("the foreign object was changed: %+v", got)
	}
}

// A deleted Component (kept by a finalizer here) is Deleting and creates
// no child.
func TestDeletingComponentCreatesNothing(t *testing.T) {
	ctx := context.Background()
	comp := component(appsv1alpha1.ComponentTemplate{AtprotoRepo: repoSpec})
	comp.Finalizers = []string{"test.knotless.dev/hold"}
	r, ws := setup(application(false), comp)
	if err := ws.Client.Delete(ctx, getComponent(t, ws)); err != nil {
		t.Fatal(err)
	}
	reconcileComponent(t, r)
	noChildren(t, ws)
	checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentDeleting, metav1.ConditionFalse, appsv1alpha1.ReasonDeleting)
}

// TestTemplateThatMovesTheRecordRecreatesIt: a template whose rkey
// changes cannot update the AtprotoRecord (repoRef, collection and rkey
// are immutable): the component deletes it, waits for it to go, and then
// creates it again from the template.
func TestTemplateThatMovesTheRecordRecreatesIt(t *testing.T) {
	spec := func(rkey string) *atprotov1alpha1.AtprotoRecordSpec {
		return &atprotov1alpha1.AtprotoRecordSpec{RepoRef: atprotov1alpha1.LocalObjectRef{Name: "repo"}, Collection: "app.bsky.actor.profile", RKey: rkey, Value: apiextensionsv1.JSON{Raw: []byte(`{}`)}}
	}
	comp := component(appsv1alpha1.ComponentTemplate{AtprotoRecord: spec("self")})
	r, ws := setup(application(false), comp)
	reconcileComponent(t, r)
	rec := &atprotov1alpha1.AtprotoRecord{}
	key := client.ObjectKey{Namespace: ns, Name: "profile"}
	if err := ws.Client.Get(context.Background(), key, rec); err != nil || rec.Spec.RKey != "self" {
		t.Fatalf("record %+v, %v", rec.Spec, err)
	}

	comp = getComponent(t, ws)
	comp.Spec.Template.AtprotoRecord = spec("other")
	comp.Generation = 2
	if err := ws.Client.Update(context.Background(), comp); err != nil {
		t.Fatal(err)
	}
	reconcileComponent(t, r)
	if err := ws.Client.Get(context.Background(), key, rec); err == nil && rec.DeletionTimestamp.IsZero() {
		t.Fatalf("the record that moves was not deleted: %+v", rec.Spec)
	}
	checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing)

	reconcileComponent(t, r) // the old object is gone (no finalizer in the fake)
	if err := ws.Client.Get(context.Background(), key, rec); err != nil || rec.Spec.RKey != "other" {
		t.Fatalf("record after the move %+v, %v", rec.Spec, err)
	}
}

// TestNoRecordIntoARepoBeingDeleted: a record component whose repo is
// being deleted makes no record (the repo's finalizer would delete it
// again) and says why.
func TestNoRecordIntoARepoBeingDeleted(t *testing.T) {
	now := metav1.Now()
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo", DeletionTimestamp: &now, Finalizers: []string{"atproto.knotless.dev/records"}}}
	comp := component(appsv1alpha1.ComponentTemplate{AtprotoRecord: &atprotov1alpha1.AtprotoRecordSpec{
		RepoRef: atprotov1alpha1.LocalObjectRef{Name: "repo"}, Collection: "app.bsky.actor.profile", RKey: "self", Value: apiextensionsv1.JSON{Raw: []byte(`{}`)}}})
	r, ws := setup(application(false), comp, repo)
	res, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "profile"}}})
	if err != nil || res.RequeueAfter == 0 {
		t.Fatalf("reconcile: %+v, %v; want a requeue", res, err)
	}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "profile"}, &atprotov1alpha1.AtprotoRecord{}); err == nil {
		t.Fatal("a record was made into a repo being deleted")
	}
	c := checkReady(t, getComponent(t, ws), appsv1alpha1.ComponentProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing)
	if !strings.Contains(c.Message, "being deleted") {
		t.Fatalf("message %q", c.Message)
	}
}

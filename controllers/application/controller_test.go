package application

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
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
		{"a requester", appsv1alpha1.ApplicationComponent{Name: "vms", Template: appsv1alpha1.ComponentTemplate{MarketRequester: &marketv1alpha1.MarketRequesterSpec{}}}, true},
		{"a requester and a repo", appsv1alpha1.ApplicationComponent{Name: "x", Template: appsv1alpha1.ComponentTemplate{AtprotoRepo: repo, MarketRequester: &marketv1alpha1.MarketRequesterSpec{}}}, false},
	} {
		err := validate(&appsv1alpha1.Application{Spec: appsv1alpha1.ApplicationSpec{Components: []appsv1alpha1.ApplicationComponent{tc.c}}})
		if (err == nil) != tc.ok {
			t.Errorf("%s: validate = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

const (
	lc = "2x7uf0bml0q9ms3b"
	ns = "shop"
)

func repoTemplate(url string) appsv1alpha1.ComponentTemplate {
	return appsv1alpha1.ComponentTemplate{AtprotoRepo: &atprotov1alpha1.AtprotoRepoSpec{
		PDS:        atprotov1alpha1.PDS{URL: url},
		Credential: atprotov1alpha1.Credential{Identifier: "alice.test", SecretKeyRef: &atprotov1alpha1.SecretKeyRef{Name: "cred", Key: "password"}},
	}}
}

func recordTemplate(rkey string) appsv1alpha1.ComponentTemplate {
	return appsv1alpha1.ComponentTemplate{AtprotoRecord: &atprotov1alpha1.AtprotoRecordSpec{
		RepoRef: atprotov1alpha1.LocalObjectRef{Name: "repo"}, Collection: "dev.knotless.test.thing", RKey: rkey,
	}}
}

func newApp(suspend bool, comps ...appsv1alpha1.ApplicationComponent) *appsv1alpha1.Application {
	return &appsv1alpha1.Application{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app", UID: "app-uid", Generation: 1},
		Spec:       appsv1alpha1.ApplicationSpec{Suspend: suspend, Components: comps},
	}
}

// ownedComponent is a Component the Application "app" controls.
func ownedComponent(name string, tmpl appsv1alpha1.ComponentTemplate) *appsv1alpha1.Component {
	return &appsv1alpha1.Component{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: appsv1alpha1.GroupVersion.String(), Kind: "Application", Name: "app", UID: "app-uid", Controller: ptr.To(true),
		}}},
		Spec: appsv1alpha1.ComponentSpec{Template: tmpl},
	}
}

func setup(objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	ws := clustertest.New(objs...)
	return &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws})}, ws
}

func reconcileApp(t *testing.T, r *Reconciler) {
	t.Helper()
	res, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "app"}}})
	if err != nil || res != (reconcile.Result{}) {
		t.Fatalf("reconcile: %+v, %v", res, err)
	}
}

func getApp(t *testing.T, ws *clustertest.Cluster) *appsv1alpha1.Application {
	t.Helper()
	app := &appsv1alpha1.Application{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "app"}, app); err != nil {
		t.Fatal(err)
	}
	return app
}

func getComponent(t *testing.T, ws *clustertest.Cluster, name string) (*appsv1alpha1.Component, bool) {
	t.Helper()
	comp := &appsv1alpha1.Component{}
	err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, comp)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return comp, true
}

// checkStatus fails unless the Application's status has phase and a Ready
// condition with status and reason, both for its current generation.
func checkStatus(t *testing.T, app *appsv1alpha1.Application, phase appsv1alpha1.ApplicationPhase, status metav1.ConditionStatus, reason string) {
	t.Helper()
	c := meta.FindStatusCondition(app.Status.Conditions, appsv1alpha1.ConditionReady)
	if app.Status.Phase != phase || app.Status.ObservedGeneration != app.Generation || c == nil ||
		c.Status != status || c.Reason != reason || c.ObservedGeneration != app.Generation {
		t.Fatalf("status %+v, want phase %s and Ready=%s/%s", app.Status, phase, status, reason)
	}
}

// Each entry of spec.components becomes a Component of that name with the
// entry's template, controlled by the Application; the Application's
// phase follows its Components' phases.
func TestApplicationCreatesOwnedComponents(t *testing.T) {
	ctx := context.Background()
	entries := []appsv1alpha1.ApplicationComponent{
		{Name: "repo", Template: repoTemplate("https://pds.example")},
		{Name: "profile", Template: recordTemplate("self")},
	}
	r, ws := setup(newApp(false, entries...))
	reconcileApp(t, r)

	app := getApp(t, ws)
	for _, e := range entries {
		comp, ok := getComponent(t, ws, e.Name)
		if !ok {
			t.Fatalf("component %s was not created", e.Name)
		}
		ref := metav1.GetControllerOf(comp)
		if ref == nil || ref.UID != app.UID || ref.Kind != "Application" || ref.Name != "app" || ref.APIVersion != appsv1alpha1.GroupVersion.String() {
			t.Fatalf("component %s controller %+v, want the Application", e.Name, comp.OwnerReferences)
		}
		if !apiequality.Semantic.DeepEqual(comp.Spec.Template, e.Template) || comp.Spec.Suspend {
			t.Fatalf("component %s spec %+v, want the entry's template", e.Name, comp.Spec)
		}
	}
	checkStatus(t, app, appsv1alpha1.ApplicationProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing)

	// One Component Ready: still Progressing. Both: Ready.
	for i, name := range []string{"repo", "profile"} {
		comp, _ := getComponent(t, ws, name)
		comp.Status.Phase, comp.Status.ObservedGeneration = appsv1alpha1.ComponentReady, comp.Generation
		if err := ws.Client.Status().Update(ctx, comp); err != nil {
			t.Fatal(err)
		}
		reconcileApp(t, r)
		if i == 0 {
			checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing)
		}
	}
	checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationReady, metav1.ConditionTrue, appsv1alpha1.ReasonReady)

	// A Component failing fails the Application.
	comp, _ := getComponent(t, ws, "profile")
	comp.Status.Phase = appsv1alpha1.ComponentFailed
	if err := ws.Client.Status().Update(ctx, comp); err != nil {
		t.Fatal(err)
	}
	reconcileApp(t, r)
	checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationFailed, metav1.ConditionFalse, appsv1alpha1.ReasonFailed)
	if got, want := ws.Events.Reasons(), []string{"Progressing", "Ready", "Failed"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v (one per phase change)", got, want)
	}
}

// A Component of the entry's name that the Application does not control is
// a Conflict: it is neither adopted nor changed.
func TestForeignComponentIsConflict(t *testing.T) {
	foreign := ownedComponent("repo", recordTemplate("theirs"))
	foreign.OwnerReferences = nil
	r, ws := setup(newApp(false, appsv1alpha1.ApplicationComponent{Name: "repo", Template: repoTemplate("https://pds.example")}), foreign)
	reconcileApp(t, r)
	checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationFailed, metav1.ConditionFalse, appsv1alpha1.ReasonConflict)
	comp, _ := getComponent(t, ws, "repo")
	if len(comp.OwnerReferences) != 0 || !apiequality.Semantic.DeepEqual(comp.Spec.Template, recordTemplate("theirs")) {
		t.Fatalf("the foreign component was changed: %+v", comp)
	}
}

// While suspended, the Application is Suspended and creates and changes no
// Component, but still deletes the Components of removed entries (R04:
// clean-up is never blocked). Resuming catches up.
func TestSuspendedApplicationCreatesAndChangesNoComponent(t *testing.T) {
	ctx := context.Background()
	old, updated := repoTemplate("https://old.example"), repoTemplate("https://new.example")
	r, ws := setup(
		newApp(true,
			appsv1alpha1.ApplicationComponent{Name: "repo", Template: updated},
			appsv1alpha1.ApplicationComponent{Name: "profile", Template: recordTemplate("self")}),
		ownedComponent("repo", old),
		ownedComponent("removed", recordTemplate("gone")),
	)
	reconcileApp(t, r)

	checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationSuspended, metav1.ConditionFalse, appsv1alpha1.ReasonSuspended)
	if comp, _ := getComponent(t, ws, "repo"); !apiequality.Semantic.DeepEqual(comp.Spec.Template, old) {
		t.Fatalf("a suspended application changed component repo: %+v", comp.Spec.Template)
	}
	if _, ok := getComponent(t, ws, "profile"); ok {
		t.Fatal("a suspended application created component profile")
	}
	if _, ok := getComponent(t, ws, "removed"); ok {
		t.Fatal("the component of a removed entry was kept while suspended (R04)")
	}

	// Resume.
	app := getApp(t, ws)
	app.Spec.Suspend = false
	if err := ws.Client.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	reconcileApp(t, r)
	if comp, _ := getComponent(t, ws, "repo"); !apiequality.Semantic.DeepEqual(comp.Spec.Template, updated) {
		t.Fatalf("after resuming, component repo has template %+v", comp.Spec.Template)
	}
	if comp, ok := getComponent(t, ws, "profile"); !ok || !metav1.IsControlledBy(comp, app) {
		t.Fatal("after resuming, component profile was not created under the application")
	}
	checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationProgressing, metav1.ConditionFalse, appsv1alpha1.ReasonProgressing)
	if got, want := ws.Events.Reasons(), []string{"Suspended", "Resumed"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

// An invalid spec is Failed/InvalidSpec and touches no Component, not even
// the removal of Components of entries that are gone.
func TestInvalidApplicationTouchesNoComponent(t *testing.T) {
	r, ws := setup(
		newApp(false, appsv1alpha1.ApplicationComponent{Name: "Not_A_Label", Template: repoTemplate("https://pds.example")}),
		ownedComponent("kept", recordTemplate("self")),
	)
	reconcileApp(t, r)
	checkStatus(t, getApp(t, ws), appsv1alpha1.ApplicationFailed, metav1.ConditionFalse, appsv1alpha1.ReasonInvalidSpec)
	var list appsv1alpha1.ComponentList
	if err := ws.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "kept" {
		t.Fatalf("components %+v, want only the existing one", list.Items)
	}
}

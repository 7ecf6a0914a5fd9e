package atprotorepo

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/suspend"
)

const (
	lc = "2x7uf0bml0q9ms3b"
	ns = "shop"
)

// local allows plain http to the loopback address the fake PDS listens on.
var local = netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)

func repoOn(url string) *atprotov1alpha1.AtprotoRepo {
	return &atprotov1alpha1.AtprotoRepo{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo", UID: "repo-uid", Generation: 1},
		Spec: atprotov1alpha1.AtprotoRepoSpec{
			PDS:        atprotov1alpha1.PDS{URL: url},
			Credential: atprotov1alpha1.Credential{Identifier: pdstest.Handle, SecretKeyRef: &atprotov1alpha1.SecretKeyRef{Name: "cred", Key: "password"}},
		},
	}
}

func credential(password string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cred"}, Data: map[string][]byte{"password": []byte(password)}}
}

// setup returns a reconciler of one workspace holding objs.
func setup(policy *netpolicy.Policy, objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	ws := clustertest.NewWithClient(clustertest.NewClientBuilder().
		WithIndex(&atprotov1alpha1.AtprotoRecord{}, names.RecordsByRepo, func(o client.Object) []string {
			return []string{o.(*atprotov1alpha1.AtprotoRecord).Spec.RepoRef.Name}
		}).
		WithObjects(objs...).Build())
	return &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}), Pool: &repoconn.Pool{Policy: policy}}, ws
}

func reconcileRepo(r *Reconciler) (reconcile.Result, error) {
	return r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "repo"}}})
}

func getRepo(t *testing.T, ws *clustertest.Cluster) *atprotov1alpha1.AtprotoRepo {
	t.Helper()
	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "repo"}, repo); err != nil {
		t.Fatal(err)
	}
	return repo
}

func ready(t *testing.T, repo *atprotov1alpha1.AtprotoRepo) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(repo.Status.Conditions, atprotov1alpha1.ConditionReady)
	if c == nil {
		t.Fatalf("no Ready condition in %+v", repo.Status)
	}
	return c
}

// A login against the PDS puts the account's DID, handle and revision, as
// the PDS reports them, in status; the session is kept in a Secret owned
// by the repo, so the next reconcile does not log in again.
func TestLoginSetsDIDAndHandle(t *testing.T) {
	f := pdstest.New(t)
	r, ws := setup(local, repoOn(f.URL()), credential(pdstest.Password))
	res, err := reconcileRepo(r)
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != 5*time.Minute {
		t.Fatalf("result %+v, want the default resync", res)
	}
	repo := getRepo(t, ws)
	if c := ready(t, repo); c.Status != metav1.ConditionTrue || c.Reason != atprotov1alpha1.ReasonReady || c.ObservedGeneration != 1 {
		t.Fatalf("Ready = %+v", c)
	}
	if repo.Status.DID != pdstest.DID || repo.Status.Handle != pdstest.Handle || repo.Status.Rev == "" || repo.Status.ObservedGeneration != 1 {
		t.Fatalf("status %+v", repo.Status)
	}
	if !slices.Contains(repo.Finalizers, Finalizer) {
		t.Fatalf("finalizers %v", repo.Finalizers)
	}
	sess := &corev1.Secret{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: repoconn.SessionSecretName("repo")}, sess); err != nil {
		t.Fatalf("session Secret: %v", err)
	}
	if len(sess.OwnerReferences) != 1 || sess.OwnerReferences[0].UID != repo.UID {
		t.Fatalf("session Secret owners %+v, want the repo (R07)", sess.OwnerReferences)
	}
	if strings.Contains(string(sess.Data[repoconn.SessionKey]), pdstest.Password) {
		t.Fatal("the session Secret holds the password")
	}
	if got := ws.Events.Reasons(); !slices.Equal(got, []string{atprotov1alpha1.ReasonReady}) {
		t.Fatalf("events %v, want one Ready", got)
	}

	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls("com.atproto.server.createSession"); n != 1 {
		t.Fatalf("%d logins after two reconciles, want 1", n)
	}
	if got := ws.Events.Reasons(); len(got) != 1 {
		t.Fatalf("events %v: an unchanged status is not an event", got)
	}
}

// The PDS refusing the password is AuthenticationFailed, and is retried
// with backoff.
func TestWrongPasswordIsAuthenticationFailed(t *testing.T) {
	f := pdstest.New(t)
	r, ws := setup(local, repoOn(f.URL()), credential("wrong-"+pdstest.Password))
	if _, err := reconcileRepo(r); err == nil {
		t.Fatal("no error: the failure would not back off")
	}
	c := ready(t, getRepo(t, ws))
	if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonAuthenticationFailed {
		t.Fatalf("Ready = %+v", c)
	}
	if strings.Contains(c.Message, "wrong-") {
		t.Fatalf("the condition reveals the password: %s", c.Message)
	}
}

// A missing Secret is CredentialNotFound; nothing is sent to the PDS.
func TestMissingSecretIsCredentialNotFound(t *testing.T) {
	f := pdstest.New(t)
	r, ws := setup(local, repoOn(f.URL()))
	if _, err := reconcileRepo(r); err == nil {
		t.Fatal("no error: the failure would not back off")
	}
	repo := getRepo(t, ws)
	c := ready(t, repo)
	if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonCredentialNotFound || !strings.Contains(c.Message, "cred") {
		t.Fatalf("Ready = %+v", c)
	}
	if repo.Status.DID != "" {
		t.Fatalf("status %+v", repo.Status)
	}
	if n := f.Calls("com.atproto.server.createSession"); n != 0 {
		t.Fatalf("%d logins without a credential", n)
	}
	if got := ws.Events.Reasons(); !slices.Equal(got, []string{atprotov1alpha1.ReasonCredentialNotFound}) {
		t.Fatalf("events %v", got)
	}
}

// Plain http to a host the operator did not allow is InsecureURL, decided
// before the credential is read: the password never leaves (R19).
func TestHTTPToHostNotAllowedIsInsecureURL(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []client.Object
	}{
		{"with the credential", []client.Object{credential(pdstest.Password)}},
		{"credential not read first", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pdstest.New(t)
			// No policy: https only.
			r, ws := setup(nil, append(tc.objs, repoOn(f.URL()))...)
			if _, err := reconcileRepo(r); err == nil {
				t.Fatal("no error")
			}
			if c := ready(t, getRepo(t, ws)); c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonInsecureURL {
				t.Fatalf("Ready = %+v, want InsecureURL", c)
			}
			if n := f.Calls("com.atproto.server.createSession"); n != 0 {
				t.Fatalf("%d logins over plain http", n)
			}
		})
	}
}

// A deleted repo deletes its records first and goes once they are gone.
func TestDeletedRepoDeletesItsRecordsFirst(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	rec := func(name, repo string) *atprotov1alpha1.AtprotoRecord {
		return &atprotov1alpha1.AtprotoRecord{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{"atproto.knotless.dev/record"}},
			Spec:       atprotov1alpha1.AtprotoRecordSpec{RepoRef: atprotov1alpha1.LocalObjectRef{Name: repo}, Collection: "dev.knotless.test.thing", RKey: name},
		}
	}
	r, ws := setup(local, repoOn(f.URL()), credential(pdstest.Password), rec("mine", "repo"), rec("theirs", "other"))
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	if err := ws.Client.Delete(ctx, getRepo(t, ws)); err != nil {
		t.Fatal(err)
	}
	res, err := reconcileRepo(r)
	if err != nil || res.RequeueAfter == 0 {
		t.Fatalf("%+v, %v: want a requeue while records remain", res, err)
	}
	mine, theirs := &atprotov1alpha1.AtprotoRecord{}, &atprotov1alpha1.AtprotoRecord{}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine"}, mine); err != nil || mine.DeletionTimestamp.IsZero() {
		t.Fatalf("the repo's record is not being deleted (%v)", err)
	}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "theirs"}, theirs); err != nil || !theirs.DeletionTimestamp.IsZero() {
		t.Fatalf("another repo's record is being deleted (%v)", err)
	}
	if repo := getRepo(t, ws); !slices.Contains(repo.Finalizers, Finalizer) {
		t.Fatal("the repo went before its records")
	}

	// The record controller's finalizer is done: the repo goes.
	mine.Finalizers = nil
	if err := ws.Client.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "repo"}, &atprotov1alpha1.AtprotoRepo{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the repo is still there: %v", err)
	}
}

// TestSuspendedRepoDoesNotLogIn: a repo whose Application is suspended
// (through its Component) does not log in and says Suspended; resuming
// logs in.
func TestSuspendedRepoDoesNotLogIn(t *testing.T) {
	f := pdstest.New(t)
	app := &appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app", UID: "app-uid"}, Spec: appsv1alpha1.ApplicationSpec{Suspend: true}}
	comp := &appsv1alpha1.Component{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo", UID: "comp-uid",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: appsv1alpha1.GroupVersion.String(), Kind: "Application", Name: "app", UID: "app-uid", Controller: ptr.To(true)}}}}
	repo := repoOn(f.URL())
	repo.OwnerReferences = []metav1.OwnerReference{{APIVersion: appsv1alpha1.GroupVersion.String(), Kind: "Component", Name: "repo", UID: "comp-uid", Controller: ptr.To(true)}}
	r, ws := setup(local, app, comp, repo, credential(pdstest.Password))
	r.Scheme = apis.NewScheme()
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls("com.atproto.server.createSession"); n != 0 {
		t.Fatalf("a suspended repo logged in %d times", n)
	}
	got := getRepo(t, ws)
	if c := clustertest.Condition(t, got.Status.Conditions, suspend.ConditionType); c.Status != metav1.ConditionTrue {
		t.Fatalf("Suspended %+v", c)
	}
	// Not Ready: records outside the suspended chain must not log in
	// through it.
	if c := ready(t, got); c.Status != metav1.ConditionFalse || c.Reason != suspend.ReasonSuspended {
		t.Fatalf("Ready while suspended %+v", c)
	}

	app.Spec.Suspend = false
	if err := ws.Client.Update(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	got = getRepo(t, ws)
	if ready(t, got).Status != metav1.ConditionTrue || f.Calls("com.atproto.server.createSession") != 1 {
		t.Fatalf("after resume: Ready %+v, %d logins", ready(t, got), f.Calls("com.atproto.server.createSession"))
	}
	if c := clustertest.Condition(t, got.Status.Conditions, suspend.ConditionType); c.Status != metav1.ConditionFalse {
		t.Fatalf("Suspended after resume %+v", c)
	}
}

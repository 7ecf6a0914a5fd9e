package atprotorepo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
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
	"github.com/knotless-dev/knotless/internal/inventory"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
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

// setup returns a reconciler of one workspace holding objs. The account's
// DID document names the PDS of the AtprotoRepo among objs as
// http://localhost:<port>, as the reference PDS's do: the fake PDSes
// listen on 127.0.0.1.
func setup(policy *netpolicy.Policy, objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	pdsURL := "http://localhost:2583"
	for _, o := range objs {
		if repo, ok := o.(*atprotov1alpha1.AtprotoRepo); ok {
			pdsURL = pdstest.Localhost(repo.Spec.PDS.URL)
		}
	}
	return setupWith(policy, pdstest.Directory(pdsURL), objs...)
}

func setupWith(policy *netpolicy.Policy, dir identity.Directory, objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	ws := clustertest.NewWithClient(clustertest.NewClientBuilder().
		WithIndex(&atprotov1alpha1.AtprotoRecord{}, names.RecordsByRepo, func(o client.Object) []string {
			return []string{o.(*atprotov1alpha1.AtprotoRecord).Spec.RepoRef.Name}
		}).
		WithIndex(&atprotov1alpha1.AtprotoRecord{}, names.RecordsByKey, inventory.IndexByKey).
		WithObjects(objs...).Build())
	return &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}), Pool: &repoconn.Pool{Policy: policy, Directory: dir}}, ws
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

// A PDS that answers the login with another account's DID (one whose DID
// document names another PDS, or another handle) does not make the repo
// Ready: DIDMismatch, retried with backoff, and the status keeps no DID
// of it (R20).
func TestAnotherAccountsDIDIsDIDMismatch(t *testing.T) {
	for name, ident := range map[string]func(f *pdstest.PDS) identity.Identity{
		"another PDS": func(*pdstest.PDS) identity.Identity { return pdstest.Identity("https://pds.elsewhere.example") },
		"another handle": func(f *pdstest.PDS) identity.Identity {
			i := pdstest.Identity(pdstest.Localhost(f.URL()))
			i.AlsoKnownAs = []string{"at://bob.test"}
			return i
		},
		// Issue 29: another PDS of the same machine claims the account
		// of the PDS on another port.
		"another loopback port": func(*pdstest.PDS) identity.Identity { return pdstest.Identity("http://localhost:2583") },
	} {
		t.Run(name, func(t *testing.T) {
			f := pdstest.New(t)
			dir := identity.NewMockDirectory()
			dir.Insert(ident(f))
			r, ws := setupWith(local, dir, repoOn(f.URL()), credential(pdstest.Password))
			if _, err := reconcileRepo(r); err == nil {
				t.Fatal("no error: the failure would not back off")
			}
			repo := getRepo(t, ws)
			c := ready(t, repo)
			if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonDIDMismatch {
				t.Fatalf("Ready = %+v, want DIDMismatch", c)
			}
			if repo.Status.DID != "" || repo.Status.Rev != "" {
				t.Fatalf("status %+v: nothing of the account counts", repo.Status)
			}
			if r.Pool.Get(lc, repo) != nil {
				t.Fatal("the pool keeps a client of the mismatched account for records to write through")
			}
		})
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

const coll = "dev.knotless.test.thing"

func recordOf(name, repo, rkey string) *atprotov1alpha1.AtprotoRecord {
	return &atprotov1alpha1.AtprotoRecord{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid")},
		Spec:       atprotov1alpha1.AtprotoRecordSpec{RepoRef: atprotov1alpha1.LocalObjectRef{Name: repo}, Collection: coll, RKey: rkey},
	}
}

// written puts records on the fake PDS as the record controller writes
// them for owner: each with its marker in the inventory.
func written(t *testing.T, f *pdstest.PDS, owner string, rkeys ...string) {
	t.Helper()
	c, err := pds.Connect(context.Background(), f.URL(), pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &memStore{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range rkeys {
		if _, err := c.EnsureOwned(context.Background(), owner, pds.Key{Collection: coll, RKey: k}, json.RawMessage(`{"n":1}`), nil); err != nil {
			t.Fatal(err)
		}
	}
}

type memStore struct{ s *pds.Session }

func (m *memStore) Load(context.Context) (*pds.Session, error)   { return m.s, nil }
func (m *memStore) Save(_ context.Context, s *pds.Session) error { m.s = s; return nil }

func marker(owner, rkey string) string {
	return pds.InventoryCollection + "/" + pds.MarkerKey(owner, pds.Key{Collection: coll, RKey: rkey})
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// AtprotoRecords deleted while no provider ran: their records are in the
// repo's inventory, no object declares them, and the repo's check deletes
// them. A record of another writer in the same collection, one another
// repo object (of the same account) wrote, and one still declared stay.
func TestRepoPrunesRecordsDeletedWhileTheProviderWasDown(t *testing.T) {
	f := pdstest.New(t)
	written(t, f, "repo-uid", "kept", "deleted")
	written(t, f, "other-repo-uid", "theirs")
	f.SetRecord(coll, "foreign", json.RawMessage(`{"$type":"`+coll+`","by":"someone else"}`))
	r, ws := setup(local, repoOn(f.URL()), credential(pdstest.Password), recordOf("kept", "repo", "kept"))

	// Not before the workspace's cache has synced: it would declare nothing.
	ws.Unsynced = true
	if _, err := reconcileRepo(r); err == nil {
		t.Fatal("no error from a prune that waits for the cache")
	}
	if got := len(f.Keys()); got != 7 {
		t.Fatalf("the PDS has %v: something was pruned from an unsynced cache", f.Keys())
	}
	ws.Unsynced = false
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	want := sorted(coll+"/kept", coll+"/theirs", coll+"/foreign", marker("repo-uid", "kept"), marker("other-repo-uid", "theirs"))
	if got := f.Keys(); !slices.Equal(got, want) {
		t.Fatalf("the PDS has\n%v\nwant\n%v", got, want)
	}
	if got := ws.Events.Reasons(); !slices.Contains(got, "Pruned") {
		t.Fatalf("events %v, want Pruned", got)
	}
	// The revision is read after the prune's commit (the fake counts
	// commits: every applyWrites, and the other writer's record).
	if repo := getRepo(t, ws); repo.Status.Rev != fmt.Sprintf("3rev%09d", f.Calls("com.atproto.repo.applyWrites")+1) {
		t.Fatalf("status rev %s after %d commits", repo.Status.Rev, f.Calls("com.atproto.repo.applyWrites")+1)
	}
}

// A deleted repo deletes its AtprotoRecords (gone at once: they have no
// finalizer) and waits for those of older versions (LegacyFinalizer); then
// it deletes every record its inventory lists from the PDS, and goes. A
// record of another writer stays.
func TestDeletedRepoDeletesItsRecordsFirst(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	legacy := recordOf("legacy", "repo", "legacy")
	legacy.Finalizers = []string{"atproto.knotless.dev/record"}
	r, ws := setup(local, repoOn(f.URL()), credential(pdstest.Password), recordOf("mine", "repo", "mine"), legacy, recordOf("theirs", "other", "theirs"))
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	written(t, f, "repo-uid", "mine", "orphan")
	f.SetRecord(coll, "foreign", json.RawMessage(`{"$type":"`+coll+`","by":"someone else"}`))
	if err := ws.Client.Delete(ctx, getRepo(t, ws)); err != nil {
		t.Fatal(err)
	}
	res, err := reconcileRepo(r)
	if err != nil || res.RequeueAfter == 0 {
		t.Fatalf("%+v, %v: want a requeue while records remain", res, err)
	}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine"}, &atprotov1alpha1.AtprotoRecord{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the repo's record is not deleted (%v)", err)
	}
	got := &atprotov1alpha1.AtprotoRecord{}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "legacy"}, got); err != nil || got.DeletionTimestamp.IsZero() {
		t.Fatalf("the repo's legacy record is not being deleted (%v)", err)
	}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "theirs"}, got); err != nil || !got.DeletionTimestamp.IsZero() {
		t.Fatalf("another repo's record is being deleted (%v)", err)
	}
	if repo := getRepo(t, ws); !slices.Contains(repo.Finalizers, Finalizer) {
		t.Fatal("the repo went before its records")
	}
	if len(f.Keys()) != 5 {
		t.Fatalf("the PDS has %v: records went before the objects", f.Keys())
	}

	// The record controller's finalizer is done: the repo deletes what it
	// wrote and goes.
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "legacy"}, got); err != nil {
		t.Fatal(err)
	}
	got.Finalizers = nil
	if err := ws.Client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	if got := f.Keys(); !slices.Equal(got, []string{coll + "/foreign"}) {
		t.Fatalf("the PDS has %v, want only the other writer's record", got)
	}
	if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "repo"}, &atprotov1alpha1.AtprotoRepo{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the repo is still there: %v", err)
	}
}

// A repo whose PDS cannot be reached while it is deleted says why and
// waits; the records it wrote are not given up silently.
func TestDeletedRepoWaitsForItsPDS(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	r, ws := setup(local, repoOn(f.URL()), credential(pdstest.Password))
	if _, err := reconcileRepo(r); err != nil {
		t.Fatal(err)
	}
	written(t, f, "repo-uid", "mine")
	repo := getRepo(t, ws)
	repo.Spec.Credential.SecretKeyRef.Name = "missing"
	if err := ws.Client.Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if err := ws.Client.Delete(ctx, getRepo(t, ws)); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcileRepo(r); err == nil {
		t.Fatal("no error: the deletion would not back off")
	}
	repo = getRepo(t, ws)
	if c := ready(t, repo); c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonCredentialNotFound || !strings.Contains(c.Message, "records it wrote") {
		t.Fatalf("Ready = %+v", c)
	}
	if !slices.Contains(repo.Finalizers, Finalizer) || len(f.Keys()) != 2 {
		t.Fatalf("finalizers %v, PDS %v", repo.Finalizers, f.Keys())
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

package atprotorecord

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
	"github.com/knotless-dev/knotless/internal/repoconn"
)

const (
	lc   = "2x7uf0bml0q9ms3b"
	ns   = "shop"
	coll = "dev.knotless.test.thing"
)

// world is one workspace with a Ready repo on a fake PDS.
type world struct {
	t   *testing.T
	pds *pdstest.PDS
	ws  *clustertest.Cluster
	r   *Reconciler
}

func newWorld(t *testing.T, objs ...client.Object) *world {
	t.Helper()
	f := pdstest.New(t)
	repo := &atprotov1alpha1.AtprotoRepo{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo", UID: "repo-uid"},
		Spec: atprotov1alpha1.AtprotoRepoSpec{
			PDS:        atprotov1alpha1.PDS{URL: f.URL()},
			Credential: atprotov1alpha1.Credential{Identifier: pdstest.Handle, SecretKeyRef: &atprotov1alpha1.SecretKeyRef{Name: "cred", Key: "password"}},
		},
		Status: atprotov1alpha1.AtprotoRepoStatus{Conditions: []metav1.Condition{{
			Type: atprotov1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: atprotov1alpha1.ReasonReady, LastTransitionTime: metav1.Now(),
		}}},
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cred"}, Data: map[string][]byte{"password": []byte(pdstest.Password)}}
	ws := clustertest.New(append([]client.Object{repo, secret}, objs...)...)
	pool := &repoconn.Pool{Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)}
	return &world{t: t, pds: f, ws: ws, r: &Reconciler{
		GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}),
		Pool:       pool,
		Scheme:     apis.NewScheme(),
	}}
}

func record(name, collection, rkey, value string) *atprotov1alpha1.AtprotoRecord {
	return &atprotov1alpha1.AtprotoRecord{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid"), Generation: 1},
		Spec: atprotov1alpha1.AtprotoRecordSpec{
			RepoRef: atprotov1alpha1.LocalObjectRef{Name: "repo"}, Collection: collection, RKey: rkey,
			Value: apiextensionsv1.JSON{Raw: []byte(value)},
		},
	}
}

func (w *world) reconcile(name string) (reconcile.Result, error) {
	w.t.Helper()
	return w.r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}})
}

func (w *world) get(name string) *atprotov1alpha1.AtprotoRecord {
	w.t.Helper()
	rec := &atprotov1alpha1.AtprotoRecord{}
	if err := w.ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, rec); err != nil {
		w.t.Fatal(err)
	}
	return rec
}

// pdsCalls is the number of requests of every XRPC method the controller
// may send.
func (w *world) pdsCalls() int {
	n := 0
	for _, m := range []string{"com.atproto.server.createSession", "com.atproto.server.getSession", "com.atproto.server.refreshSession",
		"com.atproto.repo.getRecord", "com.atproto.repo.putRecord", "com.atproto.repo.deleteRecord", "com.atproto.repo.applyWrites", "com.atproto.sync.getLatestCommit"} {
		n += w.pds.Calls(m)
	}
	return n
}

// The record is written to the PDS with the repo's credential, and status
// is what the PDS returned for it (R01).
func TestRecordIsWrittenAndStatusIsTheReadBack(t *testing.T) {
	w := newWorld(t, record("note", coll, "self", `{"text":"hello","n":1}`))
	res, err := w.reconcile("note")
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter <= 0 {
		t.Fatalf("result %+v: a Synced record is read back again later", res)
	}
	value, cid, ok := w.pds.Record(coll, "self")
	if !ok {
		t.Fatalf("the PDS has no record; it has %v", w.pds.Keys())
	}
	var v map[string]any
	if err := json.Unmarshal(value, &v); err != nil || v["text"] != "hello" || v["$type"] != coll {
		t.Fatalf("PDS has %s (%v)", value, err)
	}
	if w.pds.Calls("com.atproto.server.createSession") != 1 {
		t.Fatalf("%d logins, want 1 with the repo's credential", w.pds.Calls("com.atproto.server.createSession"))
	}
	rec := w.get("note")
	c := clustertest.Condition(t, rec.Status.Conditions, atprotov1alpha1.ConditionSynced)
	if c.Status != metav1.ConditionTrue || c.Reason != atprotov1alpha1.ReasonSynced || c.ObservedGeneration != 1 {
		t.Fatalf("Synced = %+v", c)
	}
	if rec.Status.CID != cid || rec.Status.URI != "at://"+pdstest.DID+"/"+coll+"/self" || rec.Status.Rev == "" || rec.Status.ObservedGeneration != 1 {
		t.Fatalf("status %+v; the PDS has cid %s", rec.Status, cid)
	}
	if !slices.Contains(rec.Finalizers, Finalizer) {
		t.Fatalf("finalizers %v, want %s", rec.Finalizers, Finalizer)
	}

	// A change behind knotless's back is undone, with a warning.
	w.pds.SetRecord(coll, "self", json.RawMessage(`{"$type":"`+coll+`","text":"tampered"}`))
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	if value, restored, _ := w.pds.Record(coll, "self"); restored != cid {
		t.Fatalf("PDS has %s (%s), want the spec's value back (%s)", value, restored, cid)
	}
	if got := w.ws.Events.Reasons(); !slices.Contains(got, "Restored") {
		t.Fatalf("events %v, want Restored", got)
	}
}

// Bad input gives an InvalidSpec condition naming the field, and nothing
// is sent to the PDS (not even a login).
func TestInvalidRecordIsNotWritten(t *testing.T) {
	for _, tc := range []struct {
		name, collection, rkey, value, field string
	}{
		{"invalid NSID", "not an nsid", "self", `{}`, "collection"},
		{"invalid rkey", coll, "a/b", `{}`, "rkey"},
		{"float in value", coll, "self", `{"x":{"y":[0,1.5]}}`, "value.x.y[1]"},
		{"value not an object", coll, "self", `[1]`, "value"},
		{"$type of another collection", coll, "self", `{"$type":"dev.knotless.other"}`, "value.$type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, record("bad", tc.collection, tc.rkey, tc.value))
			if _, err := w.reconcile("bad"); err != nil {
				t.Fatalf("bad input is not retried, got error %v", err)
			}
			c := clustertest.Condition(t, w.get("bad").Status.Conditions, atprotov1alpha1.ConditionSynced)
			if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonInvalidSpec || !strings.Contains(c.Message, tc.field) {
				t.Fatalf("Synced = %+v, want InvalidSpec naming %s", c, tc.field)
			}
			if n := w.pdsCalls(); n != 0 || len(w.pds.Keys()) != 0 {
				t.Fatalf("%d requests reached the PDS, records %v", n, w.pds.Keys())
			}
			if got := w.ws.Events.Reasons(); !slices.Equal(got, []string{atprotov1alpha1.ReasonInvalidSpec}) {
				t.Fatalf("events %v, want one InvalidSpec", got)
			}
		})
	}
}

// A record of a repo that is not Ready waits: RepoNotReady, nothing sent.
func TestRecordOfRepoNotReadyWaits(t *testing.T) {
	w := newWorld(t, record("note", coll, "self", `{"n":1}`))
	repo := &atprotov1alpha1.AtprotoRepo{}
	ctx := context.Background()
	if err := w.ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "repo"}, repo); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&repo.Status.Conditions, metav1.Condition{Type: atprotov1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: atprotov1alpha1.ReasonAuthenticationFailed})
	if err := w.ws.Client.Status().Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	c := clustertest.Condition(t, w.get("note").Status.Conditions, atprotov1alpha1.ConditionSynced)
	if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonRepoNotReady || !strings.Contains(c.Message, atprotov1alpha1.ReasonAuthenticationFailed) {
		t.Fatalf("Synced = %+v, want RepoNotReady naming the repo's reason", c)
	}
	if n := w.pdsCalls(); n != 0 {
		t.Fatalf("%d requests reached the PDS", n)
	}
}

// Deleting the AtprotoRecord deletes the record from the PDS, then lets
// the object go.
func TestDeletedRecordIsRemovedFromThePDS(t *testing.T) {
	w := newWorld(t, record("note", coll, "self", `{"n":1}`), record("other", coll, "other", `{"n":2}`))
	for _, name := range []string{"note", "other"} {
		if _, err := w.reconcile(name); err != nil {
			t.Fatal(err)
		}
	}
	if keys := w.pds.Keys(); !slices.Equal(keys, []string{coll + "/other", coll + "/self"}) {
		t.Fatalf("PDS has %v", keys)
	}
	ctx := context.Background()
	if err := w.ws.Client.Delete(ctx, w.get("note")); err != nil {
		t.Fatal(err)
	}
	if rec := w.get("note"); rec.DeletionTimestamp.IsZero() {
		t.Fatal("the finalizer did not hold the object")
	}
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	if keys := w.pds.Keys(); !slices.Equal(keys, []string{coll + "/other"}) {
		t.Fatalf("PDS has %v after the deletion, want only the other record", keys)
	}
	err := w.ws.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "note"}, &atprotov1alpha1.AtprotoRecord{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the object is still there (%v): the finalizer was not removed", err)
	}
}

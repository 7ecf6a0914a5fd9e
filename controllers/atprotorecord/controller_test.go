package atprotorecord

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/inventory"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
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
	// writes counts the writes to kcp (creates, updates, patches,
	// applies, deletes, of objects and of their status).
	writes *atomic.Int64
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
		Status: atprotov1alpha1.AtprotoRepoStatus{DID: pdstest.DID, Conditions: []metav1.Condition{{
			Type: atprotov1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: atprotov1alpha1.ReasonReady, LastTransitionTime: metav1.Now(),
		}}},
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cred"}, Data: map[string][]byte{"password": []byte(pdstest.Password)}}
	fc := clustertest.NewClientBuilder().
		WithIndex(&atprotov1alpha1.AtprotoRecord{}, names.RecordsByRepo, func(o client.Object) []string {
			return []string{o.(*atprotov1alpha1.AtprotoRecord).Spec.RepoRef.Name}
		}).
		WithIndex(&atprotov1alpha1.AtprotoRecord{}, names.RecordsByKey, inventory.IndexByKey).
		WithObjects(append([]client.Object{repo, secret}, objs...)...).Build()
	writes := &atomic.Int64{}
	ws := clustertest.NewWithClient(countWrites(fc, writes))
	pool := &repoconn.Pool{Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil), Directory: f.Directory()}
	return &world{t: t, pds: f, ws: ws, writes: writes, r: &Reconciler{
		GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}),
		Pool:       pool,
		Scheme:     apis.NewScheme(),
	}}
}

// countWrites wraps c so that every write of an AtprotoRecord (object or
// status) adds one to n.
func countWrites(c client.WithWatch, n *atomic.Int64) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			count(n, obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			count(n, obj)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			count(n, obj)
			return c.Patch(ctx, obj, patch, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			count(n, obj)
			return c.Apply(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			count(n, obj)
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			count(n, obj)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			count(n, obj)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			count(n, obj)
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
	})
}

// count adds one to n when obj is an AtprotoRecord (or its apply
// configuration).
func count(n *atomic.Int64, obj any) {
	raw, _ := json.Marshal(obj)
	var tm metav1.TypeMeta
	_ = json.Unmarshal(raw, &tm)
	if _, ok := obj.(*atprotov1alpha1.AtprotoRecord); ok || tm.Kind == "AtprotoRecord" {
		n.Add(1)
	}
}

// deleteObject deletes an AtprotoRecord as kcp does (it has no finalizer)
// and hands the deletion to the controller's handler, as the informer would.
func (w *world) deleteObject(name string) {
	w.t.Helper()
	rec := w.get(name)
	if err := w.ws.Client.Delete(context.Background(), rec); err != nil {
		w.t.Fatal(err)
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[mcreconcile.Request]())
	defer q.ShutDown()
	w.r.remember()(lc, w.ws).Delete(context.Background(), event.TypedDeleteEvent[client.Object]{Object: rec}, q)
	if q.Len() != 1 {
		w.t.Fatalf("the deletion enqueued %d requests, want 1", q.Len())
	}
}

// markerOf is the PDS key of the repo's marker of a record.
func markerOf(rkey string) string {
	return pds.InventoryCollection + "/" + pds.MarkerKey("repo-uid", pds.Key{Collection: coll, RKey: rkey})
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
	// Two writes to kcp per record: the user's create (not counted here)
	// and the status. No finalizer: the record is in the inventory.
	if len(rec.Finalizers) != 0 || len(rec.OwnerReferences) != 0 {
		t.Fatalf("finalizers %v, owners %v: want none", rec.Finalizers, rec.OwnerReferences)
	}
	if n := w.writes.Load(); n != 1 {
		t.Fatalf("%d writes to kcp, want 1 (the status)", n)
	}
	if _, _, ok := w.pds.Record(pds.InventoryCollection, pds.MarkerKey("repo-uid", pds.Key{Collection: coll, RKey: "self"})); !ok {
		t.Fatalf("no marker of the record in the repo's inventory; the PDS has %v", w.pds.Keys())
	}
	if batches := w.pds.ApplyBatches(); !slices.Equal(batches, []int{2}) {
		t.Fatalf("applyWrites %v, want one commit of the record and its marker", batches)
	}

	// The repo moves (another record written): a resync of the unchanged
	// record writes nothing to kcp (status.rev stays that of its write).
	w.pds.SetRecord(coll, "unrelated", json.RawMessage(`{"$type":"`+coll+`"}`))
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	if n := w.writes.Load(); n != 1 || w.get("note").Status.Rev != rec.Status.Rev {
		t.Fatalf("%d writes to kcp after a resync of an unchanged record (rev %s, was %s), want still 1", n, w.get("note").Status.Rev, rec.Status.Rev)
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

// Deleting the AtprotoRecord (it goes at once: no finalizer) deletes its
// record and marker from the PDS; another record stays.
func TestDeletedRecordIsRemovedFromThePDS(t *testing.T) {
	w := newWorld(t, record("note", coll, "self", `{"n":1}`), record("other", coll, "other", `{"n":2}`))
	for _, name := range []string{"note", "other"} {
		if _, err := w.reconcile(name); err != nil {
			t.Fatal(err)
		}
	}
	if keys := w.pds.Keys(); !slices.Equal(keys, sorted(coll+"/other", coll+"/self", markerOf("other"), markerOf("self"))) {
		t.Fatalf("PDS has %v", keys)
	}
	w.deleteObject("note")
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	if keys := w.pds.Keys(); !slices.Equal(keys, sorted(coll+"/other", markerOf("other"))) {
		t.Fatalf("PDS has %v after the deletion, want only the other record", keys)
	}
	// Done: a second reconcile sends nothing.
	calls := w.pdsCalls()
	if _, err := w.reconcile("note"); err != nil || w.pdsCalls() != calls {
		t.Fatalf("%v, %d more PDS calls: the tombstone was not dropped", err, w.pdsCalls()-calls)
	}
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// A record that someone else wrote in the same collection, under a key no
// AtprotoRecord declared, is never deleted; a deleted AtprotoRecord whose
// key another AtprotoRecord declares keeps its record.
func TestPruneLeavesWhatKnotlessDoesNotOwn(t *testing.T) {
	w := newWorld(t, record("a", coll, "shared", `{"n":1}`), record("b", coll, "shared", `{"n":1}`), record("invalid", coll, "theirs", `{"x":1.5}`))
	for _, name := range []string{"a", "b", "invalid"} {
		if _, err := w.reconcile(name); err != nil {
			t.Fatal(err)
		}
	}
	theirs := json.RawMessage(`{"$type":"` + coll + `","by":"someone else"}`)
	w.pds.SetRecord(coll, "theirs", theirs)
	w.pds.SetRecord(coll, "foreign", theirs)
	// An object that never wrote its record (invalid spec) is deleted:
	// the record at its key is someone else's.
	w.deleteObject("invalid")
	w.deleteObject("a")
	for _, name := range []string{"invalid", "a"} {
		if _, err := w.reconcile(name); err != nil {
			t.Fatal(err)
		}
	}
	if keys := w.pds.Keys(); !slices.Equal(keys, sorted(coll+"/foreign", coll+"/shared", coll+"/theirs", markerOf("shared"))) {
		t.Fatalf("PDS has %v", keys)
	}
}

// A Component that moves its record deletes the AtprotoRecord and makes
// one of the same name at once: the old record is pruned when the new
// object is reconciled.
func TestMovedRecordLeavesTheOldKey(t *testing.T) {
	w := newWorld(t, record("note", coll, "old", `{"n":1}`))
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	w.deleteObject("note")
	moved := record("note", coll, "new", `{"n":1}`)
	moved.UID = "note-uid-2"
	if err := w.ws.Client.Create(context.Background(), moved); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	if keys := w.pds.Keys(); !slices.Equal(keys, sorted(coll+"/new", markerOf("new"))) {
		t.Fatalf("PDS has %v, want only the moved record", keys)
	}
}

// A deletion that cannot reach the PDS yet is retried: the object is gone,
// its tombstone stays until the prune succeeds.
func TestDeletionWaitsForTheRepo(t *testing.T) {
	w := newWorld(t, record("note", coll, "self", `{"n":1}`))
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	w.deleteObject("note")
	w.ws.Unsynced = true
	if _, err := w.reconcile("note"); err == nil {
		t.Fatal("a prune ran from a cache that has not synced")
	}
	if _, _, ok := w.pds.Record(coll, "self"); !ok {
		t.Fatal("the record went although the cache had not synced")
	}
	w.ws.Unsynced = false
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	if keys := w.pds.Keys(); len(keys) != 0 {
		t.Fatalf("PDS has %v", keys)
	}
}

// Objects of older knotless versions carry LegacyFinalizer (and maybe an
// owner reference to the repo): a live one is written into the inventory
// and loses both; one being deleted has its record deleted, then loses the
// finalizer.
func TestLegacyFinalizerIsMigrated(t *testing.T) {
	live := record("live", coll, "live", `{"n":1}`)
	live.Finalizers = []string{LegacyFinalizer}
	live.OwnerReferences = []metav1.OwnerReference{{APIVersion: atprotov1alpha1.GroupVersion.String(), Kind: "AtprotoRepo", Name: "repo", UID: "repo-uid"}}
	going := record("going", coll, "going", `{"n":2}`)
	going.Finalizers = []string{LegacyFinalizer}
	w := newWorld(t, live, going)
	// The older version wrote the records without markers.
	w.pds.SetRecord(coll, "live", json.RawMessage(`{"$type":"`+coll+`","n":1}`))
	w.pds.SetRecord(coll, "going", json.RawMessage(`{"$type":"`+coll+`","n":2}`))

	if _, err := w.reconcile("live"); err != nil {
		t.Fatal(err)
	}
	got := w.get("live")
	if len(got.Finalizers) != 0 || len(got.OwnerReferences) != 0 {
		t.Fatalf("finalizers %v, owners %v after the migration", got.Finalizers, got.OwnerReferences)
	}
	if c := clustertest.Condition(t, got.Status.Conditions, atprotov1alpha1.ConditionSynced); c.Status != metav1.ConditionTrue {
		t.Fatalf("Synced %+v", c)
	}
	if _, _, ok := w.pds.Record(pds.InventoryCollection, pds.MarkerKey("repo-uid", pds.Key{Collection: coll, RKey: "live"})); !ok {
		t.Fatal("the migrated record is not in the inventory")
	}

	if err := w.ws.Client.Delete(context.Background(), w.get("going")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reconcile("going"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := w.pds.Record(coll, "going"); ok {
		t.Fatal("the record of a deleted legacy object is still on the PDS")
	}
	if err := w.ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "going"}, &atprotov1alpha1.AtprotoRecord{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the legacy object is still there (%v): its finalizer was not removed", err)
	}
}

// The inventory's collection is knotless's own: no AtprotoRecord may name it.
func TestInventoryCollectionIsRefused(t *testing.T) {
	w := newWorld(t, record("forge", pds.InventoryCollection, "x", `{"owner":"someone"}`))
	if _, err := w.reconcile("forge"); err != nil {
		t.Fatal(err)
	}
	c := clustertest.Condition(t, w.get("forge").Status.Conditions, atprotov1alpha1.ConditionSynced)
	if c.Reason != atprotov1alpha1.ReasonInvalidSpec || !strings.Contains(c.Message, "collection") {
		t.Fatalf("Synced = %+v, want InvalidSpec naming the collection", c)
	}
	if n := w.pdsCalls(); n != 0 {
		t.Fatalf("%d requests reached the PDS", n)
	}
}

// A workspace member cannot end the workspace's live deal by publishing a
// release of its lease with an AtprotoRecord (the schema refuses this at
// admission; an object made before it did is refused here): a condition
// naming the kinds that own the collection, and nothing reaches the PDS.
func TestMarketCollectionIsRefused(t *testing.T) {
	lease := "at://" + pdstest.DID + "/" + lexicon.Lease + "/3lbdqbrdkys2a"
	release := `{"$type":"` + lexicon.Release + `","lease":{"uri":"` + lease + `","cid":"bafyreib2rxk3rh6kzwq"},"reason":"expired","createdAt":"2026-06-01T12:00:00.000Z"}`
	for _, tc := range []struct{ name, collection, value, owner string }{
		{"release of the live lease", lexicon.Release, release, "MarketRequester"},
		{"authority in capitals", "DEV.Knotless.Market.release", release, "MarketRequester"},
		{"a bid", lexicon.Bid, `{}`, "MarketBidder"},
		{"the inventory in capitals", "Dev.Knotless.inventory", `{}`, "inventory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, record("forge", tc.collection, "x", tc.value))
			if _, err := w.reconcile("forge"); err != nil {
				t.Fatalf("a refused collection is not retried, got error %v", err)
			}
			c := clustertest.Condition(t, w.get("forge").Status.Conditions, atprotov1alpha1.ConditionSynced)
			if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonInvalidSpec || !strings.Contains(c.Message, tc.owner) {
				t.Fatalf("Synced = %+v, want InvalidSpec naming %s", c, tc.owner)
			}
			if n := w.pdsCalls(); n != 0 || len(w.pds.Keys()) != 0 {
				t.Fatalf("%d requests reached the PDS, records %v", n, w.pds.Keys())
			}
		})
	}
}

// Only the repo changes its records act on reach them: not a new
// revision in its status.
func TestRepoChangesThatReachRecords(t *testing.T) {
	ready := func(st metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: atprotov1alpha1.ConditionReady, Status: st}}
	}
	base := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: atprotov1alpha1.AtprotoRepoStatus{DID: "did:plc:a", Rev: "1", Conditions: ready(metav1.ConditionTrue)}}
	p := repoChangedForRecords()
	for _, tc := range []struct {
		name string
		edit func(*atprotov1alpha1.AtprotoRepo)
		want bool
	}{
		{"revision", func(r *atprotov1alpha1.AtprotoRepo) { r.Status.Rev = "2" }, false},
		{"not Ready", func(r *atprotov1alpha1.AtprotoRepo) { r.Status.Conditions = ready(metav1.ConditionFalse) }, true},
		{"spec", func(r *atprotov1alpha1.AtprotoRepo) { r.Generation = 2 }, true},
		{"account", func(r *atprotov1alpha1.AtprotoRepo) { r.Status.DID = "did:plc:b" }, true},
		{"deleted", func(r *atprotov1alpha1.AtprotoRepo) { now := metav1.Now(); r.DeletionTimestamp = &now }, true},
	} {
		n := base.DeepCopy()
		tc.edit(n)
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A PDS that answers 429 with no reset backs the record off through the
// workqueue's growing delay (an error), never at a fixed second, which
// kept a PDS's login limit spent (from review); one that names its reset
// is waited for until then, at most an hour (R13).
func TestRateLimitWithoutResetBacksOff(t *testing.T) {
	w := newWorld(t, record("note", coll, "self", `{"text":"hello","n":1}`))
	if _, err := w.reconcile("note"); err != nil {
		t.Fatal(err)
	}
	w.pds.SetRateLimit(http.Header{})
	rec := w.get("note")
	rec.Spec.Value = apiextensionsv1.JSON{Raw: []byte(`{"text":"again","n":2}`)}
	if err := w.ws.Client.Update(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	res, err := w.reconcile("note")
	if err == nil || res.RequeueAfter != 0 {
		t.Fatalf("rate limited without a reset: result %+v, error %v; want an error (the workqueue backs off)", res, err)
	}
	w.pds.SetRateLimit(http.Header{"Retry-After": {"30"}})
	res, err = w.reconcile("note")
	if err != nil || res.RequeueAfter < 29*time.Second || res.RequeueAfter > 32*time.Second {
		t.Fatalf("rate limited for 30 s: result %+v, error %v; want a requeue after about 31 s", res, err)
	}
	w.pds.SetRateLimit(http.Header{"Retry-After": {"86400"}})
	if res, err = w.reconcile("note"); err != nil || res.RequeueAfter != pds.MaxRateLimitWait {
		t.Fatalf("rate limited for a day: result %+v, error %v; want a requeue after %v", res, err, pds.MaxRateLimitWait)
	}
}

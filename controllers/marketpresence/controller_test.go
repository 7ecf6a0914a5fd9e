package marketpresence

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/markettest"
)

const (
	lc  = "2x7uf0bml0q9ms3b"
	ns  = "default"
	did = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
)

func readyCond() []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}
}

func fixtures() []client.Object {
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo"}}
	repo.Status = atprotov1alpha1.AtprotoRepoStatus{DID: did, Conditions: readyCond()}
	id := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "seller"},
		Spec: marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: "repo"}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"}}}
	id.Status = marketv1alpha1.MarketIdentityStatus{DID: did, Conditions: readyCond()}
	p := &marketv1alpha1.MarketPresence{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b", Generation: 1, CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))},
		Spec: marketv1alpha1.MarketPresenceSpec{
			IdentityRef: marketv1alpha1.LocalRef{Name: "seller"}, Network: lexicon.Namespace, Driver: marketv1alpha1.DriverProcess, AcceptingRequests: true,
			Offers: []marketv1alpha1.PresenceOffer{{Offer: marketv1alpha1.Offer{Name: "small", CPUMillis: 1000, MemoryMiB: 1024, Capacity: 2,
				PricePerHour: marketv1alpha1.Price{Amount: 25, Currency: "USD-cents"}}, Free: 2}},
		},
	}
	return []client.Object{repo, id, p}
}

func setup(repo *markettest.Repo, objs ...client.Object) (*Reconciler, *clustertest.Cluster, *time.Time) {
	ws := clustertest.New(objs...)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{
		GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}),
		Connect: func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
			return repo, nil
		},
		Now: func() time.Time { return now },
	}
	return r, ws, &now
}

func reconcileIt(t *testing.T, r *Reconciler) {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "b"}}}); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, ws *clustertest.Cluster) *marketv1alpha1.MarketPresence {
	t.Helper()
	p := &marketv1alpha1.MarketPresence{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func record(t *testing.T, repo *markettest.Repo) map[string]any {
	t.Helper()
	rec, _ := repo.Get(context.Background(), lexicon.Presence, "b")
	if rec == nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(rec.Value, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPublish: the presence is published once, with status from the
// read-back; reconciling again (a restart) writes nothing; a changed
// offer is written with a new updatedAt.
func TestPublish(t *testing.T) {
	repo := markettest.New(did)
	r, ws, now := setup(repo, fixtures()...)
	reconcileIt(t, r)
	p := get(t, ws)
	if p.Status.Phase != marketv1alpha1.PhaseReady || p.Status.Record == nil || p.Status.Record.URI != "at://"+did+"/"+lexicon.Presence+"/b" || p.Status.Record.Rev == "" {
		t.Fatalf("status after publishing: %+v", p.Status)
	}
	if !meta.IsStatusConditionTrue(p.Status.Conditions, marketv1alpha1.ConditionPublished) || len(p.Finalizers) != 1 {
		t.Fatalf("conditions %+v finalizers %v", p.Status.Conditions, p.Finalizers)
	}
	m := record(t, repo)
	if m["updatedAt"] != "2026-12-01T12:00:00Z" || m["createdAt"] != "2026-12-01T10:00:00Z" || m["acceptingRequests"] != true || m["driver"] != "process" {
		t.Fatalf("record %v", m)
	}

	*now = now.Add(time.Hour)
	reconcileIt(t, r)
	if repo.Writes != 1 {
		t.Fatalf("%d writes after a second reconcile with nothing changed, want 1", repo.Writes)
	}

	p = get(t, ws)
	p.Spec.Offers[0].PricePerHour.Amount = 40
	p.Generation = 2
	if err := ws.Client.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r)
	m = record(t, repo)
	if repo.Writes != 2 || m["updatedAt"] != "2026-12-01T13:00:00Z" {
		t.Fatalf("after a price change: %d writes, record %v", repo.Writes, m)
	}
	if got := get(t, ws).Status.UpdatedAt; got == nil || !got.Time.Equal(*now) {
		t.Fatalf("status.updatedAt = %v, want %v", got, *now)
	}
}

// TestInvalidRecordIsNotWritten: a presence whose record does not match
// the lexicon (the schema would refuse it; here it is in the store
// anyway) is a Failed condition and nothing is written.
func TestInvalidRecordIsNotWritten(t *testing.T) {
	objs := fixtures()
	objs[2].(*marketv1alpha1.MarketPresence).Spec.Offers[0].PricePerHour.Amount = -1
	repo := markettest.New(did)
	r, ws, _ := setup(repo, objs...)
	reconcileIt(t, r)
	p := get(t, ws)
	cond := clustertest.Condition(t, p.Status.Conditions, marketv1alpha1.ConditionReady)
	if p.Status.Phase != marketv1alpha1.PhaseFailed || cond.Reason != marketv1alpha1.ReasonInvalidRecord || repo.Writes != 0 {
		t.Fatalf("phase %s, Ready %s: %s, %d writes", p.Status.Phase, cond.Reason, cond.Message, repo.Writes)
	}
}

// TestWaitsForIdentity: without a Ready identity nothing is written and
// the presence says what it waits for.
func TestWaitsForIdentity(t *testing.T) {
	objs := fixtures()
	repo := markettest.New(did)
	r, ws, _ := setup(repo, objs[0], objs[2])
	reconcileIt(t, r)
	p := get(t, ws)
	cond := clustertest.Condition(t, p.Status.Conditions, marketv1alpha1.ConditionReady)
	if p.Status.Phase != marketv1alpha1.PhasePending || cond.Reason != marketv1alpha1.ReasonNotFound || repo.Writes != 0 {
		t.Fatalf("phase %s, Ready %s: %s, %d writes", p.Status.Phase, cond.Reason, cond.Message, repo.Writes)
	}
}

// TestDeleteRemovesTheRecord: deleting the presence deletes its record,
// then the finalizer goes.
func TestDeleteRemovesTheRecord(t *testing.T) {
	repo := markettest.New(did)
	r, ws, _ := setup(repo, fixtures()...)
	reconcileIt(t, r)
	if err := ws.Client.Delete(context.Background(), get(t, ws)); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r)
	if m := record(t, repo); m != nil {
		t.Fatalf("record still there: %v", m)
	}
	err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, &marketv1alpha1.MarketPresence{})
	if err == nil {
		t.Fatal("the presence is still there after its finalizer ran")
	}
}

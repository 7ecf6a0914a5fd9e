package marketidentity

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/knotless-dev/knotless/internal/pds"
)

const (
	lc     = "2x7uf0bml0q9ms3b"
	ns     = "default"
	did    = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	bidder = "did:plc:44ybard66vv44zksje25o7dz"
	other  = "did:plc:vwzwgnygau7ed7b7wt5ux7y2"
)

func fixtures(operator string, assoc ...marketv1alpha1.Association) []client.Object {
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo"},
		Spec: atprotov1alpha1.AtprotoRepoSpec{PDS: atprotov1alpha1.PDS{URL: "https://pds.example"}}}
	repo.Status = atprotov1alpha1.AtprotoRepoStatus{DID: did, Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}}
	net := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "net"}, Spec: marketv1alpha1.MarketNetworkSpec{Firehoses: []string{"https://relay.example"}, OperatorDID: operator}}
	id := &marketv1alpha1.MarketIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "op", UID: "op-uid", Generation: 1, CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))},
		Spec:       marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: "repo"}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"}, ApprovedAssociations: assoc},
	}
	return []client.Object{repo, net, id}
}

func setup(repo *markettest.Repo, objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	ws := clustertest.NewWithClient(clustertest.NewClientBuilder().WithObjects(objs...).
		WithIndex(&marketv1alpha1.MarketIdentity{}, byRepo, func(o client.Object) []string {
			return []string{o.(*marketv1alpha1.MarketIdentity).Spec.RepoRef.Name}
		}).Build())
	return &Reconciler{
		GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}),
		Connect: func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
			return repo, nil
		},
	}, ws
}

func reconcileIt(t *testing.T, r *Reconciler, name string) reconcile.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func get(t *testing.T, ws *clustertest.Cluster, name string) *marketv1alpha1.MarketIdentity {
	t.Helper()
	id := &marketv1alpha1.MarketIdentity{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestAssociations: one record per approved association, keyed by DID;
// a record no longer approved (left by an earlier spec, or a crash) is
// deleted; the status lists what the PDS returned.
func TestAssociations(t *testing.T) {
	repo := markettest.New(did)
	repo.Put(lexicon.Association, other, []byte(`{"$type":"dev.knotless.market.association","subject":"`+other+`","roles":["bidder"],"createdAt":"2026-11-01T00:00:00Z"}`))
	r, ws := setup(repo, fixtures("", marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"requester", "bidder"}})...)
	reconcileIt(t, r, "op")

	recs, _ := repo.ListRecords(context.Background(), lexicon.Association, 100)
	if len(recs) != 1 || recs[0].URI != "at://"+did+"/"+lexicon.Association+"/"+bidder {
		t.Fatalf("records %+v", recs)
	}
	if want := `{"$type":"dev.knotless.market.association","createdAt":"2026-12-01T10:00:00Z","roles":["bidder","requester"],"subject":"` + bidder + `"}`; !pds.JSONEqual(recs[0].Value, []byte(want)) {
		t.Fatalf("record %s, want %s", recs[0].Value, want)
	}
	id := get(t, ws, "op")
	if id.Status.DID != did || id.Status.Phase != marketv1alpha1.PhaseReady || len(id.Status.Associations) != 1 || id.Status.Associations[0].CID != recs[0].CID {
		t.Fatalf("status %+v", id.Status)
	}
	if c := clustertest.Condition(t, id.Status.Conditions, marketv1alpha1.ConditionVouched); c.Reason != marketv1alpha1.ReasonNoOperator {
		t.Fatalf("Vouched %+v", c)
	}
	writes := repo.Writes
	// A restart (a new reconciler) writes nothing.
	r2, _ := setup(repo)
	r2.GetCluster = r.GetCluster
	reconcileIt(t, r2, "op")
	if repo.Writes != writes {
		t.Fatalf("%d writes after a restart, want %d", repo.Writes, writes)
	}

	// Deleting the identity deletes its records.
	if err := ws.Client.Delete(context.Background(), get(t, ws, "op")); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r2, "op")
	if recs, _ := repo.ListRecords(context.Background(), lexicon.Association, 100); len(recs) != 0 {
		t.Fatalf("records left after deletion: %+v", recs)
	}
}

// TestOperatorIsVouched: the network's operator vouches for itself.
func TestOperatorIsVouched(t *testing.T) {
	r, ws := setup(markettest.New(did), fixtures(did)...)
	reconcileIt(t, r, "op")
	if c := clustertest.Condition(t, get(t, ws, "op").Status.Conditions, marketv1alpha1.ConditionVouched); c.Status != metav1.ConditionTrue {
		t.Fatalf("Vouched %+v", c)
	}
}

// TestOneIdentityPerRepo: a second identity on the same repo is refused
// (both would delete each other's associations); the first is unaffected.
func TestOneIdentityPerRepo(t *testing.T) {
	objs := fixtures("")
	second := objs[2].DeepCopyObject().(*marketv1alpha1.MarketIdentity)
	second.Name, second.UID = "second", "second-uid"
	second.CreationTimestamp = metav1.NewTime(second.CreationTimestamp.Add(time.Minute))
	repo := markettest.New(did)
	r, ws := setup(repo, append(objs, second)...)
	reconcileIt(t, r, "second")
	reconcileIt(t, r, "op")
	if id := get(t, ws, "second"); id.Status.Phase != marketv1alpha1.PhaseFailed ||
		clustertest.Condition(t, id.Status.Conditions, marketv1alpha1.ConditionReady).Reason != marketv1alpha1.ReasonInvalidSpec {
		t.Fatalf("second identity: %+v", id.Status)
	}
	if id := get(t, ws, "op"); id.Status.Phase != marketv1alpha1.PhaseReady {
		t.Fatalf("first identity: %+v", id.Status)
	}
}

// TestPDSNotInNetwork: a repo on a PDS the network does not list fails
// with a reason and publishes nothing.
func TestPDSNotInNetwork(t *testing.T) {
	objs := fixtures("", marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"bidder"}})
	objs[1].(*marketv1alpha1.MarketNetwork).Spec.PDSHosts = []string{"https://other-pds.example"}
	repo := markettest.New(did)
	r, ws := setup(repo, objs...)
	reconcileIt(t, r, "op")
	id := get(t, ws, "op")
	if c := clustertest.Condition(t, id.Status.Conditions, marketv1alpha1.ConditionReady); c.Reason != marketv1alpha1.ReasonPDSNotInNetwork || repo.Writes != 0 {
		t.Fatalf("Ready %+v, %d writes", c, repo.Writes)
	}
}

// TestDeleteCleansTheRepo: deleting the identity deletes every association
// record of its repo and the presence records of the bidders that publish
// as it; a second identity of the same account deletes nothing.
func TestDeleteCleansTheRepo(t *testing.T) {
	objs := fixtures("", marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"bidder"}})
	second := objs[2].DeepCopyObject().(*marketv1alpha1.MarketIdentity)
	second.Name, second.UID = "second", "second-uid"
	second.CreationTimestamp = metav1.NewTime(second.CreationTimestamp.Add(time.Minute))
	presence := &marketv1alpha1.MarketPresence{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"},
		Spec: marketv1alpha1.MarketPresenceSpec{IdentityRef: marketv1alpha1.LocalRef{Name: "op"}}}
	repo := markettest.New(did)
	repo.Put(lexicon.Presence, "b", []byte(`{}`))
	r, ws := setup(repo, append(objs, second, presence)...)
	reconcileIt(t, r, "op")
	reconcileIt(t, r, "second")

	if err := ws.Client.Delete(context.Background(), get(t, ws, "second")); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r, "second")
	if recs, _ := repo.ListRecords(context.Background(), lexicon.Association, 100); len(recs) != 1 {
		t.Fatalf("the second identity's deletion touched the first's records: %+v", recs)
	}

	if err := ws.Client.Delete(context.Background(), get(t, ws, "op")); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r, "op")
	if recs, _ := repo.ListRecords(context.Background(), lexicon.Association, 100); len(recs) != 0 {
		t.Fatalf("association records left: %+v", recs)
	}
	if rec, _ := repo.Get(context.Background(), lexicon.Presence, "b"); rec != nil {
		t.Fatalf("presence record left: %s", rec.Value)
	}
}

// TestDeleteWithARepoThatNeverLoggedIn: an identity whose repo never
// logged in (a wrong credential) published nothing, and its deletion does
// not wait for that repo (which waits for the identity to go); one whose
// repo logged in once waits with a condition.
func TestDeleteWithARepoThatNeverLoggedIn(t *testing.T) {
	for _, everConnected := range []bool{false, true} {
		objs := fixtures("")
		repoObj := objs[0].(*atprotov1alpha1.AtprotoRepo)
		repoObj.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "CredentialNotFound", LastTransitionTime: metav1.Now()}}
		if !everConnected {
			repoObj.Status.DID = ""
		}
		id := objs[2].(*marketv1alpha1.MarketIdentity)
		id.Finalizers = []string{Finalizer}
		if everConnected {
			id.Status.DID = did
		}
		repo := markettest.New(did)
		r, ws := setup(repo, objs...)
		if err := ws.Client.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		_, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "op"}}})
		got := &marketv1alpha1.MarketIdentity{}
		getErr := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "op"}, got)
		switch {
		case !everConnected && (err != nil || !apierrors.IsNotFound(getErr)):
			t.Errorf("never logged in: %v, identity %v %+v", err, getErr, got.Status)
		case everConnected && (err == nil || getErr != nil || got.Status.Phase != marketv1alpha1.PhaseDeleting):
			t.Errorf("logged in once: %v, identity %v %+v", err, getErr, got.Status)
		}
	}
}

package marketidentity

import (
	"context"
	"strings"
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

// reconcileNoPanic reconciles name, failing on a panic, and returns the
// error.
func reconcileNoPanic(t *testing.T, r *Reconciler, name string) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Reconcile(%s) panicked: %v", name, p)
		}
	}()
	_, err = r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}})
	return err
}

func readyReason(t *testing.T, id *marketv1alpha1.MarketIdentity) string {
	t.Helper()
	return clustertest.Condition(t, id.Status.Conditions, marketv1alpha1.ConditionReady).Reason
}

// TestAttackAssociationDIDNotARecordKey: an approved association whose
// DID is a valid DID but not a valid record key ('%', or too long) is
// InvalidSpec and nothing is written or deleted.
func TestAttackAssociationDIDNotARecordKey(t *testing.T) {
	for name, bad := range map[string]string{
		"percent":   "did:web:evil.example%3A8443",
		"percent2f": "did:web:evil.example%2F..%2Fx",
		"too long":  "did:web:" + strings.Repeat("a", 600) + ".example",
	} {
		t.Run(name, func(t *testing.T) {
			repo := markettest.New(did)
			stale := `{"$type":"dev.knotless.market.association","subject":"` + other + `","roles":["bidder"],"createdAt":"2026-11-01T00:00:00Z"}`
			repo.Put(lexicon.Association, other, []byte(stale))
			r, ws := setup(repo, fixtures("",
				marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"bidder"}},
				marketv1alpha1.Association{DID: bad, Roles: []marketv1alpha1.Role{"bidder"}})...)
			_ = reconcileNoPanic(t, r, "op")
			id := get(t, ws, "op")
			if id.Status.Phase != marketv1alpha1.PhaseFailed || readyReason(t, id) != marketv1alpha1.ReasonInvalidSpec {
				t.Fatalf("phase %s, Ready %s; want Failed, InvalidSpec", id.Status.Phase, readyReason(t, id))
			}
			if repo.Writes != 0 {
				t.Fatalf("%d writes for an invalid spec", repo.Writes)
			}
			if rec, _ := repo.Get(context.Background(), lexicon.Association, other); rec == nil {
				t.Fatal("an invalid spec deleted an existing association record")
			}
		})
	}
}

// TestAttackExistingRecordsWithBadKeys: association records in the repo
// whose keys are not valid record keys (written by another client, or
// listed by a hostile PDS) do not crash publishing nor the finalizer,
// are not turned into deletes of other records, and the identity goes.
func TestAttackExistingRecordsWithBadKeys(t *testing.T) {
	repo := markettest.New(did)
	value := []byte(`{"$type":"dev.knotless.market.association","subject":"` + other + `","roles":["bidder"],"createdAt":"2026-11-01T00:00:00Z"}`)
	bad := []string{"bad/key", "..", ".", "a%b", "", "a b", "bad/" + bidder, strings.Repeat("k", 600), "x/../../" + lexicon.Presence + "/b"}
	for _, k := range bad {
		repo.Put(lexicon.Association, k, value)
	}
	repo.Put(lexicon.Association, "stale", value)
	repo.Put(lexicon.Presence, "b", []byte(`{}`))
	r, ws := setup(repo, fixtures("", marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"bidder"}})...)
	if err := reconcileNoPanic(t, r, "op"); err != nil {
		t.Fatal(err)
	}
	id := get(t, ws, "op")
	if id.Status.Phase != marketv1alpha1.PhaseReady {
		t.Fatalf("phase %s, Ready %s", id.Status.Phase, readyReason(t, id))
	}
	if rec, _ := repo.Get(context.Background(), lexicon.Association, bidder); rec == nil {
		t.Fatal("the approved association was not published (or was deleted through a bad key)")
	}
	if rec, _ := repo.Get(context.Background(), lexicon.Association, "stale"); rec != nil {
		t.Fatal("the stale association was not deleted")
	}
	if rec, _ := repo.Get(context.Background(), lexicon.Presence, "b"); rec == nil {
		t.Fatal("a bad association key deleted a presence record")
	}

	if err := ws.Client.Delete(context.Background(), get(t, ws, "op")); err != nil {
		t.Fatal(err)
	}
	if err := reconcileNoPanic(t, r, "op"); err != nil {
		t.Fatalf("finalizing with bad keys in the repo: %v", err)
	}
	err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "op"}, &marketv1alpha1.MarketIdentity{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the identity is still there after finalizing: %v", err)
	}
	if rec, _ := repo.Get(context.Background(), lexicon.Association, bidder); rec != nil {
		t.Fatal("the approved association was left after deletion")
	}

	// rkeys on URIs as a hostile PDS may list them.
	for _, u := range []string{"", "no-slash", "at://" + did + "/" + lexicon.Association + "/", "at://x/y/a/b", "at://x/y/%2e%2e", "at://x/y/\x00"} {
		for _, k := range rkeys([]pds.Record{{URI: u}}) {
			if k == "" || k == "." || k == ".." || strings.ContainsAny(k, "/%\x00 ") {
				t.Errorf("rkeys(%q) returned the invalid key %q", u, k)
			}
		}
	}
}

// TestAttackRepoInAnotherNamespace: repoRef is namespace-local. A repo of
// the same name in another namespace (or a name that tries to name a
// namespace) is NotFound, and no publisher is connected and nothing is
// written.
func TestAttackRepoInAnotherNamespace(t *testing.T) {
	for _, refName := range []string{"repo", "other/repo", "../other/repo"} {
		t.Run(refName, func(t *testing.T) {
			objs := fixtures("", marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"bidder"}})
			objs[0].(*atprotov1alpha1.AtprotoRepo).Namespace = "other"
			objs[2].(*marketv1alpha1.MarketIdentity).Spec.RepoRef.Name = refName
			repo := markettest.New(did)
			r, ws := setup(repo, objs...)
			connected := 0
			r.Connect = func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
				connected++
				return repo, nil
			}
			_ = reconcileNoPanic(t, r, "op")
			id := get(t, ws, "op")
			if readyReason(t, id) != marketv1alpha1.ReasonNotFound || id.Status.Phase == marketv1alpha1.PhaseReady {
				t.Fatalf("phase %s, Ready %s; want NotFound", id.Status.Phase, readyReason(t, id))
			}
			if connected != 0 || repo.Writes != 0 || id.Status.DID != "" {
				t.Fatalf("connected %d times, %d writes, status.did %q", connected, repo.Writes, id.Status.DID)
			}
			// Deleting it touches nothing either.
			if err := ws.Client.Delete(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			if err := reconcileNoPanic(t, r, "op"); err != nil {
				t.Fatal(err)
			}
			if connected != 0 || repo.Writes != 0 {
				t.Fatalf("deletion connected %d times, %d writes", connected, repo.Writes)
			}
		})
	}
}

// TestAttackTwoIdentitiesOneAccount: two AtprotoRepos of the same account
// (same DID), each the repo of an identity: the younger identity fails
// InvalidSpec and its associations are not published, whichever is
// reconciled first; its deletion deletes nothing.
func TestAttackTwoIdentitiesOneAccount(t *testing.T) {
	for _, order := range [][]string{{"op", "second"}, {"second", "op", "second"}} {
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			objs := fixtures("", marketv1alpha1.Association{DID: bidder, Roles: []marketv1alpha1.Role{"bidder"}})
			repo2 := objs[0].DeepCopyObject().(*atprotov1alpha1.AtprotoRepo)
			repo2.Name = "repo2"
			second := objs[2].DeepCopyObject().(*marketv1alpha1.MarketIdentity)
			second.Name, second.UID = "second", "second-uid"
			second.CreationTimestamp = metav1.NewTime(second.CreationTimestamp.Add(time.Minute))
			second.Spec.RepoRef.Name = "repo2"
			second.Spec.ApprovedAssociations = []marketv1alpha1.Association{{DID: other, Roles: []marketv1alpha1.Role{"requester"}}}
			repo := markettest.New(did) // one account: both AtprotoRepos reach it
			r, ws := setup(repo, append(objs, repo2, second)...)
			for _, n := range order {
				if err := reconcileNoPanic(t, r, n); err != nil {
					t.Fatalf("%s: %v", n, err)
				}
			}
			if id := get(t, ws, "second"); id.Status.Phase != marketv1alpha1.PhaseFailed || readyReason(t, id) != marketv1alpha1.ReasonInvalidSpec {
				t.Fatalf("younger identity: phase %s, Ready %s", id.Status.Phase, readyReason(t, id))
			}
			if id := get(t, ws, "op"); id.Status.Phase != marketv1alpha1.PhaseReady {
				t.Fatalf("older identity: phase %s, Ready %s", id.Status.Phase, readyReason(t, id))
			}
			recs, _ := repo.ListRecords(context.Background(), lexicon.Association, 100)
			if len(recs) != 1 || !strings.HasSuffix(recs[0].URI, "/"+bidder) {
				t.Fatalf("association records %+v, want the older identity's only", recs)
			}
			if err := ws.Client.Delete(context.Background(), get(t, ws, "second")); err != nil {
				t.Fatal(err)
			}
			if err := reconcileNoPanic(t, r, "second"); err != nil {
				t.Fatal(err)
			}
			if recs, _ := repo.ListRecords(context.Background(), lexicon.Association, 100); len(recs) != 1 {
				t.Fatalf("the younger identity's deletion touched the older's records: %+v", recs)
			}
		})
	}
}

package marketbidder

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

const (
	lc  = "2x7uf0bml0q9ms3b"
	ns  = "default"
	did = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
)

func cond(status metav1.ConditionStatus, reason string, gen int64) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: status, Reason: reason, ObservedGeneration: gen, LastTransitionTime: metav1.Now()}}
}

func fixtures() (*marketv1alpha1.MarketNetwork, *marketv1alpha1.MarketIdentity, *marketv1alpha1.MarketBidder) {
	net := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "net"}, Spec: marketv1alpha1.MarketNetworkSpec{Firehoses: []string{"https://relay.example"}}}
	id := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "seller"},
		Spec: marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: "repo"}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"}}}
	id.Status = marketv1alpha1.MarketIdentityStatus{DID: did, Conditions: cond(metav1.ConditionTrue, "Ready", 0)}
	b := &marketv1alpha1.MarketBidder{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b", UID: "b-uid", Generation: 1},
		Spec: marketv1alpha1.MarketBidderSpec{
			IdentityRef: marketv1alpha1.LocalRef{Name: "seller"}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"},
			Offers: []marketv1alpha1.Offer{{Name: "small", CPUMillis: 1000, MemoryMiB: 1024, Capacity: 3, PricePerHour: marketv1alpha1.Price{Amount: 25, Currency: "USD-cents"}}},
		}}
	return net, id, b
}

func reconcileIt(t *testing.T, r *Reconciler) {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "b"}}}); err != nil {
		t.Fatal(err)
	}
}

func getBidder(t *testing.T, ws *clustertest.Cluster) *marketv1alpha1.MarketBidder {
	t.Helper()
	b := &marketv1alpha1.MarketBidder{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPresenceFromBidder: the bidder applies its presence (owned by it)
// with all capacity free; it is Pending until the presence is published,
// then Ready; suspend makes the presence say "not accepting" and the
// bidder Suspended.
func TestPresenceFromBidder(t *testing.T) {
	net, id, b := fixtures()
	ws := clustertest.New(net, id, b)
	r := &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws})}
	reconcileIt(t, r)

	p := &marketv1alpha1.MarketPresence{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, p); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != "b-uid" || ref.Kind != "MarketBidder" {
		t.Fatalf("presence owner %+v", ref)
	}
	if !p.Spec.AcceptingRequests || p.Spec.Driver != marketv1alpha1.DriverProcess || p.Spec.Network != lexicon.Namespace+"/net" ||
		len(p.Spec.Offers) != 1 || p.Spec.Offers[0].Free != 3 || p.Spec.Offers[0].PricePerHour.Amount != 25 {
		t.Fatalf("presence spec %+v", p.Spec)
	}
	got := getBidder(t, ws)
	if got.Status.Phase != marketv1alpha1.PhasePending || got.Status.DID != did {
		t.Fatalf("before the presence is published: %+v", got.Status)
	}

	// The presence controller publishes.
	p.Status = marketv1alpha1.MarketPresenceStatus{ObservedGeneration: p.Generation, Phase: marketv1alpha1.PhaseReady,
		Record: &marketv1alpha1.PublishedRecord{URI: "at://" + did + "/" + lexicon.Presence + "/b", CID: "bafy"}, Conditions: cond(metav1.ConditionTrue, "Ready", p.Generation)}
	if err := ws.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r)
	got = getBidder(t, ws)
	if got.Status.Phase != marketv1alpha1.PhaseReady || got.Status.PresenceURI != p.Status.Record.URI {
		t.Fatalf("after publishing: %+v", got.Status)
	}

	got.Spec.Suspend = true
	got.Generation = 2
	if err := ws.Client.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r)
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.AcceptingRequests {
		t.Fatal("a suspended bidder's presence still accepts requests")
	}
	// The fake does not bump generations: mark the new spec published.
	p.Status.ObservedGeneration = p.Generation
	if err := ws.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	reconcileIt(t, r)
	if got := getBidder(t, ws); got.Status.Phase != marketv1alpha1.PhaseSuspended {
		t.Fatalf("suspended bidder: %+v", got.Status)
	}
	if reasons := ws.Events.Reasons(); len(reasons) < 3 {
		t.Errorf("events %v, want one per phase change", reasons)
	}
}

// TestWaitsForReferences: a missing network or identity, or an identity
// of another network, is a condition, and no presence is made.
func TestWaitsForReferences(t *testing.T) {
	for _, tc := range []struct {
		name   string
		objs   func() []client.Object
		phase  marketv1alpha1.Phase
		reason string
	}{
		{"no network", func() []client.Object { _, id, b := fixtures(); return []client.Object{id, b} }, marketv1alpha1.PhasePending, marketv1alpha1.ReasonNotFound},
		{"no identity", func() []client.Object { n, _, b := fixtures(); return []client.Object{n, b} }, marketv1alpha1.PhasePending, marketv1alpha1.ReasonNotFound},
		{"identity not ready", func() []client.Object {
			n, id, b := fixtures()
			id.Status.Conditions = cond(metav1.ConditionFalse, "NotReady", 0)
			return []client.Object{n, id, b}
		}, marketv1alpha1.PhasePending, marketv1alpha1.ReasonNotReady},
		{"identity of another network", func() []client.Object {
			n, id, b := fixtures()
			id.Spec.NetworkRef.Name = "other"
			return []client.Object{n, id, b}
		}, marketv1alpha1.PhaseFailed, marketv1alpha1.ReasonInvalidSpec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := clustertest.New(tc.objs()...)
			r := &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws})}
			reconcileIt(t, r)
			got := getBidder(t, ws)
			c := clustertest.Condition(t, got.Status.Conditions, marketv1alpha1.ConditionReady)
			if got.Status.Phase != tc.phase || c.Reason != tc.reason {
				t.Fatalf("phase %s, Ready %s: %s", got.Status.Phase, c.Reason, c.Message)
			}
			var list marketv1alpha1.MarketPresenceList
			if err := ws.Client.List(context.Background(), &list); err != nil || len(list.Items) != 0 {
				t.Fatalf("presences %d, %v", len(list.Items), err)
			}
		})
	}
}

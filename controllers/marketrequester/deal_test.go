package marketrequester

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/marketbidder"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/market/markettest"
	"github.com/knotless-dev/knotless/internal/tenant"
)

const (
	ns       = "default"
	operator = "did:plc:operator0000000000000000"
)

// clock is the test's time, shared by both sides.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func readyCond(gen int64) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", ObservedGeneration: gen, LastTransitionTime: metav1.Now()}}
}

// participant returns a Ready repo and identity of did on network "net".
func participant(name, did string, approve ...marketv1alpha1.Association) []client.Object {
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	repo.Status.DID, repo.Status.Conditions = did, readyCond(0)
	id := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: name}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"}, ApprovedAssociations: approve}}
	id.Status.DID, id.Status.Conditions = did, readyCond(0)
	net := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "net"},
		Spec: marketv1alpha1.MarketNetworkSpec{Firehoses: []string{"https://pds.example"}, OperatorDID: operator}}
	return []client.Object{repo, id, net}
}

func bidderObj(name string, price int64, capacity int32) *marketv1alpha1.MarketBidder {
	return &marketv1alpha1.MarketBidder{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid"), Generation: 1},
		Spec: marketv1alpha1.MarketBidderSpec{
			IdentityRef: marketv1alpha1.LocalRef{Name: name}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"},
			Offers: []marketv1alpha1.Offer{{Name: "small", CPUMillis: 1000, MemoryMiB: 1024, Capacity: capacity,
				PricePerHour: marketv1alpha1.Price{Amount: price, Currency: "USD-cents"}}},
			BidValiditySeconds: 300,
		}}
}

func requesterObj() *marketv1alpha1.MarketRequester {
	return &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop", UID: "shop-uid", Generation: 1},
		Spec: marketv1alpha1.MarketRequesterSpec{
			IdentityRef: marketv1alpha1.LocalRef{Name: "shop"}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"},
			Shape: marketv1alpha1.Shape{CPUMillis: 1000, MemoryMiB: 1024}, Replicas: 1,
			MaxPricePerHour:  marketv1alpha1.Price{Amount: 50, Currency: "USD-cents"},
			BidWindowSeconds: 10, ConfirmSeconds: 60, NoticeSeconds: 600, MaxBidsPerRequest: 20,
		}}
}

func association(subject string, roles ...string) []byte {
	b, _ := json.Marshal(map[string]any{"$type": lexicon.Association, "subject": subject, "roles": roles, "createdAt": "2026-06-01T12:00:00.000Z"})
	return b
}

// market is one requester workspace and bidder workspaces on one
// in-memory network.
type marketFixture struct {
	t       *testing.T
	clock   *clock
	net     *markettest.Network
	repos   map[string]*markettest.Repo // by DID
	req     *Reconciler
	bid     *marketbidder.Reconciler
	shop    *clustertest.Cluster
	bidders map[string]*clustertest.Cluster // by bidder name (= workspace)
	// tenants are the tenants the requester's side reached, by endpoint,
	// with the last token it bore there; a tenant in refusing answers
	// every request with an error.
	tenants  map[string]*fakeTenant
	refusing map[string]bool
	// mounts is the provider's own workspace, where the mounts'
	// credentials are kept (Reconciler.Mounts).
	mounts client.Client
}

// fakeTenant is a tenant apiserver as the requester's side reaches it.
type fakeTenant struct {
	*k8sfake.Clientset
	token string
}

// tenantClient is the fixture's Reconciler.TenantClient.
func (m *marketFixture) tenantClient(tn deal.Tenant, token string) (kubernetes.Interface, error) {
	ft := m.tenants[tn.Endpoint]
	if ft == nil {
		ft = &fakeTenant{Clientset: k8sfake.NewClientset()}
		m.tenants[tn.Endpoint] = ft
	}
	ft.token = token
	if m.refusing[tn.Endpoint] {
		cs := k8sfake.NewClientset()
		cs.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("the tenant refuses")
		})
		return cs, nil
	}
	return ft.Clientset, nil
}

func newMarket(t *testing.T, bidders ...*marketv1alpha1.MarketBidder) *marketFixture {
	t.Helper()
	m := &marketFixture{t: t, clock: &clock{t: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}, repos: map[string]*markettest.Repo{}, bidders: map[string]*clustertest.Cluster{},
		tenants: map[string]*fakeTenant{}, refusing: map[string]bool{}}
	m.net = markettest.NewNetwork()
	m.net.Now = m.clock.now
	op := m.repo(operator)
	op.Put(lexicon.Association, "did:plc:shop", association("did:plc:shop", "requester"))
	clusters := map[string]*clustertest.Cluster{}
	m.shop = clustertest.New(append(participant("shop", "did:plc:shop"), requesterObj())...)
	m.repo("did:plc:shop")
	clusters["shop"] = m.shop
	for _, b := range bidders {
		did := "did:plc:" + b.Name
		m.repo(did)
		if b.Name != "unvouched" {
			op.Put(lexicon.Association, did, association(did, "bidder"))
		}
		ws := clustertest.New(append(participant(b.Name, did), b)...)
		m.bidders[b.Name] = ws
		clusters[b.Name] = ws
	}
	connect := func(_ context.Context, _ client.Client, _ string, repo *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
		return m.repos[repo.Status.DID], nil
	}
	m.mounts = fake.NewClientBuilder().WithScheme(apis.NewScheme()).Build()
	m.req = &Reconciler{GetCluster: clustertest.Getter(clusters), Market: m.net, Scheme: apis.NewScheme(),
		Inventories: &market.Inventories{Now: m.clock.now}, Connect: connect, Now: m.clock.now, TenantClient: m.tenantClient, Mounts: m.mounts}
	m.bid = &marketbidder.Reconciler{GetCluster: clustertest.Getter(clusters), Market: m.net,
		Inventories: &market.Inventories{Now: m.clock.now}, Connect: connect, Now: m.clock.now}
	return m
}

// mountCredential is the credential the provider keeps for the mount of
// the contract cc of the requester's workspace (shop), or the zero one.
func (m *marketFixture) mountCredential(cc string) tenant.MarketCredential {
	m.t.Helper()
	mc, _, err := tenant.ReadMarket(context.Background(), m.mounts, "shop", cc)
	if err != nil {
		m.t.Fatal(err)
	}
	return mc
}

func (m *marketFixture) repo(did string) *markettest.Repo {
	if m.repos[did] == nil {
		m.repos[did] = markettest.New(did)
		m.net.Add(m.repos[did])
	}
	return m.repos[did]
}

// round reconciles the requester, then every bidder, then the requester.
func (m *marketFixture) round() {
	m.t.Helper()
	m.reconcileRequester()
	for name := range m.bidders {
		m.reconcileBidder(name)
	}
	m.reconcileRequester()
}

func (m *marketFixture) reconcileRequester() {
	m.t.Helper()
	if _, err := m.req.Reconcile(context.Background(), mcreconcile.Request{ClusterName: "shop", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "shop"}}}); err != nil {
		m.t.Fatalf("requester: %v", err)
	}
}

func (m *marketFixture) reconcileBidder(name string) {
	m.t.Helper()
	if _, err := m.bid.Reconcile(context.Background(), mcreconcile.Request{ClusterName: multicluster.ClusterName(name), Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}); err != nil {
		m.t.Fatalf("bidder %s: %v", name, err)
	}
}

func (m *marketFixture) requester() *marketv1alpha1.MarketRequester {
	m.t.Helper()
	mr := &marketv1alpha1.MarketRequester{}
	if err := m.shop.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop"}, mr); err != nil {
		m.t.Fatal(err)
	}
	return mr
}

func contracts(t *testing.T, ws *clustertest.Cluster) []marketv1alpha1.ComputeContract {
	t.Helper()
	var l marketv1alpha1.ComputeContractList
	if err := ws.Client.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func bidStates(t *testing.T, ws *clustertest.Cluster) map[string]marketv1alpha1.BidState {
	t.Helper()
	var l marketv1alpha1.BidList
	if err := ws.Client.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]marketv1alpha1.BidState{}
	for _, b := range l.Items {
		out[b.Spec.BidderDID] = b.Status.State
	}
	return out
}

// TestFittingBidderWins: of a bidder too expensive, one without capacity,
// one the network does not vouch for (the cheapest) and one that fits,
// the fitting one wins; both sides hold a contract; lowering replicas to
// 0 releases it and every record of the deal is gone afterwards.
func TestFittingBidderWins(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2), bidderObj("expensive", 80, 2), bidderObj("full", 20, 0), bidderObj("unvouched", 10, 2))
	m.round()

	shopRepo := m.repos["did:plc:shop"]
	if n := len(shopRepo.Records(lexicon.Request)); n != 1 {
		t.Fatalf("want 1 request record, have %d", n)
	}
	for name, want := range map[string]int{"fit": 1, "unvouched": 1, "expensive": 0, "full": 0} {
		if n := len(m.repos["did:plc:"+name].Records(lexicon.Bid)); n != want {
			t.Errorf("%s: %d bid records, want %d", name, n, want)
		}
	}
	mr := m.requester()
	if len(mr.Status.Requests) != 1 || mr.Status.Requests[0].State != marketv1alpha1.RequestOpen || mr.Status.Requests[0].Bids != 2 {
		t.Fatalf("requests: %+v", mr.Status.Requests)
	}
	if c := clustertest.Condition(t, mr.Status.Conditions, "Ready"); c.Reason != marketv1alpha1.ReasonBidding {
		t.Errorf("Ready: %+v", c)
	}

	m.clock.advance(11 * time.Second)
	m.round()
	m.round()

	states := bidStates(t, m.shop)
	if states["did:plc:fit"] != marketv1alpha1.BidLeased || states["did:plc:unvouched"] != marketv1alpha1.BidUnvouched {
		t.Errorf("requester's bids: %v", states)
	}
	// Each Bid's Ready condition follows its state (kubectl wait).
	var bids marketv1alpha1.BidList
	if err := m.shop.Client.List(context.Background(), &bids); err != nil {
		t.Fatal(err)
	}
	for _, b := range bids.Items {
		c := clustertest.Condition(t, b.Status.Conditions, "Ready")
		if want := b.Status.State == marketv1alpha1.BidLeased; (c.Status == metav1.ConditionTrue) != want || c.Reason != string(b.Status.State) {
			t.Errorf("the Bid of %s (%s): Ready %+v", b.Spec.BidderDID, b.Status.State, c)
		}
	}
	if s := bidStates(t, m.bidders["unvouched"]); s["did:plc:unvouched"] != marketv1alpha1.BidLost {
		t.Errorf("unvouched bidder's bid: %v", s)
	}
	if n := len(m.repos["did:plc:unvouched"].Records(lexicon.Bid)); n != 0 {
		t.Errorf("the losing bid record is still there (%d)", n)
	}
	for name, ws := range map[string]*clustertest.Cluster{"shop": m.shop, "fit": m.bidders["fit"]} {
		cc := contracts(t, ws)
		if len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractProvisioning {
			t.Fatalf("%s: contracts %+v", name, cc)
		}
		if cc[0].Status.Records.Lease == nil || cc[0].Status.Records.Accept == nil || cc[0].Status.Records.Bid == nil || cc[0].Status.Records.Request == nil {
			t.Errorf("%s: evidence incomplete: %+v", name, cc[0].Status.Records)
		}
	}
	mr = m.requester()
	if c := clustertest.Condition(t, mr.Status.Conditions, "Ready"); c.Status != metav1.ConditionTrue || c.Reason != marketv1alpha1.ReasonContracted {
		t.Errorf("Ready: %+v", c)
	}

	// Release: replicas 0.
	mr.Spec.Replicas, mr.Generation = 0, 2
	if err := m.shop.Client.Update(context.Background(), mr); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.round()
	}
	if cc := contracts(t, m.shop); len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractCompleted || cc[0].Status.Reason != string(deal.ReplicasLowered) {
		t.Errorf("requester's contract after release: %+v", cc)
	}
	if cc := contracts(t, m.bidders["fit"]); len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractCompleted {
		t.Errorf("bidder's contract after release: %+v", cc)
	}
	for did, repo := range m.repos {
		for _, col := range []string{lexicon.Request, lexicon.Bid, lexicon.Accept, lexicon.Lease, lexicon.Release} {
			if recs := repo.Records(col); len(recs) != 0 {
				t.Errorf("%s still has %s records: %v", did, col, recs)
			}
		}
	}
}

func (m *marketFixture) updateBidder(name string, f func(*marketv1alpha1.MarketBidder)) {
	m.t.Helper()
	ws := m.bidders[name]
	b := &marketv1alpha1.MarketBidder{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, b); err != nil {
		m.t.Fatal(err)
	}
	f(b)
	b.Generation++
	if err := ws.Client.Update(context.Background(), b); err != nil {
		m.t.Fatal(err)
	}
}

func (m *marketFixture) updateRequester(f func(*marketv1alpha1.MarketRequester)) {
	m.t.Helper()
	mr := m.requester()
	f(mr)
	mr.Generation++
	if err := m.shop.Client.Update(context.Background(), mr); err != nil {
		m.t.Fatal(err)
	}
}

// records counts the market records of a repo by collection.
func (m *marketFixture) records(did, collection string) int {
	return len(m.repos[did].Records(collection))
}

// TestNoBidders: with nobody to bid, the request stays open and says so;
// after the bid window it is asked again later (not at once), and the old
// request goes when the new one is made.
func TestNoBidders(t *testing.T) {
	m := newMarket(t)
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	mr := m.requester()
	rs := mr.Status.Requests
	if len(rs) != 1 || rs[0].State != marketv1alpha1.RequestOpen || rs[0].NextAttempt == nil || rs[0].Attempt != 1 {
		t.Fatalf("requests: %+v", rs)
	}
	if c := clustertest.Condition(t, mr.Status.Conditions, "Ready"); c.Status != metav1.ConditionFalse || c.Reason != marketv1alpha1.ReasonNoBids {
		t.Errorf("Ready: %+v", c)
	}
	if mr.Status.Phase != marketv1alpha1.PhasePending {
		t.Errorf("phase %s", mr.Status.Phase)
	}
	m.clock.t = rs[0].NextAttempt.Add(time.Second)
	m.round()
	rs = m.requester().Status.Requests
	if len(rs) != 1 || rs[0].Attempt != 2 || rs[0].NextAttempt != nil {
		t.Fatalf("after the wait: %+v", rs)
	}
	if n := m.records("did:plc:shop", lexicon.Request); n != 1 {
		t.Errorf("%d request records, want 1 (the new attempt)", n)
	}
}

// TestRaceForTheLastCapacity: a bidder bids on two requesters' requests;
// its capacity is lowered to one before they accept: exactly one lease
// is confirmed, the other is declined with no-capacity and that requester
// goes back to the market.
func TestRaceForTheLastCapacity(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	// A second requester in its own workspace.
	other := clustertest.New(append(participant("shop", "did:plc:other"), requesterObj())...)
	m.repo("did:plc:other")
	m.repos[operator].Put(lexicon.Association, "did:plc:other", association("did:plc:other", "requester"))
	clusters := map[string]*clustertest.Cluster{"shop": m.shop, "other": other, "fit": m.bidders["fit"]}
	m.req.GetCluster, m.bid.GetCluster = clustertest.Getter(clusters), clustertest.Getter(clusters)
	reconcileOther := func() {
		t.Helper()
		if _, err := m.req.Reconcile(context.Background(), mcreconcile.Request{ClusterName: "other", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "shop"}}}); err != nil {
			t.Fatal(err)
		}
	}
	reconcileOther()
	m.round()
	if n := m.records("did:plc:fit", lexicon.Bid); n != 2 {
		t.Fatalf("%d bids, want 2", n)
	}
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Offers[0].Capacity = 1 })
	m.clock.advance(11 * time.Second)
	reconcileOther()
	m.reconcileRequester()
	m.reconcileBidder("fit")
	// The loser's Bid says Declined, then its accept goes, then it asks
	// again (a pass each).
	for range 3 {
		reconcileOther()
		m.reconcileRequester()
	}

	var leases []market.Lease
	for _, rec := range m.repos["did:plc:fit"].Records(lexicon.Lease) {
		var l market.Lease
		if err := json.Unmarshal(rec.Value, &l); err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	confirmed, declined := 0, 0
	for _, l := range leases {
		switch {
		case l.State == deal.LeaseConfirmed:
			confirmed++
		case l.State == deal.LeaseDeclined && l.Reason == deal.NoCapacity:
			declined++
		}
	}
	if confirmed != 1 || declined != 1 {
		t.Fatalf("leases: %+v", leases)
	}
	if n := len(contracts(t, m.bidders["fit"])); n != 1 {
		t.Errorf("bidder has %d contracts, want 1", n)
	}
	won, lost := len(contracts(t, m.shop)), len(contracts(t, other))
	if won+lost != 1 {
		t.Fatalf("requesters hold %d and %d contracts; want exactly one in all", won, lost)
	}
	loser := other
	if lost == 1 {
		loser = m.shop
	}
	mr := &marketv1alpha1.MarketRequester{}
	if err := loser.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop"}, mr); err != nil {
		t.Fatal(err)
	}
	if s := bidStates(t, loser); s["did:plc:fit"] != marketv1alpha1.BidDeclined {
		t.Errorf("loser's bid: %v", s)
	}
	if rs := mr.Status.Requests; len(rs) != 1 || rs[0].Attempt != 2 || rs[0].State != marketv1alpha1.RequestOpen {
		t.Errorf("the declined requester is not back in the market: %+v", rs)
	}
}

// TestVoidAcceptTakesTheNextBid: a bidder that does not answer by
// confirmBy loses the accept (void, deleted) and the next bid is taken.
func TestVoidAcceptTakesTheNextBid(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2), bidderObj("slow", 20, 2))
	m.round()
	m.clock.advance(11 * time.Second)
	m.reconcileRequester() // accepts slow (cheapest); slow never answers
	if s := bidStates(t, m.shop); s["did:plc:slow"] != marketv1alpha1.BidAccepted {
		t.Fatalf("bids: %v", s)
	}
	// fit sees an accept of another bid that nobody leased: it keeps its
	// bid, in case the requester comes back to it.
	m.reconcileBidder("fit")
	if n := m.records("did:plc:fit", lexicon.Bid); n != 1 {
		t.Fatalf("fit withdrew its bid before the other one was leased")
	}
	m.clock.advance(61 * time.Second)
	// slow's Bid says Void, then its accept goes, then fit's bid is
	// accepted (a pass each: never two accepts open).
	m.reconcileRequester()
	if s := bidStates(t, m.shop); s["did:plc:slow"] != marketv1alpha1.BidVoid || s["did:plc:fit"] != marketv1alpha1.BidOpen || m.records("did:plc:shop", lexicon.Accept) != 1 {
		t.Fatalf("bids after confirmBy, first pass: %v, %d accepts; want slow Void, its accept kept", s, m.records("did:plc:shop", lexicon.Accept))
	}
	m.reconcileRequester()
	if n := m.records("did:plc:shop", lexicon.Accept); n != 0 {
		t.Fatalf("%d accepts after the second pass, want 0 (the void one deleted, no other yet)", n)
	}
	m.reconcileRequester()
	if s := bidStates(t, m.shop); s["did:plc:slow"] != marketv1alpha1.BidVoid || s["did:plc:fit"] != marketv1alpha1.BidAccepted {
		t.Fatalf("bids after confirmBy: %v", s)
	}
	if n := m.records("did:plc:shop", lexicon.Accept); n != 1 {
		t.Errorf("%d accepts, want 1 (the void one deleted)", n)
	}
	m.reconcileBidder("fit")
	m.reconcileBidder("slow") // sees another bid leased: lost
	m.reconcileRequester()
	if cc := contracts(t, m.shop); len(cc) != 1 || cc[0].Spec.BidderDID != "did:plc:fit" {
		t.Errorf("contracts: %+v", cc)
	}
	if n := m.records("did:plc:slow", lexicon.Bid); n != 0 {
		t.Errorf("slow's bid is still there")
	}
}

// TestScaleDownAndUpMakesANewDeal: a replica released and wanted again
// asks with a new request (a new key), so the new deal's records and
// contracts never reuse the first deal's; the first contract stays
// Completed.
func TestScaleDownAndUpMakesANewDeal(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	first := contracts(t, m.shop)
	if len(first) != 1 {
		t.Fatalf("contracts %d", len(first))
	}
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	for range 3 {
		m.round()
	}
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 1 })
	m.clock.advance(time.Second)
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	all := contracts(t, m.shop)
	if len(all) != 2 {
		t.Fatalf("contracts after scaling up: %+v", all)
	}
	phases := map[string]marketv1alpha1.ContractPhase{}
	for _, cc := range all {
		phases[cc.Name] = cc.Status.Phase
	}
	if phases[first[0].Name] != marketv1alpha1.ContractCompleted || len(phases) != 2 {
		t.Errorf("phases %v: the first deal's contract must stay Completed and the second be another", phases)
	}
}

// TestEditedOfferKeepsItsLeases: a lease counts against its offer (by
// name) after the offer's shape changed; no second lease is confirmed on
// capacity 1.
func TestEditedOfferKeepsItsLeases(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 1))
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Offers[0].MemoryMiB = 2048 })
	m.reconcileBidder("fit")
	b := &marketv1alpha1.MarketBidder{}
	if err := m.bidders["fit"].Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "fit"}, b); err != nil {
		t.Fatal(err)
	}
	if b.Status.Leased != 1 {
		t.Errorf("leased %d after the offer was edited, want 1", b.Status.Leased)
	}
}

// TestOneRequesterCannotHoldAllCapacity: a bidder holds at most
// maxOpenBidsPerRequester open bids for one requester.
func TestOneRequesterCannotHoldAllCapacity(t *testing.T) {
	bidder := bidderObj("fit", 30, 10)
	bidder.Spec.MaxOpenBidsPerRequester = 2
	m := newMarket(t, bidder)
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 5 })
	m.round()
	if n := m.records("did:plc:fit", lexicon.Bid); n != 2 {
		t.Errorf("%d open bids for one requester, want 2", n)
	}
}

// TestForgedRecordsAreIgnored: an accept of the bid in a repo that is not
// the requester's, an accept naming another version of the bid, and a
// lease in a repo that is not the bidder's are ignored and counted.
func TestForgedRecordsAreIgnored(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.round()
	bid := m.repos["did:plc:fit"].Records(lexicon.Bid)[0]
	req := m.repos["did:plc:shop"].Records(lexicon.Request)[0]
	mallory := m.repo("did:plc:mallory")
	forge := func(bidCID string) []byte {
		b, _ := json.Marshal(market.Accept{Type: lexicon.Accept, Bid: market.StrongRef{URI: bid.URI, CID: bidCID},
			Request: market.StrongRef{URI: req.URI, CID: req.CID}, ConfirmBy: market.Time(m.clock.t.Add(time.Minute)), CreatedAt: market.Time(m.clock.t)})
		return b
	}
	mallory.Put(lexicon.Accept, "aforged", forge(bid.CID))
	m.repos["did:plc:shop"].Put(lexicon.Accept, "awrongcid", forge("bafywrong"))
	m.reconcileBidder("fit")
	b := &marketv1alpha1.MarketBidder{}
	if err := m.bidders["fit"].Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "fit"}, b); err != nil {
		t.Fatal(err)
	}
	if b.Status.IgnoredRecords != 2 || m.records("did:plc:fit", lexicon.Lease) != 0 {
		t.Fatalf("ignored %d, leases %d", b.Status.IgnoredRecords, m.records("did:plc:fit", lexicon.Lease))
	}
	m.repos["did:plc:shop"].Delete(lexicon.Accept, "awrongcid")

	// A lease of the real accept, but in mallory's repo.
	m.clock.advance(11 * time.Second)
	m.reconcileRequester()
	acc := m.repos["did:plc:shop"].Records(lexicon.Accept)[0]
	l, _ := json.Marshal(market.Lease{Type: lexicon.Lease, Accept: market.StrongRef{URI: acc.URI, CID: acc.CID}, State: deal.LeaseConfirmed, CreatedAt: market.Time(m.clock.t)})
	mallory.Put(lexicon.Lease, "lforged", l)
	m.reconcileRequester()
	mr := m.requester()
	if mr.Status.IgnoredRecords != 1 || len(contracts(t, m.shop)) != 0 || mr.Status.Requests[0].State != marketv1alpha1.RequestAccepted {
		t.Fatalf("ignored %d, contracts %d, requests %+v", mr.Status.IgnoredRecords, len(contracts(t, m.shop)), mr.Status.Requests)
	}
}

// TestSuspendReleasesAndASuspendedBidderStillCompletes: suspending the
// requester releases its contract (reason suspended) and makes no new
// request; a suspended bidder still ends the released lease.
func TestSuspendReleasesAndASuspendedBidderStillCompletes(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	if len(contracts(t, m.shop)) != 1 {
		t.Fatal("no contract")
	}
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Suspend = true })
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Suspend = true })
	for range 3 {
		m.round()
	}
	mr := m.requester()
	if mr.Status.Phase != marketv1alpha1.PhaseSuspended || len(mr.Status.Requests) != 0 {
		t.Fatalf("requester: %s %+v", mr.Status.Phase, mr.Status.Requests)
	}
	if c := clustertest.Condition(t, mr.Status.Conditions, "Suspended"); c.Status != metav1.ConditionTrue {
		t.Errorf("Suspended: %+v", c)
	}
	cc := contracts(t, m.bidders["fit"])
	if len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractCompleted || cc[0].Status.Reason != string(deal.ReleaseSuspended) {
		t.Errorf("bidder's contract: %+v", cc)
	}
	if n := m.records("did:plc:shop", lexicon.Request); n != 0 {
		t.Errorf("a suspended requester has %d requests", n)
	}
}

// TestRestartLosesNothing: new reconcilers (a restarted provider: empty
// inventories, records seen anew) after each step of the flow make no
// second record and exactly one contract per side.
func TestRestartLosesNothing(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	restart := func() {
		m.req.Inventories = &market.Inventories{Now: m.clock.now}
		m.bid.Inventories = &market.Inventories{Now: m.clock.now}
	}
	m.reconcileRequester()
	restart()
	m.reconcileRequester()
	m.reconcileBidder("fit")
	restart()
	m.reconcileBidder("fit")
	m.reconcileRequester()
	m.clock.advance(11 * time.Second)
	m.reconcileRequester()
	restart()
	m.reconcileRequester()
	m.reconcileBidder("fit")
	restart()
	m.reconcileBidder("fit")
	m.reconcileRequester()
	restart()
	m.round()
	for _, c := range []struct {
		did, col string
		want     int
	}{{"did:plc:shop", lexicon.Request, 1}, {"did:plc:shop", lexicon.Accept, 1}, {"did:plc:fit", lexicon.Bid, 1}, {"did:plc:fit", lexicon.Lease, 1}} {
		if n := m.records(c.did, c.col); n != c.want {
			t.Errorf("%s: %d %s records, want %d", c.did, n, c.col, c.want)
		}
	}
	if len(contracts(t, m.shop)) != 1 || len(contracts(t, m.bidders["fit"])) != 1 {
		t.Errorf("contracts: %d and %d", len(contracts(t, m.shop)), len(contracts(t, m.bidders["fit"])))
	}
	if w := m.repos["did:plc:shop"].Writes + m.repos["did:plc:fit"].Writes; w != 4 {
		t.Errorf("%d record writes, want 4 (request, bid, accept, lease)", w)
	}
}

// TestDeletionReleases: deleting the requester releases its contract and
// deletes its records before the finalizer lets it go.
func TestDeletionReleases(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	if err := m.shop.Client.Delete(context.Background(), m.requester()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.round()
	}
	mr := &marketv1alpha1.MarketRequester{}
	if err := m.shop.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop"}, mr); err == nil {
		t.Fatalf("the requester is still there: %+v", mr.Status)
	}
	cc := contracts(t, m.bidders["fit"])
	if len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractCompleted || cc[0].Status.Reason != string(deal.RequesterDeleted) {
		t.Errorf("bidder's contract: %+v", cc)
	}
	for _, col := range []string{lexicon.Request, lexicon.Accept, lexicon.Release} {
		if n := m.records("did:plc:shop", col); n != 0 {
			t.Errorf("%d %s records left", n, col)
		}
	}
}

// TestAPassWithoutNewsWritesNothing: once the contract is made, the next
// round finds every status, Bid and contract already as it would write
// them (docs/market.md, What bounds the market's speed): no object of
// either side is written again.
func TestAPassWithoutNewsWritesNothing(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2), bidderObj("expensive", 40, 2))
	versions := func() map[string]string {
		out := map[string]string{}
		for name, ws := range map[string]*clustertest.Cluster{"shop": m.shop, "fit": m.bidders["fit"], "expensive": m.bidders["expensive"]} {
			for _, list := range []client.ObjectList{&marketv1alpha1.MarketRequesterList{}, &marketv1alpha1.MarketBidderList{}, &marketv1alpha1.BidList{}, &marketv1alpha1.ComputeContractList{}} {
				if err := ws.Client.List(context.Background(), list); err != nil {
					t.Fatal(err)
				}
				items, err := meta.ExtractList(list)
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range items {
					o := it.(client.Object)
					out[fmt.Sprintf("%s %T %s", name, o, o.GetName())] = o.GetResourceVersion()
				}
			}
		}
		return out
	}
	quiet := func(when string, pass func()) {
		t.Helper()
		before := versions()
		pass()
		for k, v := range versions() {
			if before[k] != v {
				t.Errorf("%s: %s written again by a pass without news (resourceVersion %s -> %s)", when, k, before[k], v)
			}
		}
	}
	m.reconcileRequester() // publishes the request
	quiet("collecting, before any bid", m.reconcileRequester)
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	if cc := contracts(t, m.shop); len(cc) != 1 {
		t.Fatalf("no contract after the round: %+v", cc)
	}
	// The losing bidder, if it ran before the winner's lease was out,
	// learns now that its bid lost (news). The winner's and the
	// requester's next passes are their first since the contracts were
	// made.
	m.reconcileBidder("expensive")
	quiet("contracted", m.round)
}

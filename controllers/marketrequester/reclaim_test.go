package marketrequester

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/pds"
)

// activeOn brings the requester's replica to an Active contract with the
// bidder of ws (its agent and the mount played by the test).
func (m *marketFixture) activeOn(ws *clustertest.Cluster, ca []byte) {
	m.t.Helper()
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	m.runVM(ws, ca)
	m.round()
	m.tenantReady()
	m.round()
}

// contractWith returns the live contract of ws whose bidder is did.
func contractWith(t *testing.T, ws *clustertest.Cluster, did string) *marketv1alpha1.ComputeContract {
	t.Helper()
	var found *marketv1alpha1.ComputeContract
	for _, cc := range contracts(t, ws) {
		if cc.Spec.BidderDID == did && deal.LiveContract(&cc) {
			if found != nil {
				t.Fatalf("two live contracts with %s", did)
			}
			found = &cc
		}
	}
	return found
}

// nextBids are the requester's Bids on the replica's current request,
// by bidder.
func (m *marketFixture) nextBids() map[string]marketv1alpha1.BidState {
	m.t.Helper()
	rs := m.requester().Status.Requests
	if len(rs) != 1 || rs[0].Record == nil {
		m.t.Fatalf("requests: %+v", rs)
	}
	var l marketv1alpha1.BidList
	if err := m.shop.Client.List(context.Background(), &l); err != nil {
		m.t.Fatal(err)
	}
	out := map[string]marketv1alpha1.BidState{}
	for _, b := range l.Items {
		if b.Spec.Request.URI == rs[0].Record.URI {
			out[b.Spec.BidderDID] = b.Status.State
		}
	}
	return out
}

func contractNamed(t *testing.T, ws *clustertest.Cluster, name string) *marketv1alpha1.ComputeContract {
	t.Helper()
	for _, cc := range contracts(t, ws) {
		if cc.Name == name {
			return &cc
		}
	}
	return nil
}

func vmCount(t *testing.T, ws *clustertest.Cluster) int {
	t.Helper()
	var vms computev1alpha1.ComputeVMList
	if err := ws.Client.List(context.Background(), &vms); err != nil {
		t.Fatal(err)
	}
	return len(vms.Items)
}

// TestReclaimWithSuccessor: a bidder named in spec.reclaims publishes a
// reclaim whose terminateAfter is the request's notice away and keeps the
// VM running; the requester's contract says so (Reclaimed), the
// requester buys the next VM meanwhile (not from the reclaiming bidder)
// and releases the reclaimed one (reason reclaimed) only once the next
// is Active; then the bidder stops the VM and every record of the old
// deal, the reclaim with them, goes.
func TestReclaimWithSuccessor(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2), bidderObj("next", 40, 1))
	ca := drivertest.TestCA(t)
	fit, next := m.bidders["fit"], m.bidders["next"]
	m.activeOn(fit, ca)
	old := contractWith(t, m.shop, "did:plc:fit")
	if old == nil || old.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("no Active contract with fit: %+v", contracts(t, m.shop))
	}
	bc := contractWith(t, fit, "did:plc:fit")

	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) {
		b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name, Reason: marketv1alpha1.ReclaimMaintenance}, {Contract: "no-such-contract"}}
	})
	published := m.clock.t
	m.reconcileBidder("fit")
	recs := m.repos["did:plc:fit"].Records(lexicon.Reclaim)
	if len(recs) != 1 {
		t.Fatalf("%d reclaim records, want 1", len(recs))
	}
	var rc market.Reclaim
	if err := json.Unmarshal(recs[0].Value, &rc); err != nil {
		t.Fatal(err)
	}
	if by := market.ParseTime(rc.TerminateAfter); !by.Equal(published.Add(600*time.Second)) || rc.Reason != "maintenance" || rc.Lease.URI != bc.Status.Records.Lease.URI {
		t.Fatalf("reclaim %+v (lease %s)", rc, bc.Status.Records.Lease.URI)
	}
	if bc = contractWith(t, fit, "did:plc:fit"); bc.Status.Reclaim == nil || bc.Status.Records.Reclaim == nil || bc.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("bidder's contract after the reclaim: %+v", bc.Status)
	}
	// Again: the same record (a retry never moves terminateAfter).
	m.clock.advance(5 * time.Second)
	m.reconcileBidder("fit")
	if again := m.repos["did:plc:fit"].Records(lexicon.Reclaim); len(again) != 1 || again[0].CID != recs[0].CID {
		t.Fatalf("reclaim records after a second reconcile: %v", again)
	}

	m.reconcileRequester()
	old = contractWith(t, m.shop, "did:plc:fit")
	ready := meta.FindStatusCondition(old.Status.Conditions, "Ready")
	if old.Status.Reclaim == nil || old.Status.Reclaim.ShortNotice || ready == nil || ready.Reason != ReasonReclaimed || old.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("requester's contract after the reclaim: %+v", old.Status)
	}
	if n := m.records("did:plc:shop", lexicon.Request); n != 2 {
		t.Fatalf("%d request records, want the reclaimed contract's and the next one's", n)
	}
	// The next VM: fit does not bid on it, next does and wins.
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	if s := m.nextBids(); s["did:plc:fit"] != "" || s["did:plc:next"] != marketv1alpha1.BidLeased {
		t.Fatalf("requester's bids for the next VM: %v", s)
	}
	succ := contractWith(t, m.shop, "did:plc:next")
	if succ == nil || succ.Spec.ReplicaIndex != 0 {
		t.Fatalf("no contract with next: %+v", contracts(t, m.shop))
	}
	// Until the next one is Active the reclaimed one is kept.
	m.round()
	if vmCount(t, fit) != 1 || m.records("did:plc:shop", lexicon.Release) != 0 {
		t.Fatal("the reclaimed VM was given back before the next one ran")
	}
	m.runVM(next, ca)
	m.round()
	m.tenantReady()
	m.round()
	if succ = contractWith(t, m.shop, "did:plc:next"); succ.Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("the next contract: %+v", succ.Status)
	}
	for range 3 {
		m.round()
	}
	if done := contractNamed(t, m.shop, old.Name); done == nil || done.Status.Phase != marketv1alpha1.ContractCompleted || done.Status.Reason != string(deal.ReleaseReclaimed) {
		t.Fatalf("the reclaimed contract: %+v", done)
	}
	if vmCount(t, fit) != 0 || vmCount(t, next) != 1 {
		t.Errorf("VMs: fit %d, next %d", vmCount(t, fit), vmCount(t, next))
	}
	for range 2 {
		m.round()
	}
	for _, col := range []string{lexicon.Reclaim, lexicon.Lease, lexicon.Bid} {
		if n := m.records("did:plc:fit", col); n != 0 {
			t.Errorf("fit still has %d %s records", n, col)
		}
	}
	if mr := m.requester(); mr.Status.Contracted != 1 || mr.Status.Phase != marketv1alpha1.PhaseReady {
		t.Errorf("requester: %+v", mr.Status)
	}
}

// TestReclaimNoticeRunsOut: with no other bidder, the reclaimed VM runs
// for the whole notice and stops after it; the requester's contract ends
// Completed (reclaimed) and the replica goes back to the market. A reclaim
// in a repo that is not the bidder's is ignored; a bidder that ends a
// reclaimed lease before the notice it owed fails the contract
// (reclaimed-early).
func TestReclaimNoticeRunsOut(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	ca := drivertest.TestCA(t)
	fit := m.bidders["fit"]
	m.activeOn(fit, ca)
	bc := contractWith(t, fit, "did:plc:fit")

	// A forged reclaim, in another repo.
	forged, _ := json.Marshal(market.Reclaim{Type: lexicon.Reclaim, Lease: market.StrongRef{URI: bc.Status.Records.Lease.URI, CID: bc.Status.Records.Lease.CID},
		Reason: "maintenance", TerminateAfter: market.Time(m.clock.t.Add(time.Hour)), CreatedAt: market.Time(m.clock.t)})
	m.repo("did:plc:mallory").Put(lexicon.Reclaim, "cforged", forged)
	m.round()
	if cc := contractWith(t, m.shop, "did:plc:fit"); cc.Status.Reclaim != nil {
		t.Fatalf("a reclaim in another repo counted: %+v", cc.Status.Reclaim)
	}
	if m.requester().Status.IgnoredRecords == 0 {
		t.Error("the forged reclaim is not counted as ignored")
	}

	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) {
		b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name, Reason: marketv1alpha1.ReclaimCapacity}}
	})
	m.round() // the reclaim, then the next request
	m.round()
	if n := m.records("did:plc:fit", lexicon.Bid); n != 1 {
		t.Fatalf("fit has %d bid records, want only the leased one's", n)
	}
	// A bid of fit's on the next request all the same is not taken.
	m.plantBid("did:plc:fit", m.requester().Status.Requests[0].Record)
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	if s := m.nextBids(); s["did:plc:fit"] != marketv1alpha1.BidNotAllowed {
		t.Fatalf("requester's bids for the next VM: %v", s)
	}
	// Just before the notice runs out the VM still runs.
	if bc = contractWith(t, fit, "did:plc:fit"); bc.Status.Reclaim == nil {
		t.Fatal("no reclaim on the bidder's contract")
	}
	m.clock.t = bc.Status.Reclaim.TerminateAfter.Add(-time.Second)
	m.round()
	if vmCount(t, fit) != 1 {
		t.Fatal("the VM stopped before the notice ran out")
	}
	m.clock.advance(2 * time.Second)
	for range 3 {
		m.round()
	}
	if vmCount(t, fit) != 0 {
		t.Fatal("the VM still runs after the notice")
	}
	var ended *marketv1alpha1.ComputeContract
	for _, cc := range contracts(t, m.shop) {
		if cc.Spec.BidderDID == "did:plc:fit" && cc.Status.Reclaim != nil {
			ended = &cc
		}
	}
	if ended == nil || ended.Status.Phase != marketv1alpha1.ContractCompleted || ended.Status.Reason != string(deal.Reclaimed) {
		t.Fatalf("the reclaimed contract: %+v", ended)
	}
	if rs := m.requester().Status.Requests; len(rs) != 1 || rs[0].State == marketv1alpha1.RequestContracted {
		t.Errorf("the replica is not back in the market: %+v", rs)
	}

	// A reclaimed lease ended before the notice: reclaimed-early.
	now := ended.Status.Reclaim.Seen.Add(time.Minute)
	lease := &market.Rec{Lease: &market.Lease{State: deal.LeaseCompleted, Reason: deal.Reclaimed}, FirstSeen: now}
	facts := deal.ContractFacts{Phase: marketv1alpha1.ContractActive, Wanted: true, Lease: lease, Reclaim: ended.Status.Reclaim,
		Notice: time.Duration(ended.Spec.NoticeSeconds) * time.Second, TenantAnswers: true}
	if dec := deal.DecideContract(facts, now); dec.Phase != marketv1alpha1.ContractFailed || dec.Reason != string(deal.ReclaimedEarly) {
		t.Errorf("ended a minute after the notice began: %s %s", dec.Phase, dec.Reason)
	}
	lease.FirstSeen = ended.Status.Reclaim.Seen.Add(600 * time.Second)
	if dec := deal.DecideContract(facts, now); dec.Phase != marketv1alpha1.ContractCompleted || dec.Reason != string(deal.Reclaimed) {
		t.Errorf("ended after the notice: %s %s", dec.Phase, dec.Reason)
	}
}

// plantReclaim puts a reclaim record into did's repo as its bidder would,
// by hand.
func (m *marketFixture) plantReclaim(did, leaseURI, terminateAfter string) {
	m.t.Helper()
	raw, _ := json.Marshal(market.Reclaim{Type: lexicon.Reclaim, Lease: market.StrongRef{URI: leaseURI, CID: "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"},
		Reason: "maintenance", TerminateAfter: terminateAfter, CreatedAt: market.Time(m.clock.t)})
	if err := lexicon.ValidateRecord(lexicon.Reclaim, raw); err != nil {
		m.t.Fatalf("the planted reclaim is not valid: %v", err)
	}
	m.repos[did].Put(lexicon.Reclaim, "chand", raw)
}

// TestReclaimHostileRecords: a reclaim whose terminateAfter no Kubernetes
// time can hold (valid in the lexicon) is ignored and the requester goes
// on; a reclaim published before the lease it names counts its notice
// from when the requester saw it, so a lease ended a second after it began
// is reclaimed-early, and that bidder is not taken again for a while.
func TestReclaimHostileRecords(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.NoticeSeconds = 120 })
	ca := drivertest.TestCA(t)
	fit := m.bidders["fit"]

	// Before the lease: the bid is known, the lease's key follows from it.
	m.round()
	bids := m.repos["did:plc:fit"].Records(lexicon.Bid)
	if len(bids) != 1 {
		t.Fatalf("bids %v", bids)
	}
	acceptURI := market.URI("did:plc:shop", lexicon.Accept, market.AcceptKey(market.Owner("shop-uid"), bids[0].URI))
	leaseURI := market.URI("did:plc:fit", lexicon.Lease, market.LeaseKey(market.Owner("fit-uid"), acceptURI))
	m.plantReclaim("did:plc:fit", leaseURI, market.Time(m.clock.t.Add(120*time.Second)))
	m.reconcileRequester()
	m.clock.advance(100 * time.Second) // within the confirm window
	m.activeOn(fit, ca)
	cc := contractWith(t, m.shop, "did:plc:fit")
	if cc == nil || cc.Status.Reclaim == nil || !cc.Status.Reclaim.ShortNotice {
		t.Fatalf("the early reclaim: %+v", cc)
	}
	// The bidder ends the lease a second later, as reclaimed.
	m.clock.advance(time.Second)
	lrec := m.repos["did:plc:fit"].Records(lexicon.Lease)[0]
	var l market.Lease
	if err := json.Unmarshal(lrec.Value, &l); err != nil {
		t.Fatal(err)
	}
	l.State, l.Reason, l.UpdatedAt = deal.LeaseCompleted, deal.Reclaimed, market.Time(m.clock.t)
	raw, _ := json.Marshal(l)
	_, _, rkey := market.SplitURI(lrec.URI)
	m.repos["did:plc:fit"].Put(lexicon.Lease, rkey, raw)
	m.reconcileRequester()
	if ended := contractNamed(t, m.shop, cc.Name); ended == nil || ended.Status.Phase != marketv1alpha1.ContractFailed || ended.Status.Reason != string(deal.ReclaimedEarly) {
		t.Fatalf("a lease ended a second after it began, 120 s of notice owed: %+v", ended)
	}
	m.repos["did:plc:fit"].Delete(lexicon.Reclaim, "chand")
	m.round()
	m.round()
	if s := m.nextBids(); s["did:plc:fit"] != marketv1alpha1.BidNotAllowed {
		t.Errorf("the bidder that ended a reclaimed lease early is taken again: %v", s)
	}

	// A terminateAfter in the year 10000 (UTC) is ignored.
	m2 := newMarket(t, bidderObj("fit", 30, 2))
	m2.activeOn(m2.bidders["fit"], ca)
	bc := contractWith(t, m2.bidders["fit"], "did:plc:fit")
	m2.plantReclaim("did:plc:fit", bc.Status.Records.Lease.URI, "9999-12-31T23:59:59.999-23:59")
	m2.round()
	if cc := contractWith(t, m2.shop, "did:plc:fit"); cc.Status.Reclaim != nil || m2.requester().Status.IgnoredRecords == 0 {
		t.Fatalf("the year-10000 reclaim: %+v, ignored %d", cc.Status.Reclaim, m2.requester().Status.IgnoredRecords)
	}
	m2.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	for range 3 {
		m2.round()
	}
	if cc := contracts(t, m2.shop); len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractCompleted {
		t.Errorf("released after the ignored reclaim: %+v", cc)
	}
}

// TestReclaimReplicasLoweredWhileBuyingTheNext: replicas lowered while
// the next VM of a reclaimed one waits for its lease: the accept is
// withdrawn with the request at once, and the other bidder, whose lease
// the accept's absence ends (once a listing proved it), makes its VM at
// most once and stops it, never making it again.
func TestReclaimReplicasLoweredWhileBuyingTheNext(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2), bidderObj("next", 40, 1))
	ca := drivertest.TestCA(t)
	fit, next := m.bidders["fit"], m.bidders["next"]
	m.activeOn(fit, ca)
	bc := contractWith(t, fit, "did:plc:fit")
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name}} })
	m.reconcileBidder("fit")
	m.reconcileRequester() // the next request
	m.reconcileBidder("next")
	m.reconcileRequester()
	m.clock.advance(11 * time.Second)
	m.reconcileRequester() // accepts next's bid
	if n := m.records("did:plc:shop", lexicon.Accept); n != 2 {
		t.Fatalf("%d accepts, want the reclaimed contract's and the next one's", n)
	}
	m.reconcileBidder("next") // confirms: a lease and a VM
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.Replicas = 0 })
	m.reconcileRequester()
	if n := m.records("did:plc:shop", lexicon.Accept); n != 1 {
		t.Fatalf("%d accepts after replicas 0, want only the reclaimed contract's", n)
	}
	made := 0
	for range 12 {
		had := vmCount(t, next)
		m.round()
		if vmCount(t, next) > had {
			made++
		}
		m.clock.advance(30 * time.Second)
	}
	if made > 1 || vmCount(t, next) != 0 || m.records("did:plc:next", lexicon.Lease) != 0 {
		t.Errorf("next: %d VMs made again, %d VMs, %d leases", made, vmCount(t, next), m.records("did:plc:next", lexicon.Lease))
	}
}

// TestBidderPromisesAtMostItsMaxNotice: a bidder does not bid on a
// request that asks more notice than its spec.maxNoticeSeconds (a
// requester cannot hold its VM for years).
func TestBidderPromisesAtMostItsMaxNotice(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.updateRequester(func(mr *marketv1alpha1.MarketRequester) { mr.Spec.NoticeSeconds = 2 * 86400 })
	m.round()
	if n := m.records("did:plc:fit", lexicon.Bid); n != 0 {
		t.Fatalf("%d bids on a request asking 2 days of notice (default maximum 1 day)", n)
	}
	week := int32(7 * 86400)
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.MaxNoticeSeconds = &week })
	m.round()
	if n := m.records("did:plc:fit", lexicon.Bid); n != 1 {
		t.Fatalf("%d bids once the bidder promises a week", n)
	}
}

// failingDeletes fails deletes of one collection while *fail is set.
type failingDeletes struct {
	market.Publisher
	collection string
	fail       *bool
}

func (f failingDeletes) Publish(ctx context.Context, collection, rkey string, value any) (*pds.EnsureResult, error) {
	if collection == f.collection && value == nil && *f.fail {
		return nil, errors.New("PDS unavailable")
	}
	return f.Publisher.Publish(ctx, collection, rkey, value)
}

// TestReclaimRecordGoesBeforeItsLease: a reclaim record is deleted before
// its lease, so a failed delete leaves both (and they go later), never a
// reclaim without its lease.
func TestReclaimRecordGoesBeforeItsLease(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	fail := false
	m.bid.Connect = func(_ context.Context, _ client.Client, _ string, repo *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
		return failingDeletes{Publisher: m.repos[repo.Status.DID], collection: lexicon.Reclaim, fail: &fail}, nil
	}
	m.activeOn(m.bidders["fit"], drivertest.TestCA(t))
	bc := contractWith(t, m.bidders["fit"], "did:plc:fit")
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name}} })
	m.round()
	m.clock.advance(601 * time.Second)
	fail = true
	for range 6 {
		m.reconcileRequester()
		_, _ = m.bid.Reconcile(context.Background(), mcreconcile.Request{ClusterName: "fit", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "fit"}}})
		if m.records("did:plc:fit", lexicon.Lease) == 0 && m.records("did:plc:fit", lexicon.Reclaim) != 0 {
			t.Fatal("the reclaim record outlives its lease")
		}
	}
	fail = false
	m.clock.advance(11 * time.Minute)
	for range 3 {
		m.round()
	}
	if l, r := m.records("did:plc:fit", lexicon.Lease), m.records("did:plc:fit", lexicon.Reclaim); l != 0 || r != 0 {
		t.Errorf("after the deletes work again: %d leases, %d reclaims", l, r)
	}
}

// plantBid puts a bid on the request req into did's repo by hand, a copy
// of the bidder's first bid.
func (m *marketFixture) plantBid(did string, req *marketv1alpha1.PublishedRecord) {
	m.t.Helper()
	var b market.Bid
	if err := json.Unmarshal(m.repos[did].Records(lexicon.Bid)[0].Value, &b); err != nil {
		m.t.Fatal(err)
	}
	b.Request = market.StrongRef{URI: req.URI, CID: req.CID}
	b.ValidUntil, b.CreatedAt = market.Time(m.clock.t.Add(time.Hour)), market.Time(m.clock.t)
	raw, _ := json.Marshal(b)
	if err := lexicon.ValidateRecord(lexicon.Bid, raw); err != nil {
		m.t.Fatalf("the planted bid is not valid: %v", err)
	}
	m.repos[did].Put(lexicon.Bid, "bhand", raw)
}

// endLease rewrites did's only lease to state (with reason), or deletes
// it when state is "".
func (m *marketFixture) endLease(did string, state deal.LeaseState, reason deal.LeaseReason) {
	m.t.Helper()
	lrec := m.repos[did].Records(lexicon.Lease)[0]
	_, _, rkey := market.SplitURI(lrec.URI)
	if state == "" {
		m.repos[did].Delete(lexicon.Lease, rkey)
		return
	}
	var l market.Lease
	if err := json.Unmarshal(lrec.Value, &l); err != nil {
		m.t.Fatal(err)
	}
	l.State, l.Reason, l.UpdatedAt = state, reason, market.Time(m.clock.t)
	raw, _ := json.Marshal(l)
	m.repos[did].Put(lexicon.Lease, rkey, raw)
}

// TestReclaimEndedEarlyWhateverTheReason: a bidder that gave notice (600 s)
// and ends the lease a second later is judged reclaimed-early and not
// taken again, whatever it says: completed as reclaimed, as vm-lost or
// with no reason, declined, or the lease deleted. After the notice, a
// lease completed as vm-lost is just that.
func TestReclaimEndedEarlyWhateverTheReason(t *testing.T) {
	for _, tc := range []struct {
		name   string
		state  deal.LeaseState
		reason deal.LeaseReason
		after  time.Duration
		want   deal.ContractReason
	}{
		{"reclaimed", deal.LeaseCompleted, deal.Reclaimed, time.Second, deal.ReclaimedEarly},
		{"vm-lost", deal.LeaseCompleted, deal.VMLost, time.Second, deal.ReclaimedEarly},
		{"no reason", deal.LeaseCompleted, "", time.Second, deal.ReclaimedEarly},
		{"declined", deal.LeaseDeclined, deal.Invalid, time.Second, deal.ReclaimedEarly},
		{"lease deleted", "", "", time.Second, deal.ReclaimedEarly},
		{"vm-lost after the notice", deal.LeaseCompleted, deal.VMLost, 601 * time.Second, deal.Of(deal.VMLost)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMarket(t, bidderObj("fit", 30, 2))
			m.activeOn(m.bidders["fit"], drivertest.TestCA(t))
			bc := contractWith(t, m.bidders["fit"], "did:plc:fit")
			m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name}} })
			m.reconcileBidder("fit")
			m.reconcileRequester()
			cc := contractWith(t, m.shop, "did:plc:fit")
			if cc == nil || cc.Status.Reclaim == nil {
				t.Fatalf("no reclaim noted: %+v", cc)
			}
			m.clock.advance(tc.after)
			m.endLease("did:plc:fit", tc.state, tc.reason)
			m.reconcileRequester()
			m.clock.advance(time.Minute) // a listing proves a deleted lease gone
			m.reconcileRequester()
			ended := contractNamed(t, m.shop, cc.Name)
			if ended.Status.Phase != marketv1alpha1.ContractFailed || ended.Status.Reason != string(tc.want) {
				t.Fatalf("ended %s/%s, want Failed/%s", ended.Status.Phase, ended.Status.Reason, tc.want)
			}
			if tc.want != deal.ReclaimedEarly {
				return
			}
			// fit's own controller does not run again: a bid of its, by
			// hand, on the requester's next request.
			m.reconcileRequester()
			m.reconcileRequester()
			m.plantBid("did:plc:fit", m.requester().Status.Requests[0].Record)
			m.reconcileRequester()
			m.clock.advance(11 * time.Second)
			m.reconcileRequester()
			if s := m.nextBids()["did:plc:fit"]; s != marketv1alpha1.BidNotAllowed {
				t.Errorf("the bidder that broke its notice is taken again: %q", s)
			}
		})
	}
}

// TestReclaimStatusWrittenOnce: a reclaim's times carry milliseconds and
// status holds seconds; a reclaimed contract's status is not written again
// on reconciles that change nothing, on either side.
func TestReclaimStatusWrittenOnce(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	fit := m.bidders["fit"]
	m.activeOn(fit, drivertest.TestCA(t))
	rv := func(ws *clustertest.Cluster, name string) string {
		t.Helper()
		cc := contractNamed(t, ws, name)
		if cc == nil {
			t.Fatalf("no contract %s", name)
		}
		return cc.ResourceVersion
	}
	cc, bc := contractWith(t, m.shop, "did:plc:fit"), contractWith(t, fit, "did:plc:fit")
	m.clock.advance(1234 * time.Millisecond)
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name}} })
	m.reconcileBidder("fit")
	m.reconcileRequester()
	m.reconcileRequester()
	if contractNamed(t, m.shop, cc.Name).Status.Reclaim == nil {
		t.Fatal("no reclaim noted")
	}
	before, beforeB := rv(m.shop, cc.Name), rv(fit, bc.Name)
	for range 3 {
		m.reconcileRequester()
		m.reconcileBidder("fit")
	}
	if after, afterB := rv(m.shop, cc.Name), rv(fit, bc.Name); after != before || afterB != beforeB {
		t.Errorf("status written again: requester's %s -> %s, bidder's %s -> %s", before, after, beforeB, afterB)
	}
}

// TestBidderNoticeFromTheRequestItBidOn: a requester that edits its
// request after accepting (same key, 30 days of notice) does not make the
// bidder owe more than the version it bid on asked.
func TestBidderNoticeFromTheRequestItBidOn(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	m.round()
	m.clock.advance(11 * time.Second)
	m.reconcileRequester() // accepts fit's bid
	reqs := m.repos["did:plc:shop"].Records(lexicon.Request)
	if len(reqs) != 1 || m.records("did:plc:shop", lexicon.Accept) != 1 {
		t.Fatalf("%d requests, %d accepts", len(reqs), m.records("did:plc:shop", lexicon.Accept))
	}
	var r map[string]any
	if err := json.Unmarshal(reqs[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	asked := r["noticeSeconds"]
	r["noticeSeconds"] = 30 * 86400
	raw, _ := json.Marshal(r)
	_, _, rkey := market.SplitURI(reqs[0].URI)
	m.repos["did:plc:shop"].Put(lexicon.Request, rkey, raw)
	m.reconcileBidder("fit")
	bc := contractWith(t, m.bidders["fit"], "did:plc:fit")
	if bc == nil {
		t.Fatal("fit did not confirm")
	}
	m.updateBidder("fit", func(b *marketv1alpha1.MarketBidder) { b.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: bc.Name}} })
	published := m.clock.t
	m.reconcileBidder("fit")
	recs := m.repos["did:plc:fit"].Records(lexicon.Reclaim)
	if len(recs) != 1 {
		t.Fatalf("%d reclaims", len(recs))
	}
	var rc market.Reclaim
	if err := json.Unmarshal(recs[0].Value, &rc); err != nil {
		t.Fatal(err)
	}
	if owed := market.ParseTime(rc.TerminateAfter).Sub(published); owed > 86400*time.Second {
		t.Errorf("the edited request (%v s asked when fit bid) makes fit owe %s of notice", asked, owed)
	}
}

package marketrequester

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
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
		if cc.Spec.BidderDID == did && live(&cc) {
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
	// The next VM: fit's bid is not taken, next's is.
	m.round()
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	if s := m.nextBids(); s["did:plc:fit"] != marketv1alpha1.BidNotAllowed || s["did:plc:next"] != marketv1alpha1.BidLeased {
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
	var done *marketv1alpha1.ComputeContract
	for _, cc := range contracts(t, m.shop) {
		if cc.Name == old.Name {
			done = &cc
		}
	}
	if done == nil || done.Status.Phase != marketv1alpha1.ContractCompleted || done.Status.Reason != market.ReleaseReclaimed {
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
	m.round() // fit bids on it
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
	if ended == nil || ended.Status.Phase != marketv1alpha1.ContractCompleted || ended.Status.Reason != market.LeaseReclaimed {
		t.Fatalf("the reclaimed contract: %+v", ended)
	}
	if rs := m.requester().Status.Requests; len(rs) != 1 || rs[0].State == marketv1alpha1.RequestContracted {
		t.Errorf("the replica is not back in the market: %+v", rs)
	}

	// A reclaimed lease ended before the notice: reclaimed-early.
	cc := ended.DeepCopy()
	cc.Status.Phase, cc.Status.Reason = marketv1alpha1.ContractActive, ""
	st := cc.Status.DeepCopy()
	s := &session{r: m.req, now: cc.Status.Reclaim.Seen.Add(time.Minute)}
	lease := &market.Rec{Lease: &market.Lease{State: market.LeaseCompleted, Reason: market.LeaseReclaimed}, FirstSeen: s.now}
	if phase, reason := s.endedByBidder(cc, st, lease); phase != marketv1alpha1.ContractFailed || reason != market.ReclaimedEarly {
		t.Errorf("ended a minute after the notice began: %s %s", phase, reason)
	}
	lease.FirstSeen = cc.Status.Reclaim.Seen.Add(600 * time.Second)
	if phase, reason := s.endedByBidder(cc, st, lease); phase != marketv1alpha1.ContractCompleted || reason != market.LeaseReclaimed {
		t.Errorf("ended after the notice: %s %s", phase, reason)
	}
}

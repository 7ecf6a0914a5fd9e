package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	mdeal "github.com/knotless-dev/knotless/internal/market/deal"
)

// deal is a market for the deal tests: an operator that vouches for the
// participants, a requester workspace (socialweb-application) and a
// bidder workspace (market-bidder), all made by the unprivileged user
// alice with kubectl ws create, every account on the suite's PDS.
type deal struct {
	op         *framework.Account
	opWS       client.Client
	app, bid   client.Client
	bidWS      string
	appWS      string
	bidderUser string
	accounts   map[string]*framework.Account
}

// newDeal sets the market up: requester identities and bidder identities
// (by name), every one but those in unvouched vouched for by the operator
// with its role.
func newDeal(ctx context.Context, t *testing.T, tag string, requesters, bidders, unvouched []string) *deal {
	t.Helper()
	return newDealAs(ctx, t, tag, "alice", requesters, bidders, unvouched)
}

// newDealAs is newDeal with the bidder workspace made by bidderUser.
func newDealAs(ctx context.Context, t *testing.T, tag, bidderUser string, requesters, bidders, unvouched []string) *deal {
	t.Helper()
	d := &deal{accounts: map[string]*framework.Account{}, bidderUser: bidderUser}
	d.opWS = marketWorkspace(ctx, t, env.prefix+"-"+tag+"-op")
	create(ctx, t, d.opWS, network("net", []string{env.pds.URL}, ""))
	d.op = participant(ctx, t, d.opWS, env.pds, env.prefix+tag+"op.test", "operator", "net")

	d.appWS = env.prefix + "-" + tag + "-buyer"
	d.app = userWorkspace(ctx, t, d.appWS, "socialweb-application")
	create(ctx, t, d.app, network("net", []string{env.pds.URL}, d.op.DID))
	d.bidWS = env.prefix + "-" + tag + "-sellers"
	d.bid = userWorkspaceAs(ctx, t, d.bidWS, "market-bidder", bidderUser)
	create(ctx, t, d.bid, network("net", []string{env.pds.URL}, d.op.DID))
	var approve []marketv1alpha1.Association
	for _, name := range requesters {
		d.accounts[name] = participant(ctx, t, d.app, env.pds, env.prefix+tag+name+".test", name, "net")
		approve = append(approve, marketv1alpha1.Association{DID: d.accounts[name].DID, Roles: []marketv1alpha1.Role{marketv1alpha1.RoleRequester}})
	}
	for _, name := range bidders {
		d.accounts[name] = participant(ctx, t, d.bid, env.pds, env.prefix+tag+name+".test", name, "net")
		if !contains(unvouched, name) {
			approve = append(approve, marketv1alpha1.Association{DID: d.accounts[name].DID, Roles: []marketv1alpha1.Role{marketv1alpha1.RoleBidder}})
		}
	}
	d.vouch(ctx, t, approve...)
	return d
}

// vouch adds associations to the deal's operator identity and waits for
// all of its association records on the PDS.
func (d *deal) vouch(ctx context.Context, t *testing.T, add ...marketv1alpha1.Association) {
	t.Helper()
	opID := &marketv1alpha1.MarketIdentity{}
	if err := d.opWS.Get(ctx, client.ObjectKey{Namespace: "default", Name: "operator"}, opID); err != nil {
		t.Fatal(err)
	}
	approve := append(slices.Clone(opID.Spec.ApprovedAssociations), add...)
	raw, _ := json.Marshal(map[string]any{"spec": map[string]any{"approvedAssociations": approve}})
	if err := d.opWS.Patch(ctx, opID, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the operator's association records", func() (bool, string) {
		n := len(listCollection(ctx, t, env.pds, d.op.DID, lexicon.Association))
		return n == len(approve), fmt.Sprintf("%d of %d", n, len(approve))
	})
}

// dumpOnFailure logs the market objects of both workspaces when t failed.
func (d *deal) dumpOnFailure(t *testing.T) {
	if !t.Failed() {
		return
	}
	ctx := context.Background()
	for name, c := range map[string]client.Client{"requester workspace": d.app, "bidder workspace": d.bid} {
		for _, l := range []client.ObjectList{&marketv1alpha1.MarketIdentityList{}, &marketv1alpha1.MarketRequesterList{}, &marketv1alpha1.MarketBidderList{}, &marketv1alpha1.BidList{},
			&marketv1alpha1.ComputeContractList{}, &appsv1alpha1.ComponentList{}, &appsv1alpha1.ApplicationList{}} {
			if err := c.List(ctx, l, client.InNamespace("default")); err != nil {
				t.Logf("%s: %T: %v", name, l, err)
				continue
			}
			items, _ := meta.ExtractList(l)
			for _, it := range items {
				o := it.(client.Object)
				raw, _ := json.Marshal(map[string]any{"status": statusOf(o)})
				t.Logf("%s: %T %s: %s", name, o, o.GetName(), raw)
			}
		}
	}
}

func statusOf(o client.Object) any {
	switch x := o.(type) {
	case *marketv1alpha1.MarketIdentity:
		return x.Status
	case *marketv1alpha1.MarketRequester:
		return x.Status
	case *marketv1alpha1.MarketBidder:
		return x.Status
	case *marketv1alpha1.Bid:
		return map[string]any{"spec": x.Spec, "status": x.Status}
	case *marketv1alpha1.ComputeContract:
		return x.Status
	case *appsv1alpha1.Component:
		return x.Status
	case *appsv1alpha1.Application:
		return x.Status
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func offerOf(name string, cpu, mem int64, price int64, capacity int32) marketv1alpha1.Offer {
	return marketv1alpha1.Offer{Name: name, CPUMillis: cpu, MemoryMiB: mem, Capacity: capacity, PricePerHour: marketv1alpha1.Price{Amount: price, Currency: "USD-cents"}}
}

func (d *deal) bidder(ctx context.Context, t *testing.T, name string, offers ...marketv1alpha1.Offer) {
	t.Helper()
	d.bidderWith(ctx, t, name, "", offers...)
}

// bidderWith is bidder with a driver (empty: the default).
func (d *deal) bidderWith(ctx context.Context, t *testing.T, name string, drv marketv1alpha1.Driver, offers ...marketv1alpha1.Offer) {
	t.Helper()
	b := &marketv1alpha1.MarketBidder{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: marketv1alpha1.MarketBidderSpec{IdentityRef: marketv1alpha1.LocalRef{Name: name}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"},
			Offers: offers, BidValiditySeconds: 120, Driver: drv},
	}
	create(ctx, t, d.bid, b)
	waitMarket(ctx, t, d.bid, &marketv1alpha1.MarketBidder{}, name, "MarketBidder Ready", func(o client.Object) (bool, string) {
		b := o.(*marketv1alpha1.MarketBidder)
		return ready(b.Status.Conditions, b.Generation), summary(b.Status.Phase, b.Status.Conditions)
	})
}

func requesterSpec(identity string, cpu, mem, maxPrice int64, window int32) marketv1alpha1.MarketRequesterSpec {
	return marketv1alpha1.MarketRequesterSpec{
		IdentityRef: marketv1alpha1.LocalRef{Name: identity}, NetworkRef: marketv1alpha1.ClusterRef{Name: "net"},
		Shape: marketv1alpha1.Shape{CPUMillis: cpu, MemoryMiB: mem}, Replicas: 1,
		MaxPricePerHour:  marketv1alpha1.Price{Amount: maxPrice, Currency: "USD-cents"},
		BidWindowSeconds: window, ConfirmSeconds: 60, NoticeSeconds: 600, MaxBidsPerRequest: 20,
	}
}

// exportingSpec is requesterSpec for identity (1000m, 1 GiB, at most 50,
// a 5 s bid window) with alice as tenant admin and the tenant's
// ConfigMaps exported when it is released (StateSync).
func exportingSpec(identity string) marketv1alpha1.MarketRequesterSpec {
	spec := requesterSpec(identity, 1000, 1024, 50, 5)
	spec.TenantAdmins.Users = []string{"alice"}
	spec.StateSync = marketv1alpha1.StateSyncPolicy{Mode: marketv1alpha1.StateSyncExport, Resources: []computev1alpha1.GroupResource{{Resource: "configmaps"}}}
	return spec
}

func (d *deal) requester(ctx context.Context, t *testing.T, name string, spec marketv1alpha1.MarketRequesterSpec) *marketv1alpha1.MarketRequester {
	t.Helper()
	mr := &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: spec}
	create(ctx, t, d.app, mr)
	return mr
}

// contractWait bounds a wait for a contract's state, a guard against a
// hang: the state may need a tenant started (a tenant kcp starts in about
// 30 s on a quiet 2-core machine, and took over 2 min beside a cold CI
// run's image, fuzz and release builds).
const contractWait = 5 * time.Minute

// contractOf waits for the one contract of side owned by owner (a
// MarketRequester or MarketBidder) in c to satisfy ok and returns it.
func contractOf(ctx context.Context, t *testing.T, c client.Client, owner string, what string, ok func(*marketv1alpha1.ComputeContract) bool) *marketv1alpha1.ComputeContract {
	t.Helper()
	var found *marketv1alpha1.ComputeContract
	if err := framework.Eventually(ctx, contractWait, what, func(ctx context.Context) (bool, string, error) {
		var l marketv1alpha1.ComputeContractList
		if err := c.List(ctx, &l, client.InNamespace("default")); err != nil {
			return false, err.Error(), nil
		}
		var states []string
		found = nil
		for i := range l.Items {
			cc := &l.Items[i]
			if ref := metav1.GetControllerOf(cc); ref == nil || ref.Name != owner {
				continue
			}
			states = append(states, cc.Name+"="+string(cc.Status.Phase)+"/"+cc.Status.Reason)
			if ok(cc) {
				found = cc
			}
		}
		return found != nil, strings.Join(states, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

// contractsOwnedBy lists the contracts whose controller owner is owner.
func contractsOwnedBy(ctx context.Context, t *testing.T, c client.Client, owner string) []marketv1alpha1.ComputeContract {
	t.Helper()
	var l marketv1alpha1.ComputeContractList
	if err := c.List(ctx, &l, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var out []marketv1alpha1.ComputeContract
	for _, cc := range l.Items {
		if ref := metav1.GetControllerOf(&cc); ref != nil && ref.Name == owner {
			out = append(out, cc)
		}
	}
	return out
}

// bidsOf returns the Bids owned by owner, by bidder DID.
func bidsOf(ctx context.Context, t *testing.T, c client.Client, owner string) map[string]marketv1alpha1.Bid {
	t.Helper()
	var l marketv1alpha1.BidList
	if err := c.List(ctx, &l, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	out := map[string]marketv1alpha1.Bid{}
	for _, b := range l.Items {
		if ref := metav1.GetControllerOf(&b); ref != nil && ref.Name == owner {
			out[b.Spec.BidderDID] = b
		}
	}
	return out
}

// ownRecords lists the records of a collection in did's repo that the
// MarketRequester or MarketBidder with uid wrote (by the owner part of
// their keys).
func ownRecords(ctx context.Context, t *testing.T, did, collection string, uid string) map[string]pdsRecord {
	t.Helper()
	owner := market.Owner(uid)
	out := map[string]pdsRecord{}
	for k, r := range listCollection(ctx, t, env.pds, did, collection) {
		if strings.HasPrefix(k, "r"+owner+"-") || market.Owns(owner, k) {
			out[k] = r
		}
	}
	return out
}

func getMR(ctx context.Context, t *testing.T, c client.Client, name string) *marketv1alpha1.MarketRequester {
	t.Helper()
	mr := &marketv1alpha1.MarketRequester{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, mr); err != nil {
		t.Fatal(err)
	}
	return mr
}

func getMB(ctx context.Context, t *testing.T, c client.Client, name string) *marketv1alpha1.MarketBidder {
	t.Helper()
	b := &marketv1alpha1.MarketBidder{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func mergePatch(ctx context.Context, t *testing.T, c client.Client, obj client.Object, spec map[string]any) {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{"spec": spec})
	if err := c.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
}

func decodeRecord[T any](t *testing.T, r pdsRecord) *T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Value, &v); err != nil {
		t.Fatalf("%s: %v", r.URI, err)
	}
	return &v
}

// TestMarketDeal walks the market's deal through real kcp, PLC, PDS and
// provider processes, the participants as the unprivileged user alice:
// the fitting bidder wins against one too expensive, one without
// capacity and one the operator does not vouch for (the cheapest); two
// requesters race for a bidder's last capacity; forged records are
// ignored and counted; a request nobody answers stays open and says so;
// and the three ways to release (replicas 0, deletion, suspending the
// owning Application, served by a suspended bidder). Every record is read
// back by a plain ATProto client.
func TestMarketDeal(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	d := newDeal(ctx, t, "d", []string{"shop", "rival"}, []string{"fit", "expensive", "full", "unvouched", "last"}, []string{"unvouched"})
	t.Cleanup(func() { d.dumpOnFailure(t) })
	small := func(price int64, capacity int32) marketv1alpha1.Offer {
		return offerOf("small", 1000, 1024, price, capacity)
	}
	d.bidder(ctx, t, "fit", small(30, 2))
	d.bidder(ctx, t, "expensive", small(80, 2))
	d.bidder(ctx, t, "full", small(20, 0))
	d.bidder(ctx, t, "unvouched", small(10, 2))
	d.bidder(ctx, t, "last", offerOf("medium", 2000, 2048, 40, 2))
	did := func(name string) string { return d.accounts[name].DID }

	t.Run("the fitting bidder wins", func(t *testing.T) {
		start := time.Now()
		d.requester(ctx, t, "shop", requesterSpec("shop", 1000, 1024, 35, 5))
		rc := contractOf(ctx, t, d.app, "shop", "the requester's ComputeContract Provisioning", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractProvisioning && cc.Status.Records.Lease != nil
		})
		agreed := time.Since(start)
		bc := contractOf(ctx, t, d.bid, "fit", "the bidder's ComputeContract Provisioning", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractProvisioning
		})
		t.Logf("FIGURE MarketRequester created -> both contracts agreed (lease seen by the requester): %s with a 5 s bid window", agreed.Round(time.Millisecond))
		mr := getMR(ctx, t, d.app, "shop")
		if rc.Spec.BidderDID != did("fit") || bc.Spec.RequesterDID != did("shop") || rc.Spec.PricePerHour.Amount != 30 {
			t.Fatalf("contract with the wrong party or price: requester side %+v, bidder side %+v", rc.Spec, bc.Spec)
		}
		// Every record of the chain, read back by a plain client.
		reqs := ownRecords(ctx, t, did("shop"), lexicon.Request, string(mr.UID))
		accepts := ownRecords(ctx, t, did("shop"), lexicon.Accept, string(mr.UID))
		bids := listCollection(ctx, t, env.pds, did("fit"), lexicon.Bid)
		leases := listCollection(ctx, t, env.pds, did("fit"), lexicon.Lease)
		if len(reqs) != 1 || len(accepts) != 1 || len(bids) != 1 || len(leases) != 1 {
			t.Fatalf("records: %d requests, %d accepts, %d bids, %d leases; want one each", len(reqs), len(accepts), len(bids), len(leases))
		}
		var req, acc, bid, lease pdsRecord
		for _, r := range reqs {
			req = r
		}
		for _, r := range accepts {
			acc = r
		}
		for _, r := range bids {
			bid = r
		}
		for _, r := range leases {
			lease = r
		}
		a := decodeRecord[market.Accept](t, acc)
		b := decodeRecord[market.Bid](t, bid)
		l := decodeRecord[market.Lease](t, lease)
		if a.Bid.URI != bid.URI || a.Bid.CID != bid.CID || a.Request.URI != req.URI || b.Request.URI != req.URI || b.Request.CID != req.CID ||
			l.Accept.URI != acc.URI || l.Accept.CID != acc.CID || l.State != mdeal.LeaseConfirmed {
			t.Errorf("the chain does not hold together:\nrequest %s\nbid %s\naccept %s\nlease %s", req.Value, bid.Value, acc.Value, lease.Value)
		}
		for _, rec := range []pdsRecord{req, acc, bid, lease} {
			_, col, _ := market.SplitURI(rec.URI)
			if err := lexicon.ValidateRecord(col, rec.Value); err != nil {
				t.Errorf("%s: %v", rec.URI, err)
			}
		}
		for _, side := range []*marketv1alpha1.ComputeContract{rc, bc} {
			r := side.Status.Records
			if r.Request == nil || r.Request.URI != req.URI || r.Bid == nil || r.Bid.URI != bid.URI || r.Accept == nil || r.Accept.URI != acc.URI || r.Lease == nil || r.Lease.URI != lease.URI {
				t.Errorf("%s side's evidence %+v does not name the chain", side.Spec.Side, r)
			}
		}
		// The others: too expensive and without capacity never bid; the
		// unvouched one bid, is recorded as such and lost.
		for _, name := range []string{"expensive", "full"} {
			if n := len(listCollection(ctx, t, env.pds, did(name), lexicon.Bid)); n != 0 {
				t.Errorf("%s made %d bid(s)", name, n)
			}
		}
		seen := bidsOf(ctx, t, d.app, "shop")
		if seen[did("fit")].Status.State != marketv1alpha1.BidLeased || seen[did("unvouched")].Status.State != marketv1alpha1.BidUnvouched {
			t.Errorf("the requester's Bids: fit %s, unvouched %s", seen[did("fit")].Status.State, seen[did("unvouched")].Status.State)
		}
		waitPDS(ctx, t, "the unvouched bidder's bid withdrawn after another was accepted", func() (bool, string) {
			n := len(listCollection(ctx, t, env.pds, did("unvouched"), lexicon.Bid))
			return n == 0, fmt.Sprintf("%d bid records", n)
		})
		waitPDS(ctx, t, "the unvouched bidder's Bid Lost", func() (bool, string) {
			st := bidsOf(ctx, t, d.bid, "unvouched")[did("unvouched")].Status.State
			return st == marketv1alpha1.BidLost, string(st)
		})
		// One writer per status; controllers write no spec of the user's
		// objects; owner references on everything made (D08, D09, D12).
		onlyWriter(t, mr, "knotless-marketrequester")
		onlyWriter(t, getMB(ctx, t, d.bid, "fit"), "knotless-marketbidder")
		for _, b := range bidsOf(ctx, t, d.app, "shop") {
			soleWriter(t, &b, "knotless-marketrequester")
			ownedBy(t, &b, "MarketRequester", mr.UID)
		}
		fitB := getMB(ctx, t, d.bid, "fit")
		for _, b := range bidsOf(ctx, t, d.bid, "fit") {
			soleWriter(t, &b, "knotless-marketbidder")
			ownedBy(t, &b, "MarketBidder", fitB.UID)
		}
		soleWriter(t, rc, "knotless-marketrequester")
		soleWriter(t, bc, "knotless-marketbidder")
		ownedBy(t, rc, "MarketRequester", mr.UID)
		ownedBy(t, bc, "MarketBidder", fitB.UID)
		for _, o := range []client.Object{mr, rc, bc, fitB} {
			for k := range o.GetAnnotations() {
				if strings.Contains(k, "knotless") {
					t.Errorf("%T %s carries annotation %s (no annotations as signals, D18)", o, o.GetName(), k)
				}
			}
		}
		waitMarket(ctx, t, d.app, &marketv1alpha1.MarketRequester{}, "shop", "MarketRequester Contracted", func(o client.Object) (bool, string) {
			mr := o.(*marketv1alpha1.MarketRequester)
			c := meta.FindStatusCondition(mr.Status.Conditions, marketv1alpha1.ConditionReady)
			return c != nil && c.Reason == marketv1alpha1.ReasonContracted && mr.Status.Contracted == 1 && mr.Status.Phase == marketv1alpha1.PhaseReady,
				summary(mr.Status.Phase, mr.Status.Conditions)
		})
		waitPresence(ctx, t, env.pds, did("fit"), "fit", "fit's presence with one VM free", func(p *presence) bool {
			return p != nil && len(p.Offers) == 1 && p.Offers[0].Free == 1
		})
	})

	t.Run("two requesters race for the last capacity", func(t *testing.T) {
		medium := func(identity string) marketv1alpha1.MarketRequesterSpec {
			return requesterSpec(identity, 2000, 2048, 50, 10)
		}
		d.requester(ctx, t, "race-a", medium("shop"))
		d.requester(ctx, t, "race-b", medium("rival"))
		waitPDS(ctx, t, "last bids on both requests", func() (bool, string) {
			n := len(listCollection(ctx, t, env.pds, did("last"), lexicon.Bid))
			return n == 2, fmt.Sprintf("%d bids", n)
		})
		// The bidder sells one elsewhere: one VM left for two accepts.
		mergePatch(ctx, t, d.bid, getMB(ctx, t, d.bid, "last"), map[string]any{"offers": []any{map[string]any{"name": "medium", "cpuMillis": 2000, "memoryMiB": 2048, "capacity": 1,
			"pricePerHour": map[string]any{"amount": 40, "currency": "USD-cents"}}}})
		var won, lost string
		waitPDS(ctx, t, "one lease confirmed and one declined", func() (bool, string) {
			confirmed, declined := 0, 0
			var states []string
			for _, r := range listCollection(ctx, t, env.pds, did("last"), lexicon.Lease) {
				l := decodeRecord[market.Lease](t, r)
				states = append(states, string(l.State)+"/"+string(l.Reason))
				switch {
				case l.State == mdeal.LeaseConfirmed:
					confirmed++
				case l.State == mdeal.LeaseDeclined && l.Reason == mdeal.NoCapacity:
					declined++
				}
			}
			return confirmed == 1 && declined == 1, strings.Join(states, ", ")
		})
		// The requester's contract follows the lease.
		waitPDS(ctx, t, "one of the two requesters contracted", func() (bool, string) {
			a, b := len(contractsOwnedBy(ctx, t, d.app, "race-a")), len(contractsOwnedBy(ctx, t, d.app, "race-b"))
			switch {
			case a == 1 && b == 0:
				won, lost = "race-a", "race-b"
			case b == 1 && a == 0:
				won, lost = "race-b", "race-a"
			default:
				return false, fmt.Sprintf("race-a %d, race-b %d contracts", a, b)
			}
			return true, ""
		})
		if n := len(contractsOwnedBy(ctx, t, d.app, won)) + len(contractsOwnedBy(ctx, t, d.app, lost)); n != 1 {
			t.Fatalf("%d contracts for the two requesters, want exactly one", n)
		}
		contractOf(ctx, t, d.bid, "last", "the bidder's one contract", func(*marketv1alpha1.ComputeContract) bool { return true })
		if n := len(contractsOwnedBy(ctx, t, d.bid, "last")); n != 1 {
			t.Errorf("the bidder holds %d contracts, want 1", n)
		}
		// The loser goes back to the market: a second request, which
		// nobody can serve now.
		waitMarket(ctx, t, d.app, &marketv1alpha1.MarketRequester{}, lost, "the declined requester back in the market", func(o client.Object) (bool, string) {
			mr := o.(*marketv1alpha1.MarketRequester)
			ok := len(mr.Status.Requests) == 1 && mr.Status.Requests[0].Attempt == 2 && mr.Status.Requests[0].State == marketv1alpha1.RequestOpen
			return ok, fmt.Sprintf("%+v; %s", mr.Status.Requests, summary(mr.Status.Phase, mr.Status.Conditions))
		})
		if st := bidsOf(ctx, t, d.app, lost)[did("last")].Status.State; st != marketv1alpha1.BidDeclined {
			t.Errorf("the loser's Bid of last is %s, want Declined", st)
		}
		if err := d.app.Delete(ctx, getMR(ctx, t, d.app, lost)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("forged records are ignored", func(t *testing.T) {
		probe := d.requester(ctx, t, "probe", requesterSpec("shop", 1000, 1024, 35, 120))
		var bid pdsRecord
		waitPDS(ctx, t, "fit's bid on the probe", func() (bool, string) {
			for _, r := range listCollection(ctx, t, env.pds, did("fit"), lexicon.Bid) {
				if b := decodeRecord[market.Bid](t, r); strings.Contains(b.Request.URI, "/r"+market.Owner(string(getMR(ctx, t, d.app, "probe").UID))+"-") {
					bid = r
					return true, ""
				}
			}
			return false, "no bid"
		})
		b := decodeRecord[market.Bid](t, bid)
		forged := func(bidCID string) map[string]any {
			return map[string]any{"$type": lexicon.Accept, "bid": map[string]any{"uri": bid.URI, "cid": bidCID},
				"request": map[string]any{"uri": b.Request.URI, "cid": b.Request.CID}, "confirmBy": market.Time(time.Now().Add(time.Minute)), "createdAt": market.Time(time.Now())}
		}
		// In a repo that is not the requester's, and in the requester's
		// repo but naming another version of the bid.
		put := func(acct *framework.Account, rkey string, value map[string]any) {
			t.Helper()
			in := map[string]any{"repo": acct.DID, "collection": lexicon.Accept, "rkey": rkey, "record": value}
			if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", acct.AccessJWT, nil, in, nil); err != nil {
				t.Fatal(err)
			}
		}
		put(d.accounts["unvouched"], "aforged", forged(bid.CID))
		put(d.accounts["shop"], "awrongcid", forged("bafyreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"))
		// The one in a repo nobody vouches for as a requester is not even
		// kept by the feeds; the one in the requester's repo is ignored and
		// counted.
		waitMarket(ctx, t, d.bid, &marketv1alpha1.MarketBidder{}, "fit", "fit counts the forged accept", func(o client.Object) (bool, string) {
			b := o.(*marketv1alpha1.MarketBidder)
			return b.Status.IgnoredRecords >= 1, fmt.Sprintf("ignored %d", b.Status.IgnoredRecords)
		})
		time.Sleep(2 * time.Second) // the other one has had its chance
		for _, r := range listCollection(ctx, t, env.pds, did("fit"), lexicon.Lease) {
			if l := decodeRecord[market.Lease](t, r); strings.Contains(l.Accept.URI, "aforged") || strings.Contains(l.Accept.URI, "awrongcid") {
				t.Errorf("fit answered a forged accept: %s", r.Value)
			}
		}
		// Bad input at admission.
		refused := func(what string, obj client.Object, field string) {
			t.Helper()
			err := d.app.Create(ctx, obj, client.FieldOwner("e2e-user"))
			if err == nil {
				t.Errorf("%s was accepted", what)
				_ = d.app.Delete(ctx, obj)
				return
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), field) {
				t.Errorf("%s: %v, want Invalid naming %s", what, err, field)
			}
		}
		bad := requesterSpec("shop", 0, 1024, 35, 5)
		refused("a shape without CPU", &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Name: "bad-shape", Namespace: "default"}, Spec: bad}, "spec.shape.cpuMillis")
		bad = requesterSpec("shop", 1000, 1024, -1, 5)
		refused("a negative price", &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Name: "bad-price", Namespace: "default"}, Spec: bad}, "spec.maxPricePerHour.amount")
		float := map[string]any{"apiVersion": marketv1alpha1.GroupVersion.String(), "kind": "MarketRequester",
			"metadata": map[string]any{"name": "float", "namespace": "default"},
			"spec": map[string]any{"identityRef": map[string]any{"name": "shop"}, "networkRef": map[string]any{"name": "net"},
				"shape": map[string]any{"cpuMillis": 1000, "memoryMiB": 1024}, "maxPricePerHour": map[string]any{"amount": 2.5, "currency": "USD-cents"}}}
		refused("a float price", &unstructured.Unstructured{Object: float}, "spec.maxPricePerHour.amount")
		many := requesterSpec("shop", 1000, 1024, 35, 5)
		many.Replicas = 1000
		refused("1000 replicas", &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Name: "many", Namespace: "default"}, Spec: many}, "spec.replicas")
		// A requester whose identity does not exist: a condition, nothing
		// published.
		d.requester(ctx, t, "nobody", requesterSpec("nobody", 1000, 1024, 35, 5))
		waitMarket(ctx, t, d.app, &marketv1alpha1.MarketRequester{}, "nobody", "MarketRequester NotFound", func(o client.Object) (bool, string) {
			mr := o.(*marketv1alpha1.MarketRequester)
			c := meta.FindStatusCondition(mr.Status.Conditions, marketv1alpha1.ConditionReady)
			return c != nil && c.Reason == marketv1alpha1.ReasonNotFound, summary(mr.Status.Phase, mr.Status.Conditions)
		})
		for _, name := range []string{"nobody", "probe"} {
			if err := d.app.Delete(ctx, getMR(ctx, t, d.app, name)); err != nil {
				t.Fatal(err)
			}
		}
		waitPDS(ctx, t, "the probe's request and the bids on it withdrawn", func() (bool, string) {
			n := len(ownRecords(ctx, t, did("shop"), lexicon.Request, string(probe.UID)))
			m := len(listCollection(ctx, t, env.pds, did("fit"), lexicon.Bid))
			return n == 0 && m == 1, fmt.Sprintf("%d requests, fit has %d bids (1 is the leased one)", n, m)
		})
	})

	t.Run("no bidders at all", func(t *testing.T) {
		d.requester(ctx, t, "lonely", requesterSpec("rival", 64000, 65536, 1000, 2))
		waitMarket(ctx, t, d.app, &marketv1alpha1.MarketRequester{}, "lonely", "MarketRequester NoBids", func(o client.Object) (bool, string) {
			mr := o.(*marketv1alpha1.MarketRequester)
			c := meta.FindStatusCondition(mr.Status.Conditions, marketv1alpha1.ConditionReady)
			ok := c != nil && c.Reason == marketv1alpha1.ReasonNoBids && len(mr.Status.Requests) == 1 && mr.Status.Requests[0].NextAttempt != nil &&
				mr.Status.Requests[0].State == marketv1alpha1.RequestOpen
			return ok, summary(mr.Status.Phase, mr.Status.Conditions)
		})
		mr := getMR(ctx, t, d.app, "lonely")
		if n := len(ownRecords(ctx, t, did("rival"), lexicon.Request, string(mr.UID))); n != 1 {
			t.Errorf("%d open requests, want 1", n)
		}
		if err := d.app.Delete(ctx, mr); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("release", func(t *testing.T) {
		// replicas 0.
		mr := getMR(ctx, t, d.app, "shop")
		mergePatch(ctx, t, d.app, mr, map[string]any{"replicas": 0})
		contractOf(ctx, t, d.bid, "fit", "fit's contract Completed", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReplicasLowered)
		})
		contractOf(ctx, t, d.app, "shop", "shop's contract Completed", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Records.Release != nil
		})
		waitPDS(ctx, t, "every record of the released deal gone", func() (bool, string) {
			n := 0
			for _, col := range []string{lexicon.Request, lexicon.Accept, lexicon.Release} {
				n += len(ownRecords(ctx, t, did("shop"), col, string(mr.UID)))
			}
			m := len(listCollection(ctx, t, env.pds, did("fit"), lexicon.Bid)) + len(listCollection(ctx, t, env.pds, did("fit"), lexicon.Lease))
			return n == 0 && m == 0, fmt.Sprintf("requester %d, bidder %d records", n, m)
		})
		waitPresence(ctx, t, env.pds, did("fit"), "fit", "fit's capacity back", func(p *presence) bool { return p != nil && p.Offers[0].Free == 2 })

		// Deletion of the race's winner.
		for _, name := range []string{"race-a", "race-b"} {
			if err := d.app.Delete(ctx, &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
		}
		contractOf(ctx, t, d.bid, "last", "last's contract Completed by the deletion", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.RequesterDeleted)
		})
		waitPDS(ctx, t, "the deleted requesters gone", func() (bool, string) {
			errA := d.app.Get(ctx, client.ObjectKey{Namespace: "default", Name: "race-a"}, &marketv1alpha1.MarketRequester{})
			errB := d.app.Get(ctx, client.ObjectKey{Namespace: "default", Name: "race-b"}, &marketv1alpha1.MarketRequester{})
			return apierrors.IsNotFound(errA) && apierrors.IsNotFound(errB), fmt.Sprintf("%v; %v", errA, errB)
		})

		// Suspending the Application that owns a requester, served by a
		// suspended bidder.
		app := &appsv1alpha1.Application{
			ObjectMeta: metav1.ObjectMeta{Name: "buyer", Namespace: "default"},
			Spec: appsv1alpha1.ApplicationSpec{Components: []appsv1alpha1.ApplicationComponent{{
				Name: "vms", Template: appsv1alpha1.ComponentTemplate{MarketRequester: ptrTo(requesterSpec("shop", 1000, 1024, 35, 3))},
			}}},
		}
		create(ctx, t, d.app, app)
		contractOf(ctx, t, d.app, "vms", "the Application's requester contracted", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractProvisioning
		})
		mergePatch(ctx, t, d.bid, getMB(ctx, t, d.bid, "fit"), map[string]any{"suspend": true})
		waitMarket(ctx, t, d.bid, &marketv1alpha1.MarketBidder{}, "fit", "fit Suspended", func(o client.Object) (bool, string) {
			b := o.(*marketv1alpha1.MarketBidder)
			return b.Status.Phase == marketv1alpha1.PhaseSuspended && b.Status.ObservedGeneration == b.Generation, summary(b.Status.Phase, b.Status.Conditions)
		})
		mergePatch(ctx, t, d.app, app, map[string]any{"suspend": true})
		contractOf(ctx, t, d.bid, "fit", "fit (suspended) completes the release of the suspended Application", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReleaseSuspended)
		})
		waitMarket(ctx, t, d.app, &marketv1alpha1.MarketRequester{}, "vms", "the Application's requester Suspended", func(o client.Object) (bool, string) {
			mr := o.(*marketv1alpha1.MarketRequester)
			c := meta.FindStatusCondition(mr.Status.Conditions, "Suspended")
			return mr.Status.Phase == marketv1alpha1.PhaseSuspended && len(mr.Status.Requests) == 0 && c != nil && c.Status == metav1.ConditionTrue,
				summary(mr.Status.Phase, mr.Status.Conditions)
		})
		if err := d.app.Delete(ctx, app); err != nil {
			t.Fatal(err)
		}
	})
}

// soleWriter fails unless manager wrote every field of o (spec and
// status) that anyone wrote: the objects a controller makes from the
// records have one writer (D08, D09).
func soleWriter(t *testing.T, o client.Object, manager string) {
	t.Helper()
	for _, mf := range o.GetManagedFields() {
		if mf.Manager != manager {
			t.Errorf("%T %s: written by %q as well as %q (%s)", o, o.GetName(), mf.Manager, manager, mf.Subresource)
		}
	}
}

func ownedBy(t *testing.T, o client.Object, kind string, uid types.UID) {
	t.Helper()
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != kind || ref.UID != uid {
		t.Errorf("%T %s: controller owner %+v, want %s %s", o, o.GetName(), ref, kind, uid)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestMarketDealSurvivesProviderKills: kill -9 of the provider after the
// request is published, during the bid window, after the accept and
// after the lease; after every restart, exactly one contract per VM on
// each side and no second record in either repo; a release made just
// before a kill is not lost.
func TestMarketDealSurvivesProviderKills(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	d := newDeal(ctx, t, "k", []string{"kshop"}, []string{"kbid"}, nil)
	t.Cleanup(func() { d.dumpOnFailure(t) })
	d.bidder(ctx, t, "kbid", offerOf("xl", 3000, 3072, 45, 1))
	did := func(name string) string { return d.accounts[name].DID }
	kill := func(step string) {
		t.Helper()
		start := time.Now()
		env.provider.Kill9()
		if err := env.provider.Restart(ctx, env.group); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed the provider %s; restarted in %s", step, time.Since(start).Round(time.Millisecond))
	}
	d.requester(ctx, t, "k", requesterSpec("kshop", 3000, 3072, 50, 25))
	mr := getMR(ctx, t, d.app, "k")
	uid := string(mr.UID)
	waitPDS(ctx, t, "the request", func() (bool, string) {
		return len(ownRecords(ctx, t, did("kshop"), lexicon.Request, uid)) == 1, ""
	})
	kill("after the request")
	waitPDS(ctx, t, "the bid", func() (bool, string) {
		return len(listCollection(ctx, t, env.pds, did("kbid"), lexicon.Bid)) == 1, ""
	})
	waitPDS(ctx, t, "the requester's Bid", func() (bool, string) {
		return len(bidsOf(ctx, t, d.app, "k")) == 1, ""
	})
	kill("during the bid window")
	waitPDS(ctx, t, "the accept", func() (bool, string) {
		return len(ownRecords(ctx, t, did("kshop"), lexicon.Accept, uid)) == 1, ""
	})
	kill("after the accept")
	waitPDS(ctx, t, "the lease", func() (bool, string) {
		return len(listCollection(ctx, t, env.pds, did("kbid"), lexicon.Lease)) == 1, ""
	})
	kill("after the lease")
	contractOf(ctx, t, d.app, "k", "the requester's contract", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractProvisioning
	})
	contractOf(ctx, t, d.bid, "kbid", "the bidder's contract", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractProvisioning
	})
	time.Sleep(4 * time.Second) // past an inventory listing (3 s in the suite)
	counts := map[string]int{
		"requests": len(ownRecords(ctx, t, did("kshop"), lexicon.Request, uid)),
		"accepts":  len(ownRecords(ctx, t, did("kshop"), lexicon.Accept, uid)),
		"bids":     len(listCollection(ctx, t, env.pds, did("kbid"), lexicon.Bid)),
		"leases":   len(listCollection(ctx, t, env.pds, did("kbid"), lexicon.Lease)),
	}
	for what, n := range counts {
		if n != 1 {
			t.Errorf("%d %s after the kills, want 1", n, what)
		}
	}
	if a, b := len(contractsOwnedBy(ctx, t, d.app, "k")), len(contractsOwnedBy(ctx, t, d.bid, "kbid")); a != 1 || b != 1 {
		t.Errorf("contracts after the kills: requester %d, bidder %d; want 1 each", a, b)
	}

	// A release just before a kill is not lost.
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "k"), map[string]any{"replicas": 0})
	waitPDS(ctx, t, "the release", func() (bool, string) {
		return len(ownRecords(ctx, t, did("kshop"), lexicon.Release, uid)) == 1, ""
	})
	kill("after the release")
	contractOf(ctx, t, d.bid, "kbid", "the bidder's contract Completed after the restart", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReplicasLowered)
	})
	contractOf(ctx, t, d.app, "k", "the requester's contract Completed after the restart", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractCompleted
	})
}

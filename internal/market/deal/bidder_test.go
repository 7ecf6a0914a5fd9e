package deal

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	gocid "github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
)

const (
	shop     = "did:plc:shop"
	fit      = "did:plc:fit"
	rival    = "did:plc:rival"
	mallory  = "did:plc:mallory"
	operator = "did:plc:operator"
	owner    = "own12345"
	network  = "default/market"
)

// cid is a valid CID named name (the SHA-256 of it, dag-cbor).
func cid(name string) string {
	h, err := multihash.Sum([]byte(name), multihash.SHA2_256, -1)
	if err != nil {
		panic(err)
	}
	return gocid.NewCidV1(gocid.DagCBOR, h).String()
}

var fingerprint = "sha256:" + strings.Repeat("a", 64)

var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// fakeView is a network's records as a test sets them.
type fakeView struct {
	recs     map[string]*market.Rec
	vouched  map[string]bool
	listed   map[string]time.Time
	complete error
}

func (v *fakeView) Complete() error            { return v.complete }
func (v *fakeView) Get(uri string) *market.Rec { return v.recs[uri] }
func (v *fakeView) Listed(did string) time.Time {
	return v.listed[did]
}

func (v *fakeView) Vouches(voucher, subject, role string) bool {
	return voucher == operator && v.vouched[subject+"|"+role]
}

func (v *fakeView) Children(uri, collection string) []*market.Rec {
	var out []*market.Rec
	for _, r := range v.recs {
		if r.Collection != collection {
			continue
		}
		if r.Parent.URI == uri || (r.Accept != nil && r.Accept.Request.URI == uri) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *market.Rec) int { return strings.Compare(a.URI, b.URI) })
	return out
}

func (v *fakeView) Requests() []*market.Rec {
	var out []*market.Rec
	for _, r := range v.recs {
		if r.Request != nil {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *market.Rec) int { return strings.Compare(a.URI, b.URI) })
	return out
}

// missing is the Absences state a test sets.
type missing map[string]time.Time

func (m missing) Since(key string) (time.Time, bool) { t, ok := m[key]; return t, ok }

// fixture builds a bidder's snapshot.
type fixture struct {
	t    *testing.T
	view *fakeView
	miss missing
	s    *BidderSnapshot
}

func newFixture(t *testing.T, capacity int32) *fixture {
	v := &fakeView{recs: map[string]*market.Rec{}, vouched: map[string]bool{shop + "|requester": true}, listed: map[string]time.Time{}}
	m := missing{}
	return &fixture{t: t, view: v, miss: m, s: &BidderSnapshot{
		Name: "fit", Namespace: "default", DID: fit, Owner: owner, Network: network, Operator: operator,
		Spec: marketv1alpha1.MarketBidderSpec{Offers: []marketv1alpha1.Offer{{Name: "small", CPUMillis: 1000, MemoryMiB: 1024,
			PricePerHour: marketv1alpha1.Price{Amount: 30, Currency: "credits"}, Capacity: capacity}}},
		View: v, Missing: m,
		BidObjects: map[string]*marketv1alpha1.Bid{}, Contracts: map[string]*marketv1alpha1.ComputeContract{},
		VMs: map[string]*computev1alpha1.ComputeVM{},
	}}
}

func (f *fixture) add(did, col, rkey, cid string, value any, firstSeen time.Time) *market.Rec {
	f.t.Helper()
	raw, err := json.Marshal(value)
	if err != nil {
		f.t.Fatal(err)
	}
	rec, err := market.NewRec(market.URI(did, col, rkey), cid, "", raw, firstSeen)
	if err != nil {
		f.t.Fatal(err)
	}
	f.view.recs[rec.URI] = rec
	return rec
}

// request adds shop's request with a deadline d after t0.
func (f *fixture) request(rkey string, d time.Duration, maxPrice int64) *market.Rec {
	return f.add(shop, lexicon.Request, rkey, cid("cidreq"), &market.Request{Type: lexicon.Request, Shape: market.Shape{CPUMillis: 1000, MemoryMiB: 1024},
		MaxPricePerHour: market.Price{Amount: maxPrice, Currency: "credits"}, BidDeadline: market.Time(t0.Add(d)), NoticeSeconds: 600, Network: network,
		CreatedAt: market.Time(t0.Add(-time.Minute))}, t0)
}

func own(t *testing.T, did, col, rkey, cid string, value any) pds.Record {
	t.Helper()
	raw, err := json.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	if err := lexicon.ValidateRecord(col, raw); err != nil {
		t.Fatalf("%s: %v", col, err)
	}
	return pds.Record{URI: market.URI(did, col, rkey), CID: cid, Value: raw}
}

// bid adds the bidder's own bid on req (valid until validUntil after t0).
func (f *fixture) bid(req *market.Rec, validUntil time.Duration) (uri string, b *market.Bid) {
	b = &market.Bid{Type: lexicon.Bid, Request: req.Ref(), PricePerHour: market.Price{Amount: 30, Currency: "credits"},
		Shape: &market.Shape{Name: "small", CPUMillis: 1000, MemoryMiB: 1024}, ValidUntil: market.Time(t0.Add(validUntil)), CreatedAt: market.Time(t0.Add(-time.Minute))}
	rec := own(f.t, fit, lexicon.Bid, market.BidKey(owner, req.URI), cid("cidbid"), b)
	f.s.Bids = append(f.s.Bids, rec)
	return rec.URI, b
}

// accept adds an accept by did of the bid at bidURI on req.
func (f *fixture) accept(did, rkey, bidURI, bidCID string, req *market.Rec, confirmBy time.Duration, seen time.Time) *market.Rec {
	return f.add(did, lexicon.Accept, rkey, cid("cidacc")+rkey, &market.Accept{Type: lexicon.Accept, Bid: market.StrongRef{URI: bidURI, CID: bidCID},
		Request: req.Ref(), ConfirmBy: market.Time(t0.Add(confirmBy)), CreatedAt: market.Time(seen)}, seen)
}

// leased makes a confirmed deal: request, bid, accept, the bidder's lease
// in state and its contract (Phase) with VM (nil: none).
func (f *fixture) leased(state LeaseState, phase Phase, vm computev1alpha1.VMPhase) (acc *market.Rec, leaseURI, name string) {
	req := f.request("r1", -time.Minute, 50)
	bidURI, _ := f.bid(req, time.Minute)
	acc = f.accept(shop, "a1", bidURI, cid("cidbid"), req, time.Minute, t0.Add(-30*time.Second))
	l := &market.Lease{Type: lexicon.Lease, Accept: acc.Ref(), Bid: &market.StrongRef{URI: bidURI, CID: cid("cidbid")}, State: state,
		CreatedAt: market.Time(t0.Add(-20 * time.Second)), UpdatedAt: market.Time(t0.Add(-20 * time.Second))}
	if state == LeaseRunning {
		l.CAFingerprint, l.CABundle, l.Endpoint, l.ServiceID = fingerprint, "PEM", "https://127.0.0.1:7443/clusters/root", fit+"#knotless_tenant_x"
	}
	rec := own(f.t, fit, lexicon.Lease, market.LeaseKey(owner, acc.URI), cid("cidlease"), l)
	f.s.Leases = append(f.s.Leases, rec)
	name = market.ChildName("fit", acc.URI)
	if phase != "" {
		f.s.Contracts[name] = &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "cc-uid"},
			Spec:   marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideBidder, RequesterDID: shop, BidderDID: fit, Accept: market.APIRef(acc.Ref()), Bid: marketv1alpha1.RecordRef{URI: bidURI, CID: cid("cidbid")}, Request: market.APIRef(req.Ref()), NoticeSeconds: 600, Shape: marketv1alpha1.Shape{CPUMillis: 1000, MemoryMiB: 1024}},
			Status: marketv1alpha1.ComputeContractStatus{Phase: phase}}
	}
	if vm != "" {
		f.s.VMs[name] = &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "vm-uid"},
			Status: computev1alpha1.ComputeVMStatus{Phase: vm, CAFingerprint: fingerprint, CABundle: "PEM", Endpoint: "https://127.0.0.1:7443/clusters/root", ServiceID: fit + "#knotless_tenant_x"}}
	}
	return acc, rec.URI, name
}

// release adds the requester's (or did's) release of the lease.
func (f *fixture) release(did, leaseURI string, why ReleaseReason) *market.Rec {
	return f.add(did, lexicon.Release, "x1", cid("cidrel"), &market.Release{Type: lexicon.Release, Lease: market.StrongRef{URI: leaseURI, CID: cid("cidlease")},
		Reason: why, CreatedAt: market.Time(t0)}, t0)
}

// leaseWrite is the lease value the plan writes (nil: none).
func leaseWrite(p *Plan) *market.Lease {
	for _, r := range p.Records {
		if r.Collection == lexicon.Lease && r.Value != nil {
			return r.Value.(*market.Lease)
		}
	}
	return nil
}

func contractPhase(p *Plan) Phase {
	for _, op := range p.Contracts {
		return op.Status.Phase
	}
	return ""
}

func bidState(p *Plan) State {
	for _, op := range p.Bids {
		return op.Status.State
	}
	return ""
}

// bidderCase is one row of TestDecideBidder: a snapshot, and what the
// plan must say.
type bidderCase struct {
	name  string
	setup func(f *fixture)
	// want are the transitions taken, in order.
	want  []TransitionID
	check func(t *testing.T, f *fixture, p *Plan)
}

func bidderCases() []bidderCase {
	return slices.Concat(bidCases(), acceptCases(), leaseCases(), releaseCases())
}

func bidCases() []bidderCase {
	return []bidderCase{
		{name: "bid on a vouched requester's request", setup: func(f *fixture) { f.request("r1", 5*time.Second, 50) }, want: []TransitionID{BidPlace},
			check: func(t *testing.T, f *fixture, p *Plan) {
				if len(p.Records) != 1 || p.Records[0].Collection != lexicon.Bid || bidState(p) != marketv1alpha1.BidOpen || p.Counts.Reserved[0] != 1 {
					t.Errorf("plan %+v", p)
				}
				b := p.Records[0].Value.(*market.Bid)
				if b.ValidUntil != market.Time(t0.Add(65*time.Second)) || b.PricePerHour.Amount != 30 {
					t.Errorf("bid %+v", b)
				}
				if !p.Requeue.Equal(t0.Add(65 * time.Second)) {
					t.Errorf("requeue at %s", p.Requeue)
				}
			}},
		{name: "no bid for an unvouched requester", setup: func(f *fixture) { f.request("r1", 5*time.Second, 50); f.view.vouched = nil }},
		{name: "no bid after the deadline (late)", setup: func(f *fixture) { f.request("r1", 0, 50) }},
		{name: "no bid on a deadline beyond the window", setup: func(f *fixture) { f.request("r1", MaxBidWindow+time.Second, 50) }},
		{name: "no bid over the requester's budget", setup: func(f *fixture) { f.request("r1", 5*time.Second, 29) }},
		{name: "no bid on another network's request", setup: func(f *fixture) { f.request("r1", 5*time.Second, 50).Request.Network = "other/net" }},
		{name: "no bid on a notice longer than promised", setup: func(f *fixture) {
			f.request("r1", 5*time.Second, 50)
			f.s.Spec.MaxNoticeSeconds = new(int32(60))
		}},
		{name: "no bid when suspended", setup: func(f *fixture) { f.request("r1", 5*time.Second, 50); f.s.Stop = "suspended" }},
		{name: "the last capacity goes to one bid", setup: func(f *fixture) {
			f.s.Spec.Offers[0].Capacity = 1
			f.request("r1", 5*time.Second, 50)
			f.request("r2", 5*time.Second, 50)
		}, want: []TransitionID{BidPlace}},
		{name: "bid held while open", setup: func(f *fixture) { f.bid(f.request("r1", 5*time.Second, 50), time.Minute) }, want: []TransitionID{BidHold},
			check: func(t *testing.T, f *fixture, p *Plan) {
				if p.Counts.Reserved[0] != 1 || len(p.Records) != 0 {
					t.Errorf("plan %+v", p)
				}
			}},
		{name: "bid lost to a leased rival", setup: func(f *fixture) {
			req := f.request("r1", -time.Second, 50)
			f.bid(req, time.Minute)
			rivalBid := market.URI(rival, lexicon.Bid, "b1")
			acc := f.accept(shop, "a9", rivalBid, cid("cidrival"), req, time.Minute, t0)
			f.add(rival, lexicon.Lease, "l1", cid("cidrl"), &market.Lease{Type: lexicon.Lease, Accept: acc.Ref(), State: LeaseConfirmed, CreatedAt: market.Time(t0)}, t0)
		}, want: []TransitionID{BidLost}, check: freed},
		{name: "a rival's lease forged in mallory's repo does not end the bid", setup: func(f *fixture) {
			req := f.request("r1", -time.Second, 50)
			f.bid(req, time.Minute)
			acc := f.accept(shop, "a9", market.URI(rival, lexicon.Bid, "b1"), cid("cidrival"), req, time.Minute, t0)
			f.add(mallory, lexicon.Lease, "l1", cid("cidml"), &market.Lease{Type: lexicon.Lease, Accept: acc.Ref(), State: LeaseConfirmed, CreatedAt: market.Time(t0)}, t0)
		}, want: []TransitionID{BidHold}},
		{name: "bid withdrawn when the request is edited", setup: func(f *fixture) {
			req := f.request("r1", 5*time.Second, 50)
			f.bid(req, time.Minute)
			req.CID = cid("cidreq2")
		}, want: []TransitionID{BidRequestEdited}, check: freed},
		{name: "a missing request is listed again first", setup: func(f *fixture) {
			req := f.request("r1", 5*time.Second, 50)
			f.bid(req, time.Minute)
			delete(f.view.recs, req.URI)
		}, want: []TransitionID{BidHold}, check: func(t *testing.T, f *fixture, p *Plan) {
			if len(p.Look.Note) != 1 || !slices.Contains(p.Look.List, shop) {
				t.Errorf("look %+v", p.Look)
			}
		}},
		{name: "bid withdrawn once a listing proves the request gone", setup: func(f *fixture) {
			req := f.request("r1", 5*time.Second, 50)
			f.bid(req, time.Minute)
			delete(f.view.recs, req.URI)
			f.miss["request|"+req.URI] = t0.Add(-2 * time.Second)
			f.view.listed[shop] = t0.Add(-time.Second)
		}, want: []TransitionID{BidRequestWithdrawn}, check: freed},
		{name: "bid expired", setup: func(f *fixture) { f.bid(f.request("r1", -2*time.Minute, 50), -time.Second) }, want: []TransitionID{BidExpired}, check: freed},
		{name: "bid not expired while the view is incomplete", setup: func(f *fixture) {
			f.bid(f.request("r1", -2*time.Minute, 50), -time.Second)
			f.view.complete = errors.New("listing")
		}, want: []TransitionID{BidHold}},
		{name: "a Bid whose record is gone is withdrawn", setup: func(f *fixture) {
			f.s.BidObjects["gone"] = &marketv1alpha1.Bid{ObjectMeta: metav1.ObjectMeta{Name: "gone"}, Spec: marketv1alpha1.BidSpec{Bid: marketv1alpha1.RecordRef{URI: "at://did:plc:fit/dev.knotless.market.bid/bx"}},
				Status: marketv1alpha1.BidStatus{State: marketv1alpha1.BidOpen}}
		}, want: []TransitionID{BidRecordGone}},
	}
}

// freed: the bid record is deleted and holds no capacity.
func freed(t *testing.T, f *fixture, p *Plan) {
	t.Helper()
	if len(p.Records) != 1 || p.Records[0].Value != nil || p.Records[0].Collection != lexicon.Bid || p.Counts.Reserved[0] != 0 {
		t.Errorf("plan %+v", p)
	}
}

func acceptCases() []bidderCase {
	open := func(f *fixture, confirmBy time.Duration, seen time.Time) {
		req := f.request("r1", -time.Second, 50)
		uri, _ := f.bid(req, time.Minute)
		f.accept(shop, "a1", uri, cid("cidbid"), req, confirmBy, seen)
	}
	declined := func(want LeaseReason) func(t *testing.T, f *fixture, p *Plan) {
		return func(t *testing.T, f *fixture, p *Plan) {
			if l := leaseWrite(p); l == nil || l.State != LeaseDeclined || l.Reason != want || bidState(p) != marketv1alpha1.BidDeclined || len(p.Contracts) != 0 {
				t.Errorf("plan %+v, lease %+v", p, l)
			}
		}
	}
	return []bidderCase{
		{name: "accept confirmed", setup: func(f *fixture) { open(f, time.Minute, t0) }, want: []TransitionID{AcceptConfirm},
			check: func(t *testing.T, f *fixture, p *Plan) {
				if l := leaseWrite(p); l == nil || l.State != LeaseConfirmed || bidState(p) != marketv1alpha1.BidLeased || contractPhase(p) != marketv1alpha1.ContractProvisioning {
					t.Errorf("plan %+v", p)
				}
				for _, op := range p.Contracts {
					if op.Create == nil || op.Needs != 0 || op.Create.NoticeSeconds != 600 || op.Create.RequesterDID != shop {
						t.Errorf("contract %+v", op)
					}
				}
				if p.Counts.Used[0] != 1 || p.Counts.Reserved[0] != 0 || p.Records[0].Undo != (Undo{Offer: 0, Used: -1, Reserved: 1}) {
					t.Errorf("counts %+v, undo %+v", p.Counts, p.Records[0].Undo)
				}
			}},
		{name: "accept declined when suspended", setup: func(f *fixture) { open(f, time.Minute, t0); f.s.Stop = "suspended" }, want: []TransitionID{AcceptDecline}, check: declined(Suspended)},
		{name: "an accept seen after confirmBy is declined (expired)", setup: func(f *fixture) { open(f, -time.Second, t0) }, want: []TransitionID{AcceptDecline}, check: declined(Expired)},
		{name: "an accept seen after the bid's validUntil is declined (expired)", setup: func(f *fixture) { open(f, 5*time.Minute, t0.Add(2*time.Minute)) }, want: []TransitionID{AcceptDecline}, check: declined(Expired)},
		{name: "race for the last capacity: one accept confirmed, the other declined", setup: func(f *fixture) {
			f.s.Spec.Offers[0].Capacity = 1
			for _, k := range []string{"r1", "r2"} {
				req := f.request(k, -time.Second, 50)
				uri, _ := f.bid(req, time.Minute)
				f.accept(shop, "a"+k, uri, cid("cidbid"), req, time.Minute, t0)
			}
		}, want: []TransitionID{AcceptConfirm, AcceptDecline}, check: func(t *testing.T, f *fixture, p *Plan) {
			if l := p.Records[1].Value.(*market.Lease); l.Reason != NoCapacity || p.Counts.Used[0] != 1 {
				t.Errorf("second lease %+v, counts %+v", l, p.Counts)
			}
		}},
		{name: "an accept forged in mallory's repo is ignored", setup: func(f *fixture) {
			req := f.request("r1", -time.Second, 50)
			uri, _ := f.bid(req, time.Minute)
			f.accept(mallory, "a1", uri, cid("cidbid"), req, time.Minute, t0)
		}, want: []TransitionID{BidHold}, check: func(t *testing.T, f *fixture, p *Plan) {
			if len(p.Ignored) != 1 || len(p.Records) != 0 {
				t.Errorf("plan %+v", p)
			}
		}},
		{name: "an accept of another version of the bid is ignored", setup: func(f *fixture) {
			req := f.request("r1", -time.Second, 50)
			uri, _ := f.bid(req, time.Minute)
			f.accept(shop, "a1", uri, cid("cidother"), req, time.Minute, t0)
		}, want: []TransitionID{BidHold}, check: func(t *testing.T, f *fixture, p *Plan) {
			if len(p.Ignored) != 1 || len(p.Records) != 0 {
				t.Errorf("plan %+v", p)
			}
		}},
	}
}

func leaseCases() []bidderCase {
	return []bidderCase{
		{name: "a leased VM is made", setup: func(f *fixture) { f.leased(LeaseConfirmed, marketv1alpha1.ContractProvisioning, "") }, want: []TransitionID{LeaseProvision},
			check: func(t *testing.T, f *fixture, p *Plan) {
				if len(p.VMs) != 1 || p.VMs[0].Create == nil || len(p.Records) != 0 || p.Counts.Used[0] != 1 {
					t.Errorf("plan %+v", p)
				}
				// The tenant is the requester's to administer by its
				// identity, and its service identity is the bidder's.
				if c := p.VMs[0].Create; c != nil && (!slices.Equal(c.AdminDIDs, []string{shop}) || c.ServiceDID != fit) {
					t.Errorf("VM spec %+v", c)
				}
			}},
		{name: "a running VM makes the lease running", setup: func(f *fixture) {
			f.leased(LeaseConfirmed, marketv1alpha1.ContractProvisioning, computev1alpha1.VMRunning)
		}, want: []TransitionID{LeaseRun}, check: func(t *testing.T, f *fixture, p *Plan) {
			if l := leaseWrite(p); l == nil || l.State != LeaseRunning || l.CAFingerprint == "" || contractPhase(p) != marketv1alpha1.ContractActive ||
				l.CABundle != "PEM" || l.Endpoint != "https://127.0.0.1:7443/clusters/root" || l.ServiceID != fit+"#knotless_tenant_x" {
				t.Errorf("plan %+v", p)
			}
		}},
		{name: "a running lease whose endpoint changed is written again", setup: func(f *fixture) {
			_, _, name := f.leased(LeaseRunning, marketv1alpha1.ContractActive, computev1alpha1.VMRunning)
			f.s.VMs[name].Status.Endpoint = "https://127.0.0.1:7444/clusters/root"
		}, want: []TransitionID{LeaseRun}, check: func(t *testing.T, f *fixture, p *Plan) {
			if l := leaseWrite(p); l == nil || l.Endpoint != "https://127.0.0.1:7444/clusters/root" {
				t.Errorf("plan %+v", p)
			}
		}},
		{name: "a running lease gets the agent's gateway", setup: func(f *fixture) {
			_, _, name := f.leased(LeaseRunning, marketv1alpha1.ContractActive, computev1alpha1.VMRunning)
			f.s.VMs[name].Status.Gateway = "gw.fit.example:443"
			f.s.VMs[name].Status.SSHAddress, f.s.VMs[name].Status.SSHHostKey = "gw.fit.example:22", "SHA256:x"
		}, want: []TransitionID{LeaseRun}, check: func(t *testing.T, f *fixture, p *Plan) {
			if l := leaseWrite(p); l == nil || l.Gateway != "gw.fit.example:443" || l.Endpoint != "https://127.0.0.1:7443/clusters/root" ||
				l.SSHAddress != "gw.fit.example:22" || l.SSHHostKey != "SHA256:x" {
				t.Errorf("plan %+v", p)
			}
		}},
		{name: "a lost VM ends the lease (vm-lost)", setup: func(f *fixture) { f.leased(LeaseRunning, marketv1alpha1.ContractActive, computev1alpha1.VMLost) },
			want: []TransitionID{LeaseVMLost}, check: ended(VMLost)},
		{name: "a failed VM ends the lease (driver-failed)", setup: func(f *fixture) {
			f.leased(LeaseConfirmed, marketv1alpha1.ContractProvisioning, computev1alpha1.VMFailed)
		},
			want: []TransitionID{LeaseVMLost}, check: ended(DriverFailed)},
		{name: "spec.reclaims publishes a reclaim with the request's notice", setup: func(f *fixture) {
			_, _, name := f.leased(LeaseRunning, marketv1alpha1.ContractActive, computev1alpha1.VMRunning)
			f.s.Spec.Reclaims = []marketv1alpha1.Reclaim{{Contract: name, Reason: ReclaimCapacity}}
		}, want: []TransitionID{LeaseReclaim}, check: func(t *testing.T, f *fixture, p *Plan) {
			rc, ok := p.Records[0].Value.(*market.Reclaim)
			if !ok || rc.Reason != ReclaimCapacity || rc.TerminateAfter != market.Time(t0.Add(600*time.Second)) || !p.Requeue.Equal(t0.Add(30*time.Second)) {
				t.Fatalf("plan %+v", p)
			}
			for _, op := range p.Contracts {
				if op.Status.Reclaim == nil || op.Status.Phase != marketv1alpha1.ContractActive {
					t.Errorf("contract status %+v", op.Status)
				}
			}
		}},
	}
}

// releaseCases: the lease ends.
func releaseCases() []bidderCase {
	return []bidderCase{
		{name: "a released VM is stopped", setup: func(f *fixture) {
			_, leaseURI, _ := f.leased(LeaseRunning, marketv1alpha1.ContractActive, computev1alpha1.VMRunning)
			f.release(shop, leaseURI, ReplicasLowered)
		}, want: []TransitionID{LeaseStopVM}, check: func(t *testing.T, f *fixture, p *Plan) {
			if len(p.VMs) != 1 || p.VMs[0].Delete == nil || contractPhase(p) != marketv1alpha1.ContractReleasing || p.Counts.Used[0] != 0 {
				t.Errorf("plan %+v", p)
			}
		}},
		{name: "a release forged in mallory's repo is ignored", setup: func(f *fixture) {
			_, leaseURI, _ := f.leased(LeaseRunning, marketv1alpha1.ContractActive, computev1alpha1.VMRunning)
			f.release(mallory, leaseURI, ReplicasLowered)
		}, want: []TransitionID{LeaseProvision}, check: func(t *testing.T, f *fixture, p *Plan) {
			if len(p.Ignored) == 0 || len(p.VMs) != 0 || p.Counts.Used[0] != 1 {
				t.Errorf("plan %+v", p)
			}
		}},
		{name: "a released lease whose VM is gone completes", setup: func(f *fixture) {
			_, leaseURI, _ := f.leased(LeaseRunning, marketv1alpha1.ContractReleasing, "")
			f.release(shop, leaseURI, ReplicasLowered)
		}, want: []TransitionID{LeaseComplete}, check: completed("", ReplicasLowered)},
		{name: "a lease whose reclaim notice ran out completes as reclaimed", setup: func(f *fixture) {
			_, leaseURI, _ := f.leased(LeaseRunning, marketv1alpha1.ContractReleasing, "")
			_, _, rkey := market.SplitURI(leaseURI)
			_ = rkey
			f.s.Reclaims = append(f.s.Reclaims, own(f.t, fit, lexicon.Reclaim, market.ReclaimKey(owner, leaseURI), cid("cidrc"), &market.Reclaim{Type: lexicon.Reclaim,
				Lease: market.StrongRef{URI: leaseURI, CID: cid("cidlease")}, Reason: ReclaimMaintenance, TerminateAfter: market.Time(t0.Add(-time.Second)), CreatedAt: market.Time(t0.Add(-time.Hour))}))
		}, want: []TransitionID{LeaseComplete}, check: completed(Reclaimed, ReleaseReason(Reclaimed))},
		{name: "a withdrawn accept ends the lease", setup: func(f *fixture) {
			acc, _, _ := f.leased(LeaseRunning, marketv1alpha1.ContractActive, "")
			delete(f.view.recs, acc.URI)
			f.miss["accept|"+acc.URI] = t0.Add(-2 * time.Second)
			f.view.listed[shop] = t0.Add(-time.Second)
		}, want: []TransitionID{LeaseComplete}, check: func(t *testing.T, f *fixture, p *Plan) {
			for _, op := range p.Contracts {
				if op.Status.Reason != string(AcceptWithdrawn) {
					t.Errorf("contract %+v", op.Status)
				}
			}
		}},
		{name: "a completed lease ends its live contract", setup: func(f *fixture) { f.leased(LeaseCompleted, marketv1alpha1.ContractActive, "") },
			want: []TransitionID{LeaseEnded, LeaseWait}},
		{name: "a lease ended for vm-lost whose contract was not written fails it (vm-lost)", setup: func(f *fixture) {
			_, uri, _ := f.leased(LeaseCompleted, marketv1alpha1.ContractActive, "")
			for i, r := range f.s.Leases {
				if r.URI == uri {
					var l market.Lease
					_ = json.Unmarshal(r.Value, &l)
					l.Reason = VMLost
					f.s.Leases[i].Value, _ = json.Marshal(&l)
				}
			}
		},
			want: []TransitionID{LeaseEnded, LeaseWait}, check: func(t *testing.T, f *fixture, p *Plan) {
				if contractPhase(p) != marketv1alpha1.ContractFailed {
					t.Errorf("plan %+v", p)
				}
			}},
		{name: "a declined lease fails its contract", setup: func(f *fixture) { f.leased(LeaseDeclined, marketv1alpha1.ContractProvisioning, "") },
			want: []TransitionID{LeaseEnded, LeaseWait}, check: func(t *testing.T, f *fixture, p *Plan) {
				if contractPhase(p) != marketv1alpha1.ContractFailed {
					t.Errorf("plan %+v", p)
				}
			}},
		{name: "an ended lease settles once the accept is gone", setup: func(f *fixture) {
			acc, _, _ := f.leased(LeaseCompleted, marketv1alpha1.ContractCompleted, "")
			delete(f.view.recs, acc.URI)
		}, want: []TransitionID{LeaseSettle}, check: func(t *testing.T, f *fixture, p *Plan) {
			if len(p.Records) != 2 || p.Records[0].Collection != lexicon.Lease || p.Records[1].Collection != lexicon.Bid {
				t.Errorf("records %+v", p.Records)
			}
		}},
	}
}

// ended: the lease completes with reason, the contract fails and the VM
// goes.
func ended(reason LeaseReason) func(t *testing.T, f *fixture, p *Plan) {
	return func(t *testing.T, f *fixture, p *Plan) {
		if l := leaseWrite(p); l == nil || l.State != LeaseCompleted || l.Reason != reason || contractPhase(p) != marketv1alpha1.ContractFailed || len(p.VMs) != 1 || p.VMs[0].Delete == nil {
			t.Errorf("plan %+v", p)
		}
	}
}

// completed: the lease completes (with the lease reason), the contract
// is Completed with the contract reason.
func completed(leaseReason LeaseReason, why ReleaseReason) func(t *testing.T, f *fixture, p *Plan) {
	return func(t *testing.T, f *fixture, p *Plan) {
		l := leaseWrite(p)
		if l == nil || l.State != LeaseCompleted || l.Reason != leaseReason || contractPhase(p) != marketv1alpha1.ContractCompleted {
			t.Fatalf("plan %+v", p)
		}
		for _, op := range p.Contracts {
			if op.Status.Reason != string(why) {
				t.Errorf("contract reason %q, want %q", op.Status.Reason, why)
			}
		}
	}
}

// TestDecideBidder: each of the bidder's transitions, the reasons it
// gives, and the hostile records it must not act on.
func TestDecideBidder(t *testing.T) {
	for _, tc := range bidderCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 10)
			tc.setup(f)
			p := DecideBidder(f.s, t0)
			if got := p.Transitions(); !slices.Equal(got, tc.want) {
				t.Fatalf("transitions %v, want %v", got, tc.want)
			}
			if tc.want == nil && (len(p.Records) != 0 || len(p.Bids) != 0) {
				t.Errorf("a plan with no transition writes %+v", p)
			}
			if tc.check != nil {
				tc.check(t, f, p)
			}
		})
	}
}

// TestEveryBidderTransitionIsTested: every row of the bidder's table is
// taken by a case of TestDecideBidder.
func TestEveryBidderTransitionIsTested(t *testing.T) {
	var wants [][]TransitionID
	for _, tc := range bidderCases() {
		wants = append(wants, tc.want)
	}
	everyRowTaken(t, BidderTransitions(), wants, "TestDecideBidder")
}

// everyRowTaken fails for each row of table that no case's transitions
// (wants) take.
func everyRowTaken(t *testing.T, table []Transition, wants [][]TransitionID, test string) {
	t.Helper()
	taken := map[TransitionID]bool{}
	for _, want := range wants {
		for _, id := range want {
			taken[id] = true
		}
	}
	for _, tr := range table {
		if !taken[tr.ID] {
			t.Errorf("transition %s is taken by no case of %s", tr.ID, test)
		}
	}
}

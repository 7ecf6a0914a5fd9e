package deal

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
)

// rfixture builds a requester's snapshot: shop buys replica 0.
type rfixture struct {
	*fixture
	s   *RequesterSnapshot
	rr  *Replica
	req *OwnRequest
}

func newRequesterFixture(t *testing.T) *rfixture {
	f := newFixture(t, 1)
	f.view.vouched = map[string]bool{fit + "|bidder": true, rival + "|bidder": true}
	rr := &Replica{Index: 0, Attempt: 1, Attempts: map[int64]*OwnRequest{}}
	return &rfixture{fixture: f, rr: rr, s: &RequesterSnapshot{
		Name: "shop", DID: shop, Owner: owner, Network: network, Operator: operator,
		Spec: marketv1alpha1.MarketRequesterSpec{Shape: marketv1alpha1.Shape{CPUMillis: 1000, MemoryMiB: 1024}, Replicas: 1,
			MaxPricePerHour: marketv1alpha1.Price{Amount: 50, Currency: "credits"}, BidWindowSeconds: 10, ConfirmSeconds: 60, NoticeSeconds: 600},
		View: f.view, Missing: f.miss,
		Bids: map[string]*marketv1alpha1.Bid{}, Contracts: map[string]*marketv1alpha1.ComputeContract{},
		Replicas: []*Replica{rr},
	}}
}

// request makes shop's request of replica 0 made at t0+at, with its
// deadline d after t0, and makes it the current one.
func (f *rfixture) request(at, d time.Duration) *OwnRequest {
	when := t0.Add(at)
	rkey := market.RequestKey(owner, 0, when)
	req := &OwnRequest{URI: market.URI(shop, lexicon.Request, rkey), CID: cid("cidreq" + rkey), RKey: rkey, Request: &market.Request{Type: lexicon.Request,
		Shape: market.Shape{CPUMillis: 1000, MemoryMiB: 1024}, MaxPricePerHour: market.Price{Amount: 50, Currency: "credits"},
		BidDeadline: market.Time(t0.Add(d)), NoticeSeconds: 600, Network: network, CreatedAt: market.Time(when)}}
	_, stamp, _ := market.ParseRequestKey(owner, rkey)
	f.rr.Attempts[stamp] = req
	if stamp >= f.rr.Stamp {
		f.rr.Stamp, f.rr.Current, f.req = stamp, req, req
	}
	return req
}

// bidOn adds did's bid on the current request (30 credits a small VM,
// valid for 5 min, first seen 5 s before t0), as mod changes it.
func (f *rfixture) bidOn(did string, mod func(b *market.Bid), firstSeen ...time.Time) *market.Rec {
	b := &market.Bid{Type: lexicon.Bid, Request: market.StrongRef{URI: f.req.URI, CID: f.req.CID}, PricePerHour: market.Price{Amount: 30, Currency: "credits"},
		Shape: &market.Shape{Name: "small", CPUMillis: 1000, MemoryMiB: 1024}, ValidUntil: market.Time(t0.Add(5 * time.Minute)), CreatedAt: market.Time(t0.Add(-time.Minute))}
	if mod != nil {
		mod(b)
	}
	seen := t0.Add(-5 * time.Second)
	if len(firstSeen) > 0 {
		seen = firstSeen[0]
	}
	return f.add(did, lexicon.Bid, market.BidKey(owner, f.req.URI), cid("cidbid"+did), b, seen)
}

// accepted adds shop's accept of bid (confirmBy after t0).
func (f *rfixture) accepted(bid *market.Rec, confirmBy time.Duration) *OwnAccept {
	rkey := market.AcceptKey(owner, bid.URI)
	acc := &market.Accept{Type: lexicon.Accept, Bid: bid.Ref(), Request: market.StrongRef{URI: f.req.URI, CID: f.req.CID},
		ConfirmBy: market.Time(t0.Add(confirmBy)), CreatedAt: market.Time(t0.Add(-10 * time.Second))}
	rec := own(f.t, shop, lexicon.Accept, rkey, cid("cidacc"), acc)
	f.s.Accepts = append(f.s.Accepts, rec)
	return &OwnAccept{URI: rec.URI, CID: rec.CID, RKey: rkey, Accept: acc}
}

// leaseFrom adds did's lease in state answering the accept (of CID
// acceptCID).
func (f *rfixture) leaseFrom(did string, acc *OwnAccept, acceptCID string, state LeaseState, reason LeaseReason) *market.Rec {
	return f.add(did, lexicon.Lease, market.LeaseKey(owner, acc.URI), cid("cidlease"+did), &market.Lease{Type: lexicon.Lease,
		Accept: market.StrongRef{URI: acc.URI, CID: acceptCID}, State: state, Reason: reason,
		CreatedAt: market.Time(t0.Add(-5 * time.Second)), UpdatedAt: market.Time(t0.Add(-5 * time.Second))}, t0.Add(-5*time.Second))
}

// bidObject adds the requester's Bid of did's bid rec in state, made at.
func (f *rfixture) bidObject(rec *market.Rec, did string, state State, at time.Time) *marketv1alpha1.Bid {
	name := market.ChildName("shop", rec.URI+"|"+rec.CID)
	b := &marketv1alpha1.Bid{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(at)},
		Spec:   marketv1alpha1.BidSpec{Side: marketv1alpha1.SideRequester, Request: marketv1alpha1.RecordRef{URI: f.req.URI, CID: f.req.CID}, Bid: market.APIRef(rec.Ref()), BidderDID: did},
		Status: marketv1alpha1.BidStatus{State: state}}
	f.s.Bids[name] = b
	return b
}

// requesterCase is one row of TestDecideRequester.
type requesterCase struct {
	name  string
	setup func(f *rfixture)
	want  []TransitionID
	check func(t *testing.T, f *rfixture, p *Plan)
}

// bidStateOf is the state the plan writes on the Bid of rec ("" none).
func bidStateOf(p *Plan, rec *market.Rec) State {
	if op := p.Bids[market.ChildName("shop", rec.URI+"|"+rec.CID)]; op != nil {
		return op.Status.State
	}
	return ""
}

func status(t *testing.T, p *Plan) marketv1alpha1.RequestStatus {
	t.Helper()
	if len(p.Requests) != 1 {
		t.Fatalf("%d request statuses, want 1", len(p.Requests))
	}
	return p.Requests[0].Status
}

// refused is a case of a bid judged not acceptable (before the deadline).
func refused(name string, id TransitionID, state State, setup func(f *rfixture) *market.Rec) requesterCase {
	var rec *market.Rec
	return requesterCase{name: name, want: []TransitionID{id, RoundCollect},
		setup: func(f *rfixture) { f.request(-5*time.Second, 5*time.Second); rec = setup(f) },
		check: func(t *testing.T, _ *rfixture, p *Plan) {
			if got := bidStateOf(p, rec); got != state {
				t.Errorf("Bid %s, want %s", got, state)
			}
		}}
}

func judgeCases() []requesterCase {
	return []requesterCase{
		refused("an acceptable bid is Open", BidAcceptable, marketv1alpha1.BidOpen, func(f *rfixture) *market.Rec { return f.bidOn(fit, nil) }),
		refused("forged: a bid on another version of the request", BidOtherVersion, marketv1alpha1.BidInvalid, func(f *rfixture) *market.Rec {
			return f.bidOn(fit, func(b *market.Bid) { b.Request.CID = cid("older") })
		}),
		refused("a bid smaller than asked", BidTooSmall, marketv1alpha1.BidInvalid, func(f *rfixture) *market.Rec {
			return f.bidOn(fit, func(b *market.Bid) { b.Shape.CPUMillis = 500 })
		}),
		refused("over budget", BidOverBudget, marketv1alpha1.BidOverBudget, func(f *rfixture) *market.Rec {
			return f.bidOn(fit, func(b *market.Bid) { b.PricePerHour.Amount = 51 })
		}),
		refused("over budget in another currency", BidOverBudget, marketv1alpha1.BidOverBudget, func(f *rfixture) *market.Rec {
			return f.bidOn(fit, func(b *market.Bid) { b.PricePerHour.Currency = "USD" })
		}),
		refused("a bidder spec.policy does not allow", BidNotAllowed, marketv1alpha1.BidNotAllowed, func(f *rfixture) *market.Rec {
			f.s.Spec.Policy.AllowedBidders = []string{rival}
			return f.bidOn(fit, nil)
		}),
		refused("an unvouched bidder", BidUnvouched, marketv1alpha1.BidUnvouched, func(f *rfixture) *market.Rec { return f.bidOn(mallory, nil) }),
		refused("an expired bid", BidJudgedExpired, marketv1alpha1.BidExpired, func(f *rfixture) *market.Rec {
			return f.bidOn(fit, func(b *market.Bid) { b.ValidUntil = market.Time(t0.Add(-time.Second)) })
		}),
		refused("a bid that declined stays Declined", BidOutcomeKept, marketv1alpha1.BidDeclined, func(f *rfixture) *market.Rec {
			rec := f.bidOn(fit, nil)
			f.bidObject(rec, fit, marketv1alpha1.BidDeclined, t0.Add(-time.Hour))
			return rec
		}),
		refused("a bidder that reclaims a VM of this requester", BidReclaiming, marketv1alpha1.BidNotAllowed, func(f *rfixture) *market.Rec {
			f.s.Contracts["old"] = &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: "old"},
				Spec:   marketv1alpha1.ComputeContractSpec{BidderDID: fit, ReplicaIndex: 1, Request: marketv1alpha1.RecordRef{URI: "at://" + shop + "/x/other"}},
				Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive, Reclaim: &marketv1alpha1.ContractReclaim{Reason: "maintenance"}}}
			return f.bidOn(fit, nil)
		}),
		refused("a bidder that stopped a reclaimed VM early", BidReclaimedEarly, marketv1alpha1.BidNotAllowed, func(f *rfixture) *market.Rec {
			f.s.Contracts["old"] = &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: "old"},
				Spec: marketv1alpha1.ComputeContractSpec{BidderDID: fit, NoticeSeconds: 600},
				Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractFailed, Reason: string(ReclaimedEarly),
					Reclaim: &marketv1alpha1.ContractReclaim{Seen: metav1.NewTime(t0.Add(-time.Minute))}}}
			return f.bidOn(fit, nil)
		}),
		refused("a bidder that did not answer an accept lately", BidAvoided, marketv1alpha1.BidVoid, func(f *rfixture) *market.Rec {
			rec := f.bidOn(fit, nil)
			other := *rec
			other.URI, other.CID = "at://"+fit+"/"+lexicon.Bid+"/earlier", cid("earlier")
			f.bidObject(&other, fit, marketv1alpha1.BidVoid, t0.Add(-time.Minute))
			return rec
		}),
		{name: "a bid first seen after the deadline is Late", want: []TransitionID{BidLate, RoundEmpty},
			setup: func(f *rfixture) { f.request(-15*time.Second, -5*time.Second); f.bidOn(fit, nil, t0.Add(-time.Second)) },
			check: func(t *testing.T, f *rfixture, p *Plan) {
				if s := status(t, p); s.NextAttempt == nil || s.Acceptable != 0 || s.Bids != 1 {
					t.Errorf("status %+v, want no acceptable bid and a next attempt", s)
				}
			}},
		{name: "a Bid whose record went is Withdrawn", want: []TransitionID{RoundCollect, BidWithdrawnByBidder},
			setup: func(f *rfixture) {
				f.request(-5*time.Second, 5*time.Second)
				gone, _ := market.NewRec("at://"+fit+"/"+lexicon.Bid+"/gone", cid("gone"), "", []byte(`{}`), t0)
				f.bidObject(gone, fit, marketv1alpha1.BidOpen, t0.Add(-time.Second))
			},
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				for _, op := range p.Bids {
					if op.Status.State != marketv1alpha1.BidWithdrawn {
						t.Errorf("Bid %s, want Withdrawn", op.Status.State)
					}
				}
			}},
	}
}

func roundCases() []requesterCase {
	return []requesterCase{
		{name: "no request: one is published", want: []TransitionID{RequestPublish},
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Records) != 1 || p.Records[0].Collection != lexicon.Request || p.Records[0].Value == nil {
					t.Fatalf("records %+v, want one request", p.Records)
				}
				req := p.Records[0].Value.(*market.Request)
				if req.BidDeadline != market.Time(t0.Add(10*time.Second)) || req.Network != network || req.NoticeSeconds != 600 {
					t.Errorf("request %+v", req)
				}
				if op := p.Requests[0]; op.Needs != 0 || op.Status.Attempt != 2 || op.Before.Attempt != 1 || op.Status.Record == nil {
					t.Errorf("status %+v", op)
				}
				if !p.Requeue.Equal(t0.Add(10 * time.Second)) {
					t.Errorf("requeue %s, want the deadline", p.Requeue)
				}
			}},
		{name: "a request of an earlier attempt is withdrawn with its accept", want: []TransitionID{RequestWithdrawEarlier, RoundCollect},
			setup: func(f *rfixture) {
				f.request(-time.Minute, -50*time.Second)
				bid := f.bidOn(fit, nil)
				f.accepted(bid, -time.Second)
				f.request(-5*time.Second, 5*time.Second)
			},
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Records) != 1 || p.Records[0].Collection != lexicon.Accept || p.Records[0].Then == nil || p.Records[0].Then.Collection != lexicon.Request {
					t.Errorf("records %+v, want the accept deleted, then the request", p.Records)
				}
			}},
		{name: "the deadline passed, the view is incomplete", want: []TransitionID{BidAcceptable, RoundReading},
			setup: func(f *rfixture) {
				f.request(-15*time.Second, -time.Second)
				f.bidOn(fit, nil)
				f.view.complete = errors.New("reading the market")
			},
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Records) != 0 || !p.Requeue.Equal(t0.Add(time.Second)) {
					t.Errorf("records %+v, requeue %s: want nothing written and a look in 1 s", p.Records, p.Requeue)
				}
			}},
		{name: "the cheapest acceptable bid is accepted", want: []TransitionID{BidAcceptable, BidAcceptable, AcceptPublish},
			setup: func(f *rfixture) {
				f.request(-15*time.Second, -time.Second)
				f.bidOn(fit, nil)
				f.bidOn(rival, func(b *market.Bid) { b.PricePerHour.Amount = 20 })
			},
			check: func(t *testing.T, f *rfixture, p *Plan) {
				if len(p.Records) != 1 || p.Records[0].Collection != lexicon.Accept {
					t.Fatalf("records %+v, want one accept", p.Records)
				}
				if p.Records[0].MarketStep != market.StepDeadlineAccept || !p.Records[0].Since.Equal(t0.Add(-time.Second)) {
					t.Errorf("the accept ends step %q begun at %s, want deadline_accept from the deadline", p.Records[0].MarketStep, p.Records[0].Since)
				}
				acc := p.Records[0].Value.(*market.Accept)
				if !strings.HasPrefix(acc.Bid.URI, "at://"+rival) || acc.ConfirmBy != market.Time(t0.Add(time.Minute)) || acc.Request.CID != f.req.CID {
					t.Errorf("accept %+v, want rival's bid, confirmBy in a minute", acc)
				}
				for _, op := range p.Bids {
					if op.Needs != 0 {
						t.Errorf("Bid %s is written whether the accept is or not", op.Name)
					}
				}
				if s := status(t, p); s.State != marketv1alpha1.RequestAccepted || s.Accept == nil || s.Acceptable != 2 {
					t.Errorf("status %+v", s)
				}
				if len(p.Events) != 1 || p.Events[0].Reason != "Accepted" || p.Events[0].Needs != 0 {
					t.Errorf("events %+v", p.Events)
				}
			}},
		{name: "no bid: asked again after the retry wait", want: []TransitionID{RoundEmpty},
			setup: func(f *rfixture) { f.request(-12*time.Second, -2*time.Second) },
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if s := status(t, p); s.NextAttempt == nil || !s.NextAttempt.Time.Equal(t0.Add(8*time.Second)) || !strings.HasPrefix(s.Message, "no bidder answered") {
					t.Errorf("status %+v", s)
				}
			}},
		{name: "no bid and the retry wait ran out: a new request", want: []TransitionID{RoundAgain, RequestPublish},
			setup: func(f *rfixture) { f.request(-time.Minute, -50*time.Second) },
			check: func(t *testing.T, f *rfixture, p *Plan) {
				if len(p.Records) != 1 || p.Records[0].Value != nil || p.Records[0].RKey != f.req.RKey || p.Records[0].Then == nil || p.Records[0].Then.Value == nil {
					t.Errorf("records %+v, want the request deleted, then a new one", p.Records)
				}
			}},
	}
}

func acceptAnswerCases() []requesterCase {
	var acc *OwnAccept
	var bid *market.Rec
	setup := func(confirmBy time.Duration) func(f *rfixture) {
		return func(f *rfixture) {
			f.request(-time.Minute, -50*time.Second)
			bid = f.bidOn(fit, nil, t0.Add(-55*time.Second))
			acc = f.accepted(bid, confirmBy)
		}
	}
	then := func(more func(f *rfixture), confirmBy time.Duration) func(f *rfixture) {
		return func(f *rfixture) { setup(confirmBy)(f); more(f) }
	}
	// A declined or void accept: first its Bid says so, nothing else (a
	// failed Bid write leaves the accept, so the bidder is avoided whatever
	// fails); then, once the Bid says so, the accept is deleted and nothing
	// else (no second accept while the deletion may fail).
	voided := func(state State) func(t *testing.T, f *rfixture, p *Plan) {
		return func(t *testing.T, f *rfixture, p *Plan) {
			if got := bidStateOf(p, bid); got != state {
				t.Errorf("Bid %s, want %s", got, state)
			}
			if len(p.Records) != 0 {
				t.Errorf("records %+v, want none before the Bid says %s", p.Records, state)
			}
		}
	}
	deleted := func(t *testing.T, f *rfixture, p *Plan) {
		if len(p.Records) != 1 || p.Records[0].Collection != lexicon.Accept || p.Records[0].Value != nil || p.Records[0].Then != nil {
			t.Errorf("records %+v, want the accept deleted and nothing else", p.Records)
		}
	}
	withBid := func(state State) func(f *rfixture) {
		return func(f *rfixture) { f.bidObject(bid, fit, state, t0.Add(-time.Minute)) }
	}
	both := func(a, b func(f *rfixture)) func(f *rfixture) { return func(f *rfixture) { a(f); b(f) } }
	declined := func(f *rfixture) { f.leaseFrom(fit, acc, acc.CID, LeaseDeclined, NoCapacity) }
	return []requesterCase{
		{name: "an accept waits for its lease until confirmBy", want: []TransitionID{BidAcceptable, AcceptWait}, setup: setup(time.Minute),
			check: func(t *testing.T, f *rfixture, p *Plan) {
				if s := status(t, p); s.State != marketv1alpha1.RequestAccepted || bidStateOf(p, bid) != marketv1alpha1.BidAccepted || len(p.Records) != 0 {
					t.Errorf("status %+v, records %+v", s, p.Records)
				}
			}},
		{name: "forged: a lease from another repo confirms nothing", want: []TransitionID{BidAcceptable, AcceptWait},
			setup: then(func(f *rfixture) { f.leaseFrom(mallory, acc, acc.CID, LeaseConfirmed, "") }, time.Minute),
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Ignored) != 1 || len(p.Contracts) != 0 {
					t.Errorf("ignored %v, contracts %v: want the lease ignored", p.Ignored, p.Contracts)
				}
			}},
		{name: "stale: a lease of another version of the accept confirms nothing", want: []TransitionID{BidAcceptable, AcceptWait},
			setup: then(func(f *rfixture) { f.leaseFrom(fit, acc, cid("older"), LeaseConfirmed, "") }, time.Minute),
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Ignored) != 1 || len(p.Contracts) != 0 {
					t.Errorf("ignored %v, contracts %v: want the lease ignored", p.Ignored, p.Contracts)
				}
			}},
		{name: "a confirmed lease makes the contract", want: []TransitionID{BidAcceptable, BidAcceptable, ContractMake},
			setup: then(func(f *rfixture) {
				f.leaseFrom(fit, acc, acc.CID, LeaseConfirmed, "")
				f.bidOn(rival, func(b *market.Bid) { b.PricePerHour.Amount = 40 }, t0.Add(-55*time.Second))
			}, time.Minute),
			check: func(t *testing.T, f *rfixture, p *Plan) {
				name := market.ChildName("shop", acc.URI)
				op := p.Contracts[name]
				if op == nil || op.Create == nil || op.Create.BidderDID != fit || op.Create.PricePerHour.Amount != 30 || op.Create.Accept.CID != acc.CID || op.Create.NoticeSeconds != 600 {
					t.Fatalf("contract %+v", op)
				}
				if p.Requests[0].Contract != name || bidStateOf(p, bid) != marketv1alpha1.BidLeased {
					t.Errorf("request %+v, Bid %s", p.Requests[0], bidStateOf(p, bid))
				}
				for n, b := range p.Bids {
					if n != market.ChildName("shop", bid.URI+"|"+bid.CID) && b.Status.State != marketv1alpha1.BidLost {
						t.Errorf("the other Bid is %s, want Lost", b.Status.State)
					}
				}
			}},
		{name: "a running lease makes the contract", want: []TransitionID{BidAcceptable, ContractMake},
			setup: then(func(f *rfixture) { f.leaseFrom(fit, acc, acc.CID, LeaseRunning, "") }, time.Minute)},
		{name: "a declined accept: its Bid says Declined first, the accept stays", want: []TransitionID{BidAcceptable, AcceptDeclined},
			setup: then(both(declined, withBid(marketv1alpha1.BidAccepted)), time.Minute),
			check: voided(marketv1alpha1.BidDeclined)},
		{name: "a declined accept whose Bid says so is deleted, nothing else", want: []TransitionID{BidOutcomeKept, AcceptDeclined},
			setup: then(both(declined, withBid(marketv1alpha1.BidDeclined)), time.Minute),
			check: deleted},
		{name: "once the declined accept is gone the request is made again at once", want: []TransitionID{BidOutcomeKept, RoundAgain, RequestPublish},
			setup: func(f *rfixture) {
				f.request(-time.Minute, -50*time.Second)
				bid = f.bidOn(fit, nil, t0.Add(-55*time.Second))
				f.bidObject(bid, fit, marketv1alpha1.BidDeclined, t0.Add(-time.Minute))
			}},
		{name: "an accepted bid withdrawn from the bidder's repo voids the accept", want: []TransitionID{AcceptBidWithdrawn},
			setup: then(func(f *rfixture) {
				delete(f.view.recs, bid.URI)
				f.miss["bid|"+bid.URI] = t0.Add(-10 * time.Second)
				f.view.listed[fit] = t0.Add(-5 * time.Second)
				f.bidObject(bid, fit, marketv1alpha1.BidAccepted, t0.Add(-time.Minute))
			}, time.Minute),
			check: voided(marketv1alpha1.BidVoid)},
		{name: "an accepted bid missing from the view is listed again first", want: []TransitionID{AcceptWait},
			setup: then(func(f *rfixture) { delete(f.view.recs, bid.URI) }, time.Minute),
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Look.Note) != 1 || len(p.Look.List) != 1 || p.Look.List[0] != fit {
					t.Errorf("look %+v, want the bidder listed", p.Look)
				}
			}},
		{name: "no lease by confirmBy voids the accept", want: []TransitionID{BidAcceptable, AcceptUnanswered},
			setup: then(withBid(marketv1alpha1.BidAccepted), -time.Second), check: voided(marketv1alpha1.BidVoid)},
		{name: "an unanswered accept whose Bid says Void is deleted, nothing else", want: []TransitionID{BidOutcomeKept, AcceptUnanswered},
			setup: then(withBid(marketv1alpha1.BidVoid), -time.Second), check: deleted},
		{name: "no lease by confirmBy while the view is incomplete: wait", want: []TransitionID{BidAcceptable, AcceptUnansweredReading},
			setup: then(func(f *rfixture) { f.view.complete = errors.New("reading") }, -time.Second),
			check: func(t *testing.T, _ *rfixture, p *Plan) {
				if len(p.Records) != 0 || !p.Requeue.Equal(t0.Add(time.Second)) {
					t.Errorf("records %+v, requeue %s", p.Records, p.Requeue)
				}
			}},
	}
}

func requesterCases() []requesterCase {
	return slices.Concat(judgeCases(), roundCases(), acceptAnswerCases())
}

// TestDecideRequester: each of the requester's transitions, the reasons
// it gives, and the hostile records it must not act on.
func TestDecideRequester(t *testing.T) {
	for _, tc := range requesterCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := newRequesterFixture(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			p := DecideRequester(f.s, t0)
			if got := p.Transitions(); !slices.Equal(got, tc.want) {
				t.Fatalf("transitions %v, want %v", got, tc.want)
			}
			if tc.check != nil {
				tc.check(t, f, p)
			}
		})
	}
}

// TestEveryRequesterTransitionIsTested: every row of the requester's
// table is taken by a case of TestDecideRequester.
func TestEveryRequesterTransitionIsTested(t *testing.T) {
	var wants [][]TransitionID
	for _, tc := range requesterCases() {
		wants = append(wants, tc.want)
	}
	everyRowTaken(t, RequesterTransitions(), wants, "TestDecideRequester")
}

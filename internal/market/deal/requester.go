package deal

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
)

const (
	// AvoidFor is how long a bidder that declined or did not answer an
	// accept of a requester is not taken again by it.
	AvoidFor = 10 * time.Minute
	// MaxRetry caps the wait before a request without an acceptable bid
	// is made again.
	MaxRetry = 5 * time.Minute
	// DefaultMaxBids is how many Bids a requester keeps per request when
	// spec.maxBidsPerRequest is not set.
	DefaultMaxBids = 20
)

// RequesterSnapshot is what a requester's decision of its buying rounds
// reads: its spec, its own accept records, the network's records (View),
// its kcp objects, and the replicas that need a VM with their request
// records.
type RequesterSnapshot struct {
	// Name of the MarketRequester; DID its repo's, Owner the owner part
	// of its record keys, Network its network's name and Operator the
	// network operator's DID.
	Name, DID, Owner, Network, Operator string
	Spec                                marketv1alpha1.MarketRequesterSpec
	Identity                            *marketv1alpha1.MarketIdentity
	// Accepts are the requester's own accept records.
	Accepts []pds.Record
	View    View
	Missing Missing
	// Bids and Contracts are its kcp objects by name (the contracts as
	// this pass left them).
	Bids      map[string]*marketv1alpha1.Bid
	Contracts map[string]*marketv1alpha1.ComputeContract
	// Replicas are the replicas that need a VM, by index order.
	Replicas []*Replica
}

// Replica is one replica that needs a VM: its request records.
type Replica struct {
	Index int32
	// Attempt counts the requests made (status.requests[].attempt).
	Attempt int32
	// Attempts are the request records, by the time part of their key;
	// Current the newest (Stamp its key's time), nil when there is none.
	Attempts map[int64]*OwnRequest
	Current  *OwnRequest
	Stamp    int64
	// Reclaimed is the replica's live contract its bidder reclaims (the
	// next VM is bought while it runs), nil when there is none.
	Reclaimed *marketv1alpha1.ComputeContract
}

// OwnRequest is one of the requester's request records.
type OwnRequest struct {
	URI, CID, RKey string
	Request        *market.Request
}

// OwnAccept is one of the requester's accept records.
type OwnAccept struct {
	URI, CID, RKey string
	Accept         *market.Accept
}

// RequestOp is a replica's status.requests entry once the plan is made:
// Status when the record write Needs succeeded (None: none needed),
// Before when it failed. The CIDs of the records it names are those
// written. Contract is a contract the plan makes that the replica rests
// on ("" when none): the controller follows it once made.
type RequestOp struct {
	Status, Before marketv1alpha1.RequestStatus
	Needs          int
	Contract       string
}

// requester is one decision of one requester's buying rounds.
type requester struct {
	s        *RequesterSnapshot
	now      time.Time
	p        *Plan
	complete bool
	accepts  []*OwnAccept
	// states are the Bid states written in this pass, made the Bids made
	// in it.
	states map[string]marketv1alpha1.BidStatus
	made   map[string]*marketv1alpha1.BidSpec
}

// DecideRequester decides a requester's buying rounds, one per replica
// that needs a VM: its request, the bids on it, the accept of the best
// one and the bidder's answer, until a lease makes a contract. It does
// no I/O.
func DecideRequester(s *RequesterSnapshot, now time.Time) *Plan {
	d := &requester{s: s, now: now, complete: s.View.Complete() == nil,
		states: map[string]marketv1alpha1.BidStatus{}, made: map[string]*marketv1alpha1.BidSpec{},
		p: &Plan{Bids: map[string]*BidOp{}, Contracts: map[string]*ContractOp{}, Ignored: map[string]bool{}}}
	for _, rec := range s.Accepts {
		var acc market.Accept
		if market.Decode(lexicon.Accept, rec.Value, &acc) != nil {
			continue
		}
		_, _, rkey := market.SplitURI(rec.URI)
		d.accepts = append(d.accepts, &OwnAccept{URI: rec.URI, CID: rec.CID, RKey: rkey, Accept: &acc})
	}
	for _, rr := range s.Replicas {
		op := d.buy(rr)
		if rc := rr.Reclaimed; rc != nil && rc.Status.Reclaim != nil {
			prefix := fmt.Sprintf("ComputeContract %s is reclaimed by its bidder, who stops it after %s; buying the next: ",
				rc.Name, market.Time(rc.Status.Reclaim.TerminateAfter.Time))
			op.Status.Message, op.Before.Message = prefix+op.Status.Message, prefix+op.Before.Message
		}
		d.p.Requests = append(d.p.Requests, op)
	}
	return d.p
}

// acceptsOf returns the requester's accepts of the replica's requests,
// by request URI.
func (d *requester) acceptsOf(rr *Replica) map[string][]*OwnAccept {
	out := map[string][]*OwnAccept{}
	for _, acc := range d.accepts {
		for _, req := range rr.Attempts {
			if acc.Accept.Request.URI == req.URI {
				out[req.URI] = append(out[req.URI], acc)
			}
		}
	}
	return out
}

func (d *requester) window() int32 { return cmp.Or(d.s.Spec.BidWindowSeconds, 10) }

func (d *requester) confirm() time.Duration {
	return time.Duration(cmp.Or(d.s.Spec.ConfirmSeconds, 300)) * time.Second
}

// RetryWait is how long after the deadline of an empty round a replica
// asks again: the bid window, doubled with every attempt, at most
// MaxRetry. An attempt below 1 (a status write that did not land) waits
// one window.
func RetryWait(window int32, attempt int32) time.Duration {
	return min(time.Duration(window)*time.Second<<min(max(attempt-1, 0), 8), MaxRetry)
}

// restsOn reports whether a live contract rests on the request at uri.
func (d *requester) restsOn(uri string) bool {
	for _, cc := range d.s.Contracts {
		if live(cc) && cc.Spec.Request.URI == uri {
			return true
		}
	}
	return false
}

// buy runs the round of a replica that needs a VM.
func (d *requester) buy(rr *Replica) RequestOp {
	rs := marketv1alpha1.RequestStatus{Index: rr.Index, Attempt: rr.Attempt, State: marketv1alpha1.RequestOpen}
	accepts := d.acceptsOf(rr)
	// Requests of earlier attempts are withdrawn first (not those a live
	// contract rests on).
	for _, stamp := range slices.Sorted(maps.Keys(rr.Attempts)) {
		if rec := rr.Attempts[stamp]; stamp != rr.Stamp && !d.restsOn(rec.URI) {
			d.p.step(RequestWithdrawEarlier, rec.URI)
			d.p.record(withdrawal(rec, accepts[rec.URI]))
		}
	}
	cur := rr.Current
	if cur == nil || d.restsOn(cur.URI) {
		return d.ask(rr, rs, nil)
	}
	rs.Record = &marketv1alpha1.PublishedRecord{URI: cur.URI, CID: cur.CID}
	deadline := market.ParseTime(cur.Request.BidDeadline)
	rs.BidDeadline = market.MetaTime(deadline)
	bids := d.judge(cur, deadline)
	rs.Bids = int32(len(bids))
	// An accept that is still open waits for the bidder; one declined or
	// void goes first (answered).
	if accs := accepts[cur.URI]; len(accs) > 0 {
		op := d.answered(rr, cur, accs[0], bids, rs)
		d.recordBids(rr, cur, bids, None)
		return op
	}
	// The bidder taken on this request declined or did not answer: the
	// requester goes back to the market at once.
	turnedDown := false
	for _, b := range bids {
		switch b.state {
		case marketv1alpha1.BidOpen:
			rs.Acceptable++
		case marketv1alpha1.BidDeclined, marketv1alpha1.BidVoid:
			turnedDown = true
		}
	}
	return d.round(rr, cur, deadline, bids, turnedDown, rs)
}

// round ends a round no accept settled: bids are collected until the
// deadline, the best acceptable one is accepted after it, and a round
// without one is asked again.
func (d *requester) round(rr *Replica, cur *OwnRequest, deadline time.Time, bids []*judged, turnedDown bool, rs marketv1alpha1.RequestStatus) RequestOp {
	switch {
	case d.now.Before(deadline):
		d.p.step(RoundCollect, cur.URI)
		rs.Message = collecting(deadline, len(bids))
		d.p.due(deadline)
		d.recordBids(rr, cur, bids, None)
		return RequestOp{Status: rs, Before: rs, Needs: None}
	case !d.complete:
		d.p.step(RoundReading, cur.URI)
		rs.Message = d.s.View.Complete().Error()
		d.p.due(d.now.Add(time.Second))
		d.recordBids(rr, cur, bids, None)
		return RequestOp{Status: rs, Before: rs, Needs: None}
	}
	if best := firstOpen(bids); best != nil {
		return d.accept(rr, cur, best, bids, rs)
	}
	d.recordBids(rr, cur, bids, None)
	// A round without an acceptable bid: ask again later, waiting longer
	// after every empty round; at once when the bidder taken declined or
	// did not answer (the requester goes back to the market).
	next := deadline.Add(RetryWait(d.window(), rr.Attempt))
	if d.now.Before(next) && !turnedDown {
		d.p.step(RoundEmpty, cur.URI)
		rs.NextAttempt = market.MetaTime(next)
		rs.Message = fmt.Sprintf("no acceptable bid (%d seen); asking again at %s", len(bids), market.Time(next))
		if len(bids) == 0 {
			rs.Message = "no bidder answered; asking again at " + market.Time(next)
		}
		d.p.due(next)
		return RequestOp{Status: rs, Before: rs, Needs: None}
	}
	d.p.step(RoundAgain, cur.URI)
	return d.ask(rr, rs, &RecordOp{Collection: lexicon.Request, RKey: cur.RKey})
}

// collecting is the message of a request collecting bids: the same
// whether the pass published it or saw it later, so that a pass without
// news writes nothing.
func collecting(deadline time.Time, bids int) string {
	return fmt.Sprintf("collecting bids until %s (%d so far)", market.Time(deadline), bids)
}

// withdrawal deletes a request record after its accepts.
func withdrawal(rec *OwnRequest, accepts []*OwnAccept) RecordOp {
	op := RecordOp{Collection: lexicon.Request, RKey: rec.RKey}
	for i := len(accepts) - 1; i >= 0; i-- {
		next := op
		op = RecordOp{Collection: lexicon.Accept, RKey: accepts[i].RKey, Then: &next}
	}
	return op
}

// ask publishes the replica's next request (after first, when set: the
// withdrawal of the current one).
func (d *requester) ask(rr *Replica, rs marketv1alpha1.RequestStatus, first *RecordOp) RequestOp {
	spec := d.s.Spec
	deadline := d.now.Add(time.Duration(d.window()) * time.Second)
	req := &market.Request{
		Type:            lexicon.Request,
		Shape:           market.ShapeOf(spec.Shape),
		MaxPricePerHour: market.Price{Amount: spec.MaxPricePerHour.Amount, Currency: spec.MaxPricePerHour.Currency},
		BidDeadline:     market.Time(deadline),
		NoticeSeconds:   int64(spec.NoticeSeconds),
		Network:         d.s.Network,
		ReplicaIndex:    int64(rr.Index),
		CreatedAt:       market.Time(d.now),
	}
	rkey := market.RequestKey(d.s.Owner, rr.Index, d.now)
	op := RecordOp{Collection: lexicon.Request, RKey: rkey, Value: req}
	if first != nil {
		next := op
		first.Then = &next
		op = *first
	}
	uri := market.URI(d.s.DID, lexicon.Request, rkey)
	d.p.step(RequestPublish, uri)
	i := d.p.record(op)
	before := rs
	rs.Attempt = rr.Attempt + 1
	rs.Record = &marketv1alpha1.PublishedRecord{URI: uri}
	rs.BidDeadline = market.MetaTime(deadline)
	rs.Message = collecting(deadline, 0)
	d.p.due(deadline)
	return RequestOp{Status: rs, Before: before, Needs: i}
}

// accept publishes an accept of the best bid; the Bids are written after
// it.
func (d *requester) accept(rr *Replica, cur *OwnRequest, best *judged, bids []*judged, rs marketv1alpha1.RequestStatus) RequestOp {
	confirmBy := d.now.Add(d.confirm())
	acc := &market.Accept{
		Type:      lexicon.Accept,
		Bid:       best.rec.Ref(),
		Request:   market.StrongRef{URI: cur.URI, CID: cur.CID},
		ConfirmBy: market.Time(confirmBy),
		CreatedAt: market.Time(d.now),
	}
	rkey := market.AcceptKey(d.s.Owner, best.rec.URI)
	uri := market.URI(d.s.DID, lexicon.Accept, rkey)
	d.p.step(AcceptPublish, best.rec.URI)
	i := d.p.record(RecordOp{Collection: lexicon.Accept, RKey: rkey, Value: acc, MarketStep: market.StepDeadlineAccept, Since: market.ParseTime(cur.Request.BidDeadline)})
	d.p.event("", corev1.EventTypeNormal, "Accepted", "Accept", fmt.Sprintf("replica %d: accepted the bid of %s at %d %s per hour",
		rr.Index, best.rec.DID, best.rec.Bid.PricePerHour.Amount, best.rec.Bid.PricePerHour.Currency), i)
	best.state, best.message = marketv1alpha1.BidAccepted, "accepted; the bidder has until "+acc.ConfirmBy+" to confirm"
	before := rs
	rs.State = marketv1alpha1.RequestAccepted
	rs.Accept = &marketv1alpha1.PublishedRecord{URI: uri}
	rs.ConfirmBy = market.MetaTime(confirmBy)
	rs.Message = fmt.Sprintf("accepted a bid of %s; waiting for its lease until %s", best.rec.DID, acc.ConfirmBy)
	d.p.due(confirmBy)
	d.recordBids(rr, cur, bids, i)
	return RequestOp{Status: rs, Before: before, Needs: i}
}

package deal

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
)

// judged is a bid as the requester judges it.
type judged struct {
	rec       *market.Rec
	state     State
	message   string
	firstSeen time.Time
	name      string
}

// bidState is the state of the Bid name: as written in this pass, else
// as read (ok false when there is no such Bid).
func (d *requester) bidState(name string) (marketv1alpha1.BidStatus, bool) {
	if st, ok := d.states[name]; ok {
		return st, true
	}
	if b := d.s.Bids[name]; b != nil {
		return b.Status, true
	}
	return marketv1alpha1.BidStatus{}, false
}

// avoided are the bidders that declined an accept of this requester, or
// did not answer one, less than AvoidFor ago (on any replica or
// request): not taken again meanwhile. It gives the Bid of each and when
// it was made.
func (d *requester) avoided() map[string]avoidedBid {
	avoid := map[string]avoidedBid{}
	note := func(name, bidder string, at time.Time) {
		st, _ := d.bidState(name)
		if (st.State == marketv1alpha1.BidDeclined || st.State == marketv1alpha1.BidVoid) && d.now.Before(at.Add(AvoidFor)) {
			avoid[bidder] = avoidedBid{name: name, state: st.State, at: at}
		}
	}
	for _, name := range slices.Sorted(mapsKeys(d.s.Bids)) {
		b := d.s.Bids[name]
		note(name, b.Spec.BidderDID, b.CreationTimestamp.Time)
	}
	for _, name := range slices.Sorted(mapsKeys(d.made)) {
		note(name, d.made[name].BidderDID, d.now)
	}
	return avoid
}

type avoidedBid struct {
	name  string
	state State
	at    time.Time
}

// reclaimedEarly are the bidders that stopped a reclaimed VM of this
// requester before the notice they owed: until when they are not taken
// again (AvoidFor after the notice would have run out).
func (d *requester) reclaimedEarly() map[string]time.Time {
	early := map[string]time.Time{}
	for _, cc := range d.s.Contracts {
		if cc.Status.Reason != string(ReclaimedEarly) || cc.Status.Reclaim == nil {
			continue
		}
		until := cc.Status.Reclaim.Seen.Add(time.Duration(cc.Spec.NoticeSeconds)*time.Second + AvoidFor)
		if d.now.Before(until) && until.After(early[cc.Spec.BidderDID]) {
			early[cc.Spec.BidderDID] = until
		}
	}
	return early
}

// reclaiming reports whether the bidder (by DID) reclaims a live contract
// of this requester: its bids are not taken meanwhile.
func (d *requester) reclaiming(did string) bool {
	for _, cc := range d.s.Contracts {
		if live(cc) && cc.Status.Reclaim != nil && cc.Spec.BidderDID == did {
			return true
		}
	}
	return false
}

// judge reads the bids on the current request and says what each one is
// worth, most acceptable first: acceptable ones by price (then by when
// they were first seen), the others after them.
func (d *requester) judge(cur *OwnRequest, deadline time.Time) []*judged {
	avoid, early := d.avoided(), d.reclaimedEarly()
	var out []*judged
	for _, rec := range d.s.View.Children(cur.URI, lexicon.Bid) {
		if rec.DID == d.s.DID || rec.Bid == nil {
			continue
		}
		j := &judged{rec: rec, name: market.ChildName(d.s.Name, rec.URI+"|"+rec.CID), firstSeen: rec.FirstSeen}
		prev := d.s.Bids[j.name]
		if prev != nil && prev.Spec.FirstSeen != nil {
			j.firstSeen = prev.Spec.FirstSeen.Time
		}
		id := d.judgeRecord(j, cur, deadline)
		// What happened to a bid stays: a bidder that declined or did not
		// answer is not asked again on this request, nor for a while on
		// another.
		if st, ok := d.bidState(j.name); ok && j.state == marketv1alpha1.BidOpen {
			switch st.State {
			case marketv1alpha1.BidDeclined, marketv1alpha1.BidVoid, marketv1alpha1.BidLost:
				id, j.state, j.message = BidOutcomeKept, st.State, st.Message
			}
		}
		switch {
		case j.state != marketv1alpha1.BidOpen:
		case d.reclaiming(rec.DID):
			id, j.state, j.message = BidReclaiming, marketv1alpha1.BidNotAllowed, "this bidder reclaims a VM of this requester"
		case !early[rec.DID].IsZero():
			id, j.state, j.message = BidReclaimedEarly, marketv1alpha1.BidNotAllowed, "this bidder stopped a reclaimed VM before its notice ran out; not taken again before "+market.Time(early[rec.DID])
		}
		if a, ok := avoid[rec.DID]; ok && j.state == marketv1alpha1.BidOpen && a.name != j.name {
			id, j.state = BidAvoided, a.state
			j.message = "this bidder declined or did not answer an accept at " + market.Time(a.at) + "; not taken again before " + market.Time(a.at.Add(AvoidFor))
		}
		d.p.step(id, rec.URI)
		out = append(out, j)
	}
	slices.SortStableFunc(out, func(a, b *judged) int {
		ao, bo := a.state == marketv1alpha1.BidOpen, b.state == marketv1alpha1.BidOpen
		switch {
		case ao != bo:
			if ao {
				return -1
			}
			return 1
		case a.rec.Bid.PricePerHour.Amount != b.rec.Bid.PricePerHour.Amount:
			return cmp.Compare(a.rec.Bid.PricePerHour.Amount, b.rec.Bid.PricePerHour.Amount)
		case !a.firstSeen.Equal(b.firstSeen):
			return a.firstSeen.Compare(b.firstSeen)
		}
		return cmp.Compare(a.rec.URI, b.rec.URI)
	})
	return out
}

// judgeRecord judges what the bid record says, against the request and
// the requester's spec.
func (d *requester) judgeRecord(j *judged, cur *OwnRequest, deadline time.Time) TransitionID {
	spec, b := d.s.Spec, j.rec.Bid
	validUntil := market.ParseTime(b.ValidUntil)
	switch {
	case b.Request.CID != cur.CID:
		j.state, j.message = marketv1alpha1.BidInvalid, "the bid refers to another version of the request"
		return BidOtherVersion
	case j.firstSeen.After(deadline):
		j.state, j.message = marketv1alpha1.BidLate, "first seen at "+market.Time(j.firstSeen)+", after the bid deadline"
		return BidLate
	case b.Shape != nil && !market.Fits(*b.Shape, cur.Request.Shape):
		j.state, j.message = marketv1alpha1.BidInvalid, "the bid offers a smaller VM than the request asks for"
		return BidTooSmall
	case b.PricePerHour.Currency != spec.MaxPricePerHour.Currency || b.PricePerHour.Amount > spec.MaxPricePerHour.Amount:
		j.state, j.message = marketv1alpha1.BidOverBudget, fmt.Sprintf("asks %d %s; the most this requester pays is %d %s",
			b.PricePerHour.Amount, b.PricePerHour.Currency, spec.MaxPricePerHour.Amount, spec.MaxPricePerHour.Currency)
		return BidOverBudget
	case len(spec.Policy.AllowedBidders) > 0 && !slices.Contains(spec.Policy.AllowedBidders, j.rec.DID):
		j.state, j.message = marketv1alpha1.BidNotAllowed, "the bidder is not in spec.policy.allowedBidders"
		return BidNotAllowed
	case !market.Vouched(d.s.View, d.s.Operator, d.s.Identity, j.rec.DID, marketv1alpha1.RoleBidder):
		j.state, j.message = marketv1alpha1.BidUnvouched, "neither the network's operator nor this requester's identity vouches for the bidder"
		return BidUnvouched
	case validUntil.IsZero() || !d.now.Before(validUntil):
		j.state, j.message = marketv1alpha1.BidExpired, "valid until "+b.ValidUntil
		return BidJudgedExpired
	}
	j.state, j.message = marketv1alpha1.BidOpen, "may be accepted"
	return BidAcceptable
}

func firstOpen(bids []*judged) *judged {
	for _, b := range bids {
		if b.state == marketv1alpha1.BidOpen {
			return b
		}
	}
	return nil
}

func markJudged(bids []*judged, name string, state State, msg string) {
	for _, b := range bids {
		if b.name == name {
			b.state, b.message = state, msg
		}
	}
}

// setBid writes the state of the Bid name, when there is one.
func (d *requester) setBid(name string, state State, msg string, needs int) {
	if _, ok := d.bidState(name); !ok {
		return
	}
	st := marketv1alpha1.BidStatus{State: state, Message: msg}
	d.states[name] = st
	op := d.p.Bids[name]
	if op == nil {
		op = &BidOp{Name: name, Needs: needs}
		d.p.Bids[name] = op
	}
	op.Status = st
}

// recordBids keeps a Bid object for each of the (at most
// spec.maxBidsPerRequest) best bids on the current request, with what
// became of it; a Bid whose record went or changed is Withdrawn.
func (d *requester) recordBids(rr *Replica, cur *OwnRequest, bids []*judged, needs int) {
	limit := int(cmp.Or(d.s.Spec.MaxBidsPerRequest, DefaultMaxBids))
	seen := map[string]bool{}
	for i, j := range bids {
		seen[j.name] = true
		if i >= limit {
			continue
		}
		if _, ok := d.bidState(j.name); !ok {
			fs := metav1.NewMicroTime(j.firstSeen)
			spec := &marketv1alpha1.BidSpec{
				Side:         marketv1alpha1.SideRequester,
				Request:      market.APIRef(j.rec.Bid.Request),
				Bid:          market.APIRef(j.rec.Ref()),
				RequesterDID: d.s.DID,
				BidderDID:    j.rec.DID,
				ReplicaIndex: rr.Index,
				PricePerHour: marketv1alpha1.Price{Amount: j.rec.Bid.PricePerHour.Amount, Currency: j.rec.Bid.PricePerHour.Currency},
				ValidUntil:   market.MetaTime(market.ParseTime(j.rec.Bid.ValidUntil)),
				FirstSeen:    &fs,
			}
			if j.rec.Bid.Shape != nil {
				shape := market.APIShape(*j.rec.Bid.Shape)
				spec.Shape = &shape
			}
			d.made[j.name] = spec
			d.states[j.name] = marketv1alpha1.BidStatus{}
			d.p.Bids[j.name] = &BidOp{Name: j.name, Create: spec, Needs: needs}
		}
		d.setBid(j.name, j.state, j.message, needs)
	}
	for _, name := range slices.Sorted(mapsKeys(d.s.Bids)) {
		b := d.s.Bids[name]
		if st, _ := d.bidState(name); b.Spec.Request.URI == cur.URI && !seen[name] && st.State == marketv1alpha1.BidOpen {
			d.p.step(BidWithdrawnByBidder, b.Spec.Bid.URI)
			d.setBid(name, marketv1alpha1.BidWithdrawn, "the bidder withdrew or changed this bid", needs)
		}
	}
}

// LeaseOf returns the bidder's lease answering the accept, if any. A
// lease in another repo than the bidder's, or one that answers another
// version of the accept, is forged or stale: put in ignored (URI|CID).
func LeaseOf(view View, acceptURI, acceptCID, bidderDID string, ignored map[string]bool) *market.Rec {
	var found *market.Rec
	for _, l := range view.Children(acceptURI, lexicon.Lease) {
		if l.DID != bidderDID || l.Lease == nil || l.Lease.Accept.CID != acceptCID {
			ignored[l.URI+"|"+l.CID] = true
			continue
		}
		found = l
	}
	return found
}

// answered looks at an accept the requester published: the bidder's
// lease makes a contract; a decline, or no answer by confirmBy, voids it
// (its Bid says so, then the accept is deleted, and another bid is taken
// in a later pass). It returns the replica's status for this pass.
func (d *requester) answered(rr *Replica, cur *OwnRequest, acc *OwnAccept, bids []*judged, rs marketv1alpha1.RequestStatus) RequestOp {
	bid := d.s.View.Get(acc.Accept.Bid.URI)
	bidderDID, _, _ := market.SplitURI(acc.Accept.Bid.URI)
	name := market.ChildName(d.s.Name, acc.Accept.Bid.URI+"|"+acc.Accept.Bid.CID)
	lease := LeaseOf(d.s.View, acc.URI, acc.CID, bidderDID, d.p.Ignored)
	confirmBy := market.ParseTime(acc.Accept.ConfirmBy)
	// A declined or void accept goes in two passes: first its Bid says so
	// (the bidder is then avoided for AvoidFor, whatever fails next), and
	// only once the Bid says so is the accept deleted; another bid is taken
	// in a later pass, once the deletion is seen, so that no two accepts of
	// a request are ever open (a failed deletion is tried again first).
	void := func(id TransitionID, state State, reason, event, msg string) RequestOp {
		d.p.step(id, acc.URI)
		if b := d.s.Bids[name]; b != nil && b.Status.State != state {
			d.p.event("", corev1.EventTypeWarning, reason, "Accept", event, None)
			d.setBid(name, state, msg, None)
		} else {
			d.p.record(RecordOp{Collection: lexicon.Accept, RKey: acc.RKey})
		}
		markJudged(bids, name, state, msg)
		rs.Message = "the accepted bid is " + strings.ToLower(string(state)) + ": " + msg + "; taking another"
		d.p.due(d.now)
		return RequestOp{Status: rs, Before: rs, Needs: None}
	}
	switch {
	case lease != nil && Live(lease.Lease.State):
		return d.contract(rr, cur, acc, bids, rs)
	case lease != nil && lease.Lease.State == LeaseDeclined:
		reason := string(cmp.Or(lease.Lease.Reason, "unspecified"))
		return void(AcceptDeclined, marketv1alpha1.BidDeclined, "Declined", fmt.Sprintf("bidder %s declined replica %d: %s", bidderDID, rr.Index, reason), "the bidder declined: "+reason)
	case bid == nil && gone(d.p, d.s.View, d.s.Missing, d.complete, bidderDID, "bid|"+acc.Accept.Bid.URI):
		// The bidder withdrew the bid it was accepted on: no lease will come.
		return void(AcceptBidWithdrawn, marketv1alpha1.BidVoid, "Void", fmt.Sprintf("bidder %s withdrew the bid replica %d accepted", bidderDID, rr.Index), "withdrawn by the bidder after it was accepted")
	case !d.now.Before(confirmBy) && !d.complete:
		// No lease by confirmBy as far as the view goes; it is incomplete.
		d.p.step(AcceptUnansweredReading, acc.URI)
		d.p.due(d.now.Add(time.Second))
		return RequestOp{Status: rs, Before: rs, Needs: None}
	case !d.now.Before(confirmBy):
		return void(AcceptUnanswered, marketv1alpha1.BidVoid, "Void", fmt.Sprintf("bidder %s did not answer replica %d's accept by %s", bidderDID, rr.Index, acc.Accept.ConfirmBy), "no lease by "+acc.Accept.ConfirmBy)
	default:
		d.p.step(AcceptWait, acc.URI)
		rs.State = marketv1alpha1.RequestAccepted
		rs.Accept = &marketv1alpha1.PublishedRecord{URI: acc.URI, CID: acc.CID}
		rs.ConfirmBy = market.MetaTime(confirmBy)
		rs.Message = fmt.Sprintf("accepted a bid of %s; waiting for its lease until %s", bidderDID, acc.Accept.ConfirmBy)
		if bid == nil && d.complete {
			rs.Message = fmt.Sprintf("accepted a bid of %s, which it has withdrawn; waiting until %s", bidderDID, acc.Accept.ConfirmBy)
		}
		msg := "accepted; the bidder has until " + acc.Accept.ConfirmBy + " to confirm"
		d.setBid(name, marketv1alpha1.BidAccepted, msg, None)
		markJudged(bids, name, marketv1alpha1.BidAccepted, msg)
		d.p.due(confirmBy)
		return RequestOp{Status: rs, Before: rs, Needs: None}
	}
}

// contract makes the requester's ComputeContract once the bidder's lease
// confirms an accept, and marks the other bids of the request lost. The
// controller follows the contract once it is made.
func (d *requester) contract(rr *Replica, cur *OwnRequest, acc *OwnAccept, bids []*judged, rs marketv1alpha1.RequestStatus) RequestOp {
	name := market.ChildName(d.s.Name, acc.URI)
	bidName := market.ChildName(d.s.Name, acc.Accept.Bid.URI+"|"+acc.Accept.Bid.CID)
	d.p.step(ContractMake, acc.URI)
	for _, b := range bids {
		switch {
		case b.name == bidName:
			b.state, b.message = marketv1alpha1.BidLeased, "leased: ComputeContract "+name
		case b.state == marketv1alpha1.BidOpen || b.state == marketv1alpha1.BidAccepted:
			b.state, b.message = marketv1alpha1.BidLost, "another bid was leased"
		}
	}
	bidderDID, _, _ := market.SplitURI(acc.Accept.Bid.URI)
	spec := &marketv1alpha1.ComputeContractSpec{
		Side:          marketv1alpha1.SideRequester,
		RequesterDID:  d.s.DID,
		BidderDID:     bidderDID,
		ReplicaIndex:  rr.Index,
		Shape:         d.s.Spec.Shape,
		NoticeSeconds: int32(cur.Request.NoticeSeconds),
		Request:       marketv1alpha1.RecordRef{URI: cur.URI, CID: cur.CID},
		Bid:           market.APIRef(acc.Accept.Bid),
		Accept:        marketv1alpha1.RecordRef{URI: acc.URI, CID: acc.CID},
	}
	if bid := d.s.View.Get(acc.Accept.Bid.URI); bid != nil && bid.Bid != nil && bid.CID == acc.Accept.Bid.CID {
		spec.PricePerHour = marketv1alpha1.Price{Amount: bid.Bid.PricePerHour.Amount, Currency: bid.Bid.PricePerHour.Currency}
		if bid.Bid.Shape != nil {
			spec.Shape = market.APIShape(*bid.Bid.Shape)
		}
	} else if b := d.s.Bids[bidName]; b != nil {
		spec.PricePerHour = b.Spec.PricePerHour
		if b.Spec.Shape != nil {
			spec.Shape = *b.Spec.Shape
		}
	}
	d.p.Contracts[name] = &ContractOp{Name: name, Create: spec, Needs: None}
	d.p.event(name, corev1.EventTypeNormal, "Contracted", "Lease", fmt.Sprintf("replica %d: %s confirmed; ComputeContract %s", rr.Index, bidderDID, name), None)
	return RequestOp{Status: rs, Before: rs, Needs: None, Contract: name}
}

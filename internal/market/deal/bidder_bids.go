package deal

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
)

// accepts finds the requester's accept of this bid (ours) and an accept
// of another bid on the same request (other); accepts in another repo
// than the requester's, or of another version of the bid or the request,
// are counted as ignored.
func (d *bidder) accepts(ob *ownBid, requester string) (ours, other *market.Rec) {
	b := ob.bid
	seen := map[string]bool{}
	for _, a := range append(d.s.View.Children(ob.uri, lexicon.Accept), d.s.View.Children(b.Request.URI, lexicon.Accept)...) {
		if seen[a.URI] || a.Accept == nil {
			continue
		}
		seen[a.URI] = true
		switch {
		case a.DID != requester:
			d.ignore(a)
		case a.Accept.Bid.URI == ob.uri && (a.Accept.Bid.CID != ob.cid || a.Accept.Request.URI != b.Request.URI || a.Accept.Request.CID != b.Request.CID):
			d.ignore(a)
		case a.Accept.Bid.URI == ob.uri:
			ours = a
		case a.Accept.Request.URI == b.Request.URI:
			other = a
		}
	}
	return ours, other
}

// openBid follows a bid that has no lease: the requester's accept is
// answered with a lease; a bid that lost, expired, or whose request went
// or changed is deleted (its capacity is free again); otherwise it holds
// capacity until its validUntil.
func (d *bidder) openBid(ob *ownBid) {
	b := ob.bid
	requester, _, _ := market.SplitURI(b.Request.URI)
	req := d.s.View.Get(b.Request.URI)
	if req != nil && req.DID != requester {
		req = nil
	}
	ours, other := d.accepts(ob, requester)
	name := market.ChildName(d.s.Name, ob.uri+"|"+b.Request.CID)
	validUntil := market.ParseTime(b.ValidUntil)
	requestKey := "request|" + b.Request.URI
	if req != nil {
		d.present(requestKey)
	}
	switch {
	case ours != nil:
		d.answer(ob, ours, req, name)
		return
	case other != nil && d.leased(other):
		d.settleBid(BidLost, ob, name, marketv1alpha1.BidLost, "another bid was leased")
		return
	case req != nil && req.CID != b.Request.CID:
		d.settleBid(BidRequestEdited, ob, name, marketv1alpha1.BidWithdrawn, "the request was edited")
		return
	case req == nil && d.gone(requester, requestKey):
		d.settleBid(BidRequestWithdrawn, ob, name, marketv1alpha1.BidWithdrawn, "the request was withdrawn")
		return
	case !d.now.Before(validUntil) && d.complete:
		d.settleBid(BidExpired, ob, name, marketv1alpha1.BidExpired, "not accepted by "+b.ValidUntil)
		return
	}
	// Still open (or not known to be over: the view is incomplete). Until
	// another bid is leased, the requester may come back to this one.
	d.p.step(BidHold, ob.uri)
	if ob.offer >= 0 {
		d.p.Counts.Reserved[ob.offer]++
	}
	d.perRequester[requester]++
	d.p.Look.Refresh = append(d.p.Look.Refresh, requester)
	d.p.due(validUntil)
	// The message stays as the bid was placed when another bid is
	// accepted: that is seconds from its lease (Lost), and a Bid's
	// message changing is a write.
	d.bidOf(ob, req, name, marketv1alpha1.BidOpen, "open until "+b.ValidUntil, None)
}

// leased reports whether the accept (of another bid) was confirmed by its
// bidder with a lease in that bidder's repo.
func (d *bidder) leased(acc *market.Rec) bool {
	bidder, _, _ := market.SplitURI(acc.Accept.Bid.URI)
	for _, l := range d.s.View.Children(acc.URI, lexicon.Lease) {
		if l.DID == bidder && l.Lease != nil && l.Lease.Accept.CID == acc.CID && Live(l.Lease.State) {
			return true
		}
	}
	return false
}

// answer publishes the lease that answers the requester's accept of a
// bid: confirmed when the bidder still can (not suspended, in time, with
// capacity), declined with a reason otherwise.
func (d *bidder) answer(ob *ownBid, acc, req *market.Rec, name string) {
	confirmBy := market.ParseTime(acc.Accept.ConfirmBy)
	validUntil := market.ParseTime(ob.bid.ValidUntil)
	c := &d.p.Counts
	var reason LeaseReason
	switch {
	case d.s.Stop != "":
		reason = Suspended
	case confirmBy.IsZero() || acc.FirstSeen.After(confirmBy) || !d.now.Before(confirmBy) || acc.FirstSeen.After(validUntil):
		reason = Expired
	case ob.offer < 0 || c.Used[ob.offer]+c.Unknown+1 > d.capacity(ob.offer):
		reason = NoCapacity
	}
	lease := &market.Lease{Type: lexicon.Lease, Accept: acc.Ref(), Bid: &market.StrongRef{URI: ob.uri, CID: ob.cid}, State: LeaseConfirmed, Reason: reason,
		CreatedAt: market.Time(d.now), UpdatedAt: market.Time(d.now)}
	rkey := market.LeaseKey(d.s.Owner, acc.URI)
	d.p.due(d.now.Add(leaseLook))
	if reason != "" {
		d.p.step(AcceptDecline, acc.URI)
		lease.State = LeaseDeclined
		i := d.p.record(RecordOp{Collection: lexicon.Lease, RKey: rkey, Value: lease, Undo: Undo{Offer: ob.offer, Reserved: 1}, MarketStep: market.StepAcceptLease, Since: acc.FirstSeen})
		d.p.event("", corev1.EventTypeWarning, "Declined", "Lease", fmt.Sprintf("declined the accept %s: %s", acc.URI, reason), i)
		d.bidOf(ob, req, name, marketv1alpha1.BidDeclined, "declined: "+string(reason), i)
		return
	}
	d.p.step(AcceptConfirm, acc.URI)
	c.Used[ob.offer]++
	i := d.p.record(RecordOp{Collection: lexicon.Lease, RKey: rkey, Value: lease, Undo: Undo{Offer: ob.offer, Used: -1, Reserved: 1}, MarketStep: market.StepAcceptLease, Since: acc.FirstSeen})
	ol := &ownLease{uri: market.URI(d.s.DID, lexicon.Lease, rkey), rkey: rkey, lease: lease, bid: ob}
	d.bidOf(ob, req, name, marketv1alpha1.BidLeased, "leased: ComputeContract "+market.ChildName(d.s.Name, acc.URI), i)
	d.contractOf(ol, acc, nil, marketv1alpha1.ContractProvisioning, "", i, nil)
}

// reclaimingFrom are the requesters this bidder takes a VM back from:
// they look elsewhere for the next one (they refuse this bidder's bids),
// so no bid is made on their requests.
func (d *bidder) reclaimingFrom() map[string]bool {
	out := map[string]bool{}
	for _, cc := range d.s.Contracts {
		if d.reclaimWanted(cc) != "" || (live(cc) && cc.Status.Reclaim != nil) {
			out[cc.Spec.RequesterDID] = true
		}
	}
	return out
}

// biddable reports whether the bidder bids on the request: of its
// network, before a deadline at most MaxBidWindow away, with a notice it
// promises, from a vouched requester it takes nothing back from and that
// holds fewer open bids than the cap.
func (d *bidder) biddable(req *market.Rec, reclaiming map[string]bool) bool {
	r := req.Request
	deadline := market.ParseTime(r.BidDeadline)
	switch {
	case r.Network != d.s.Network, deadline.IsZero(), !d.now.Before(deadline), deadline.After(d.now.Add(MaxBidWindow)), r.NoticeSeconds > d.maxNotice():
		return false
	case reclaiming[req.DID], !market.Vouched(d.s.View, d.s.Operator, d.s.Identity, req.DID, marketv1alpha1.RoleRequester):
		return false
	}
	// One requester cannot hold all of the bidder's capacity with
	// requests it never accepts.
	return d.perRequester[req.DID] < cmp.Or(d.s.Spec.MaxOpenBidsPerRequester, 10)
}

// cheapestOffer is the cheapest offer with free capacity that fits the
// request at its price; -1 when none does.
func (d *bidder) cheapestOffer(r *market.Request) int {
	offer := -1
	for i, o := range d.s.Spec.Offers {
		fits := market.Fits(market.Shape{CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB}, r.Shape) &&
			o.PricePerHour.Currency == r.MaxPricePerHour.Currency && o.PricePerHour.Amount <= r.MaxPricePerHour.Amount && d.free(i) > 0
		if fits && (offer < 0 || o.PricePerHour.Amount < d.s.Spec.Offers[offer].PricePerHour.Amount) {
			offer = i
		}
	}
	return offer
}

// bidOnRequests bids on every request of the network the bidder can
// serve and has not bid on, from the cheapest offer with free capacity
// that fits. Capacity is reserved as the bid is decided.
func (d *bidder) bidOnRequests(bids map[string]*ownBid) {
	validity := time.Duration(cmp.Or(d.s.Spec.BidValiditySeconds, 60)) * time.Second
	reclaiming := d.reclaimingFrom()
	for _, req := range d.s.View.Requests() {
		rkey := market.BidKey(d.s.Owner, req.URI)
		uri := market.URI(d.s.DID, lexicon.Bid, rkey)
		if bids[uri] != nil || req.Request == nil || req.DID == d.s.DID {
			continue
		}
		name := market.ChildName(d.s.Name, uri+"|"+req.CID)
		if d.s.BidObjects[name] != nil || !d.biddable(req, reclaiming) {
			continue // bid on before and settled, or not for this bidder
		}
		offer := d.cheapestOffer(req.Request)
		if offer < 0 {
			continue
		}
		o := d.s.Spec.Offers[offer]
		d.p.Counts.Reserved[offer]++
		d.perRequester[req.DID]++
		value := &market.Bid{
			Type:         lexicon.Bid,
			Request:      req.Ref(),
			PricePerHour: market.Price{Amount: o.PricePerHour.Amount, Currency: o.PricePerHour.Currency},
			Shape:        &market.Shape{Name: o.Name, CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB},
			ValidUntil:   market.Time(market.ParseTime(req.Request.BidDeadline).Add(validity)),
			Driver:       string(cmp.Or(d.s.Spec.Driver, marketv1alpha1.DriverProcess)),
			CreatedAt:    market.Time(d.now),
		}
		d.p.step(BidPlace, req.URI)
		i := d.p.record(RecordOp{Collection: lexicon.Bid, RKey: rkey, Value: value, Undo: Undo{Offer: offer, Reserved: -1}, MarketStep: market.StepRequestBid, Since: req.FirstSeen})
		ob := &ownBid{uri: uri, rkey: rkey, bid: value, offer: offer}
		d.bidOf(ob, req, name, marketv1alpha1.BidOpen, "open until "+value.ValidUntil, i)
		d.p.due(market.ParseTime(value.ValidUntil))
	}
}

// prune settles Bids whose record is gone (and that no write of this
// pass is about) and deletes settled Bids and finished contracts beyond
// the newest KeepFinished.
func (d *bidder) prune() {
	open := map[string]bool{}
	for _, rec := range d.s.Bids {
		open[rec.URI] = true
	}
	type finished struct {
		at  time.Time
		del Delete
	}
	var bids, contracts []finished
	for _, name := range slices.Sorted(mapsKeys(d.s.BidObjects)) {
		b := d.s.BidObjects[name]
		switch b.Status.State {
		case marketv1alpha1.BidOpen, marketv1alpha1.BidAccepted, "":
			if !open[b.Spec.Bid.URI] && d.p.Bids[name] == nil {
				d.p.step(BidRecordGone, b.Spec.Bid.URI)
				d.p.Bids[name] = &BidOp{Name: name, Status: marketv1alpha1.BidStatus{State: marketv1alpha1.BidWithdrawn, Message: "the bid record is gone"}, Needs: None}
			}
			continue
		case marketv1alpha1.BidLeased:
			if open[b.Spec.Bid.URI] {
				continue
			}
		}
		bids = append(bids, finished{b.CreationTimestamp.Time, Delete{Bid: b}})
	}
	for _, name := range slices.Sorted(mapsKeys(d.s.Contracts)) {
		if cc := d.s.Contracts[name]; !live(cc) && d.p.Contracts[name] == nil {
			contracts = append(contracts, finished{cc.CreationTimestamp.Time, Delete{Contract: cc}})
		}
	}
	for _, list := range [][]finished{bids, contracts} {
		slices.SortStableFunc(list, func(a, b finished) int { return b.at.Compare(a.at) })
		for i, f := range list {
			if i >= KeepFinished {
				d.p.Deletes = append(d.p.Deletes, f.del)
			}
		}
	}
}

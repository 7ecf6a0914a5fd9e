package deal

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
)

const (
	// MaxBidWindow: requests whose deadline is further away than this are
	// not bid on (a reservation would be held for that long).
	MaxBidWindow = 10 * time.Minute
	// KeepFinished is how many finished contracts and settled Bids a
	// bidder keeps.
	KeepFinished = 20
	// SettleAfter: a lease that is over (completed or declined) is
	// deleted with its bid once the requester has removed its accept, or
	// after this long at the latest.
	SettleAfter = 10 * time.Minute
	// DefaultMaxNotice is the most notice a bidder promises by default
	// (spec.maxNoticeSeconds), and MaxNoticeCap the most it can promise.
	DefaultMaxNotice = 24 * 60 * 60
	MaxNoticeCap     = 30 * 24 * 60 * 60
	// leaseLook is how often a live lease is looked at again.
	leaseLook = 30 * time.Second
)

// BidderSnapshot is what a bidder's decision reads: its spec, its own
// records (from its repo), the network's records (View) and its kcp
// objects.
type BidderSnapshot struct {
	// Name and Namespace of the MarketBidder; DID its repo's, Owner the
	// owner part of its record keys, Network its network's name and
	// Operator the network operator's DID.
	Name, Namespace, DID, Owner, Network, Operator string
	Spec                                           marketv1alpha1.MarketBidderSpec
	Identity                                       *marketv1alpha1.MarketIdentity
	// Stop is why no new work is taken ("" when it may be).
	Stop string
	// Bids, Leases and Reclaims are the bidder's own records.
	Bids, Leases, Reclaims []pds.Record
	View                   View
	Missing                Missing
	// BidObjects, Contracts and VMs are its kcp objects by name.
	BidObjects map[string]*marketv1alpha1.Bid
	Contracts  map[string]*marketv1alpha1.ComputeContract
	VMs        map[string]*computev1alpha1.ComputeVM
}

// bidder is one decision of one bidder.
type bidder struct {
	s            *BidderSnapshot
	now          time.Time
	p            *Plan
	complete     bool
	perRequester map[string]int32
	reclaims     map[string]pds.Record
}

// ownBid is one of the bidder's bid records.
type ownBid struct {
	uri, cid, rkey string
	bid            *market.Bid
	offer          int
	leased         bool
}

// ownLease is one of the bidder's lease records.
type ownLease struct {
	uri, cid, rkey string
	lease          *market.Lease
	bid            *ownBid
}

// DecideBidder decides a bidder's pass: leases first (what it runs), then
// its open bids (what it holds), then new bids on requests it can serve;
// then which finished objects go. It does no I/O.
func DecideBidder(s *BidderSnapshot, now time.Time) *Plan {
	n := len(s.Spec.Offers)
	d := &bidder{s: s, now: now, complete: s.View.Complete() == nil, perRequester: map[string]int32{}, reclaims: map[string]pds.Record{},
		p: &Plan{Bids: map[string]*BidOp{}, Contracts: map[string]*ContractOp{}, Ignored: map[string]bool{}, Counts: Counts{Used: make([]int32, n), Reserved: make([]int32, n)}}}
	for _, r := range s.Reclaims {
		_, _, rkey := market.SplitURI(r.URI)
		d.reclaims[rkey] = r
	}
	bids := map[string]*ownBid{}
	for _, rec := range s.Bids {
		var b market.Bid
		if market.Decode(lexicon.Bid, rec.Value, &b) != nil {
			continue
		}
		_, _, rkey := market.SplitURI(rec.URI)
		bids[rec.URI] = &ownBid{uri: rec.URI, cid: rec.CID, rkey: rkey, bid: &b, offer: d.offerOf(&b)}
	}
	for _, rec := range s.Leases {
		var l market.Lease
		if market.Decode(lexicon.Lease, rec.Value, &l) != nil {
			continue
		}
		_, _, rkey := market.SplitURI(rec.URI)
		ol := &ownLease{uri: rec.URI, cid: rec.CID, rkey: rkey, lease: &l}
		// The lease names the bid it took; older leases are linked
		// through their accept.
		bid := d.bidOfAccept(l.Accept.URI)
		if l.Bid != nil {
			bid = l.Bid.URI
		}
		if ob := bids[bid]; ob != nil {
			ob.leased, ol.bid = true, ob
		}
		d.lease(ol)
	}
	for _, uri := range slices.Sorted(mapsKeys(bids)) {
		if ob := bids[uri]; !ob.leased {
			d.openBid(ob)
		}
	}
	if s.Stop == "" {
		d.bidOnRequests(bids)
	}
	d.prune()
	return d.p
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (d *bidder) capacity(offer int) int32 {
	if offer < 0 || offer >= len(d.s.Spec.Offers) {
		return 0
	}
	return d.s.Spec.Offers[offer].Capacity
}

// free is what an offer can still take. Leases whose offer is not known
// (their bid record or offer is gone) count against every offer.
func (d *bidder) free(offer int) int32 {
	c := &d.p.Counts
	return max(d.capacity(offer)-c.Used[offer]-c.Unknown-c.Reserved[offer], 0)
}

// offerOf finds the offer a bid was made from: by name (the key of
// spec.offers; an offer whose shape or price was edited keeps its bids
// and leases), then by shape; -1 when the bidder no longer offers it.
func (d *bidder) offerOf(b *market.Bid) int {
	if b.Shape == nil {
		return -1
	}
	for i, o := range d.s.Spec.Offers {
		if o.Name == b.Shape.Name {
			return i
		}
	}
	for i, o := range d.s.Spec.Offers {
		if o.CPUMillis == b.Shape.CPUMillis && o.MemoryMiB == b.Shape.MemoryMiB {
			return i
		}
	}
	return -1
}

// bidOfAccept returns the URI of the bid an accept took: from the accept
// record, or from the contract made for it.
func (d *bidder) bidOfAccept(acceptURI string) string {
	if a := d.s.View.Get(acceptURI); a != nil && a.Accept != nil {
		return a.Accept.Bid.URI
	}
	if cc := d.s.Contracts[market.ChildName(d.s.Name, acceptURI)]; cc != nil {
		return cc.Spec.Bid.URI
	}
	return ""
}

// gone reports whether the record key, missing from the view now, is gone
// from did's repo: only once a listing of did ended after it was first
// found missing (market.Absences). The first time did is listed at once.
func (d *bidder) gone(did, key string) bool {
	return gone(d.p, d.s.View, d.s.Missing, d.complete, did, key)
}

// gone reports whether the record key, missing from view now, is gone
// from did's repo: only once a listing of did ended after it was first
// found missing (market.Absences). The first time did is listed at once.
// What to list and remember goes into p's Look.
func gone(p *Plan, view View, miss Missing, complete bool, did, key string) bool {
	if !complete {
		return false
	}
	since, noted := miss.Since(key)
	if !noted {
		p.Look.Note = append(p.Look.Note, key)
		p.Look.List = append(p.Look.List, did)
		return false
	}
	if view.Listed(did).After(since) {
		p.Look.Forget = append(p.Look.Forget, key)
		return true
	}
	p.Look.Refresh = append(p.Look.Refresh, did)
	return false
}

func (d *bidder) present(key string) {
	if _, noted := d.s.Missing.Since(key); noted {
		d.p.Look.Forget = append(d.p.Look.Forget, key)
	}
}

func (d *bidder) ignore(r *market.Rec) { d.p.Ignored[r.URI+"|"+r.CID] = true }

func live(cc *marketv1alpha1.ComputeContract) bool {
	return cc.Status.Phase != marketv1alpha1.ContractCompleted && cc.Status.Phase != marketv1alpha1.ContractFailed
}

// Live reports whether a contract is neither Completed nor Failed.
func LiveContract(cc *marketv1alpha1.ComputeContract) bool { return live(cc) }

// reclaimOf returns the bidder's own reclaim of a lease and its record,
// if it made one (one knotless did not write is made again).
func (d *bidder) reclaimOf(ol *ownLease) (*market.Reclaim, *pds.Record) {
	rec, ok := d.reclaims[market.ReclaimKey(d.s.Owner, ol.uri)]
	if !ok {
		return nil, nil
	}
	var rc market.Reclaim
	if market.Decode(lexicon.Reclaim, rec.Value, &rc) != nil || market.ParseTime(rc.TerminateAfter).IsZero() {
		return nil, nil
	}
	return &rc, &rec
}

// reclaimWanted is the reason spec.reclaims gives for taking the live
// contract cc back ("" when it does not name it).
func (d *bidder) reclaimWanted(cc *marketv1alpha1.ComputeContract) ReclaimReason {
	if cc == nil || !live(cc) {
		return ""
	}
	for _, r := range d.s.Spec.Reclaims {
		if r.Contract == cc.Name {
			return cmp.Or(r.Reason, ReclaimMaintenance)
		}
	}
	return ""
}

// maxNotice is the most notice the bidder promises (spec.maxNoticeSeconds,
// default a day).
func (d *bidder) maxNotice() int64 {
	if d.s.Spec.MaxNoticeSeconds == nil {
		return DefaultMaxNotice
	}
	return int64(*d.s.Spec.MaxNoticeSeconds)
}

// notice is what the bidder owes before it takes the VM of cc back: what
// the request asked for (the record, else what the contract kept of it),
// and when neither is known the most it promises.
func (d *bidder) notice(cc *marketv1alpha1.ComputeContract) time.Duration {
	secs := int64(cc.Spec.NoticeSeconds)
	if req := d.s.View.Get(cc.Spec.Request.URI); req != nil && req.Request != nil && req.CID == cc.Spec.Request.CID {
		secs = req.Request.NoticeSeconds
	} else if secs == 0 {
		secs = d.maxNotice()
	}
	return time.Duration(min(max(secs, 0), MaxNoticeCap)) * time.Second
}

// releaseOf returns the requester's release of the lease, if any; a
// release in another repo than the requester's is forged (counted).
func (d *bidder) releaseOf(ol *ownLease, requester string) *market.Rec {
	var found *market.Rec
	for _, r := range d.s.View.Children(ol.uri, lexicon.Release) {
		if r.DID != requester {
			d.ignore(r)
			continue
		}
		found = r
	}
	return found
}

// contractOf is the contract write of a lease: the contract to make
// when there is none (from the accept and the bid), and its status in
// phase with reason. Nothing when there is no contract and nothing to
// make one from. reclaim is a reclaim written in this pass.
func (d *bidder) contractOf(ol *ownLease, acc *market.Rec, cc *marketv1alpha1.ComputeContract, phase Phase, reason ContractReason, needs int, reclaim *market.Reclaim) {
	name := market.ChildName(d.s.Name, ol.lease.Accept.URI)
	op := &ContractOp{Name: name, Needs: needs}
	var spec *marketv1alpha1.ComputeContractSpec
	var cur marketv1alpha1.ComputeContractStatus
	var gen int64
	if cc == nil {
		if acc == nil || acc.Accept == nil || ol.bid == nil {
			return // nothing to make it from: the deal is over
		}
		spec = d.contractSpec(ol, acc)
		op.Create = spec
		d.p.event("", corev1.EventTypeNormal, "Leased", "Lease", fmt.Sprintf("leased a VM to %s: ComputeContract %s", spec.RequesterDID, name), needs)
	} else {
		spec, cur, gen = &cc.Spec, *cc.Status.DeepCopy(), cc.Generation
	}
	st := cur
	st.ObservedGeneration = gen
	st.Phase, st.Reason = phase, string(reason)
	st.Records.Request, st.Records.Bid, st.Records.Accept = new(spec.Request), new(spec.Bid), new(spec.Accept)
	st.Records.Lease = &marketv1alpha1.RecordRef{URI: ol.uri, CID: ol.cid}
	if rel := d.releaseOf(ol, spec.RequesterDID); rel != nil {
		st.Records.Release = &marketv1alpha1.RecordRef{URI: rel.URI, CID: rel.CID}
	}
	reclaimed := ""
	rc, rec := d.reclaimOf(ol)
	if reclaim != nil {
		rc, rec = reclaim, &pds.Record{URI: market.URI(d.s.DID, lexicon.Reclaim, market.ReclaimKey(d.s.Owner, ol.uri))}
	}
	if rc != nil {
		st.Records.Reclaim = &marketv1alpha1.RecordRef{URI: rec.URI, CID: rec.CID}
		// To the second, as status holds it (else every pass rewrites it).
		st.Reclaim = &marketv1alpha1.ContractReclaim{Reason: string(rc.Reason), TerminateAfter: *market.MetaTime(market.ParseTime(rc.TerminateAfter))}
		if at := market.MetaTime(market.ParseTime(rc.CreatedAt)); at != nil {
			st.Reclaim.Seen = *at
		}
		reclaimed = fmt.Sprintf("; reclaimed (%s): it stops after %s", rc.Reason, rc.TerminateAfter)
	}
	status, msg := metav1.ConditionFalse, "leased; the VM is not running yet"+reclaimed
	switch phase {
	case marketv1alpha1.ContractActive:
		status, msg = metav1.ConditionTrue, "the VM runs"+reclaimed
	case marketv1alpha1.ContractCompleted:
		msg = "the lease is over: " + string(reason)
	case marketv1alpha1.ContractFailed:
		msg = "the lease failed: " + string(reason)
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionReady, Status: status, Reason: string(phase), Message: msg, ObservedGeneration: gen})
	op.Status = st
	d.p.Contracts[name] = op
}

// contractSpec is the spec of the contract of a lease, from the accept,
// the bid and the version of the request both name (a request edited
// since asks what the bidder never agreed to).
func (d *bidder) contractSpec(ol *ownLease, acc *market.Rec) *marketv1alpha1.ComputeContractSpec {
	requester, _, _ := market.SplitURI(ol.lease.Accept.URI)
	spec := &marketv1alpha1.ComputeContractSpec{
		Side:         marketv1alpha1.SideBidder,
		RequesterDID: requester,
		BidderDID:    d.s.DID,
		PricePerHour: marketv1alpha1.Price{Amount: ol.bid.bid.PricePerHour.Amount, Currency: ol.bid.bid.PricePerHour.Currency},
		Request:      market.APIRef(acc.Accept.Request),
		Bid:          market.APIRef(acc.Accept.Bid),
		Accept:       market.APIRef(acc.Ref()),
	}
	if ol.bid.bid.Shape != nil {
		spec.Shape = market.APIShape(*ol.bid.bid.Shape)
	}
	if req := d.s.View.Get(acc.Accept.Request.URI); req != nil && req.Request != nil && req.CID == acc.Accept.Request.CID {
		spec.ReplicaIndex = int32(req.Request.ReplicaIndex)
		spec.NoticeSeconds = int32(min(max(req.Request.NoticeSeconds, 0), MaxNoticeCap))
		if ol.bid.bid.Shape == nil {
			spec.Shape = market.APIShape(req.Request.Shape)
		}
	}
	return spec
}

// bidOf is the Bid object write of one of the bidder's bids in state.
func (d *bidder) bidOf(ob *ownBid, req *market.Rec, name string, state State, msg string, needs int) {
	op := &BidOp{Name: name, Status: marketv1alpha1.BidStatus{State: state, Message: msg}, Needs: needs}
	if d.s.BidObjects[name] == nil {
		requester, _, _ := market.SplitURI(ob.bid.Request.URI)
		spec := &marketv1alpha1.BidSpec{
			Side:         marketv1alpha1.SideBidder,
			Request:      market.APIRef(ob.bid.Request),
			Bid:          marketv1alpha1.RecordRef{URI: ob.uri, CID: ob.cid},
			RequesterDID: requester,
			BidderDID:    d.s.DID,
			PricePerHour: marketv1alpha1.Price{Amount: ob.bid.PricePerHour.Amount, Currency: ob.bid.PricePerHour.Currency},
			ValidUntil:   market.MetaTime(market.ParseTime(ob.bid.ValidUntil)),
		}
		if req != nil && req.Request != nil {
			spec.ReplicaIndex = int32(req.Request.ReplicaIndex)
		}
		if ob.bid.Shape != nil {
			shape := market.APIShape(*ob.bid.Shape)
			spec.Shape = &shape
		}
		op.Create = spec
	}
	d.p.Bids[name] = op
}

// settleBid deletes a bid record that can no longer be accepted and
// records why on its Bid (when there is one).
func (d *bidder) settleBid(id TransitionID, ob *ownBid, name string, state State, msg string) {
	d.p.step(id, ob.uri)
	i := d.p.record(RecordOp{Collection: lexicon.Bid, RKey: ob.rkey, Undo: Undo{Offer: ob.offer, Reserved: 1}})
	if d.s.BidObjects[name] != nil {
		d.p.Bids[name] = &BidOp{Name: name, Status: marketv1alpha1.BidStatus{State: state, Message: msg}, Needs: i}
	}
}

package marketrequester

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/ssa"
)

// replica runs one replica's deal; wanted says whether it should have a
// VM. It returns the replica's status and whether the replica stays in
// status.requests.
func (s *session) replica(rr *replicaRecords, wanted bool) (marketv1alpha1.RequestStatus, bool, error) {
	rs := marketv1alpha1.RequestStatus{Index: rr.index, Attempt: rr.attempt, State: marketv1alpha1.RequestOpen}
	accepts := s.acceptsOf(rr)
	var reclaimed *marketv1alpha1.ComputeContract
	if ccs := s.contractsOf(rr.index); len(ccs) > 0 {
		// A contract whose bidder reclaimed it runs until a newer one of
		// the replica is Active; then it is released.
		for i, cc := range ccs[:len(ccs)-1] {
			keep, reason := wanted && !anyActive(ccs[i+1:]), s.release
			if wanted {
				reason = deal.ReleaseReclaimed
			}
			if _, err := s.contracted(rr, cc, accepts, keep, reason, &marketv1alpha1.RequestStatus{}); err != nil {
				return rs, true, err
			}
		}
		cc := ccs[len(ccs)-1]
		finished, err := s.contracted(rr, cc, accepts, wanted, s.release, &rs)
		switch {
		case err != nil:
			return rs, true, err
		case finished:
			// The deal is over: the replica goes back to the market (or
			// away).
			s.due(s.now)
			return rs, wanted || len(ccs) > 1, nil
		case !wanted:
			// A request for the next VM of a reclaimed one goes too.
			return rs, true, s.withdrawOpen(rr, accepts)
		case cc.Status.Reclaim == nil || cc.Status.Phase == marketv1alpha1.ContractReleasing:
			return rs, true, nil
		}
		// Its bidder reclaims it: the next VM is bought while it runs.
		reclaimed = cc
	}
	if !wanted {
		// Nothing is leased: withdraw what is open.
		err := s.withdraw(rr, accepts)
		return rs, err != nil, err
	}
	rs, keep, err := s.buy(rr, accepts, rs)
	if reclaimed != nil {
		rs.Message = fmt.Sprintf("ComputeContract %s is reclaimed by its bidder, who stops it after %s; buying the next: %s",
			reclaimed.Name, market.Time(reclaimed.Status.Reclaim.TerminateAfter.Time), rs.Message)
	}
	return rs, keep, err
}

// buy runs the market for a replica that needs a VM: a request, bids,
// an accept, until a lease makes a contract.
func (s *session) buy(rr *replicaRecords, accepts map[string][]*ownAccept, rs marketv1alpha1.RequestStatus) (marketv1alpha1.RequestStatus, bool, error) {
	// Requests of earlier attempts are withdrawn first (not those a live
	// contract rests on).
	for stamp, rec := range rr.attempts {
		if stamp != rr.stamp && !s.restsOn(rec.uri) {
			if err := s.withdrawRequest(rec, accepts[rec.uri]); err != nil {
				return rs, true, err
			}
		}
	}
	cur := rr.current
	if cur == nil || s.restsOn(cur.uri) {
		return rs, true, s.ask(rr, &rs)
	}
	rs.Record = &marketv1alpha1.PublishedRecord{URI: cur.uri, CID: cur.cid}
	deadline := market.ParseTime(cur.request.BidDeadline)
	rs.BidDeadline = market.MetaTime(deadline)

	bids := s.judge(rr, cur, deadline)
	rs.Bids = int32(len(bids))
	var errs []error
	// An accept that is still open waits for the bidder.
	turnedDown := false
	for _, acc := range accepts[cur.uri] {
		done, err := s.answered(rr, cur, acc, bids, &rs)
		if err != nil {
			errs = append(errs, err)
		}
		if done {
			errs = append(errs, s.recordBids(rr, cur, bids))
			return rs, true, errors.Join(errs...)
		}
		turnedDown = true
	}
	if len(errs) > 0 {
		return rs, true, errors.Join(errs...)
	}
	rs.Acceptable = 0
	for _, b := range bids {
		if b.state == marketv1alpha1.BidOpen {
			rs.Acceptable++
		}
	}
	switch {
	case s.now.Before(deadline):
		rs.Message = fmt.Sprintf("collecting bids until %s (%d so far)", market.Time(deadline), len(bids))
		s.due(deadline)
		return rs, true, errors.Join(append(errs, s.recordBids(rr, cur, bids))...)
	case s.view.Complete() != nil:
		err := s.view.Complete()
		rs.Message = err.Error()
		s.due(s.now.Add(time.Second))
		return rs, true, errors.Join(append(errs, s.recordBids(rr, cur, bids))...)
	}
	if best := first(bids, marketv1alpha1.BidOpen); best != nil {
		// The accept goes out first; the Bids are written after it.
		errs = append(errs, s.accept(rr, cur, best, bids, &rs))
		return rs, true, errors.Join(errs...)
	}
	if err := s.recordBids(rr, cur, bids); err != nil {
		errs = append(errs, err)
	}
	// A round without an acceptable bid: ask again later, waiting longer
	// after every empty round; at once when the bidder taken declined or
	// did not answer (the requester goes back to the market).
	next := deadline.Add(retryWait(s.window(), rr.attempt))
	if s.now.Before(next) && !turnedDown {
		rs.NextAttempt = market.MetaTime(next)
		rs.Message = fmt.Sprintf("no acceptable bid (%d seen); asking again at %s", len(bids), market.Time(next))
		if len(bids) == 0 {
			rs.Message = "no bidder answered; asking again at " + market.Time(next)
		}
		s.due(next)
		return rs, true, errors.Join(errs...)
	}
	if err := s.withdrawRequest(cur, nil); err != nil {
		return rs, true, errors.Join(append(errs, err)...)
	}
	rr.current = nil
	return rs, true, errors.Join(append(errs, s.ask(rr, &rs))...)
}

func (s *session) window() int32 { return cmp.Or(s.mr.Spec.BidWindowSeconds, 10) }

func (s *session) confirm() time.Duration {
	return time.Duration(cmp.Or(s.mr.Spec.ConfirmSeconds, 300)) * time.Second
}

// ask publishes the replica's next request.
func (s *session) ask(rr *replicaRecords, rs *marketv1alpha1.RequestStatus) error {
	spec := s.mr.Spec
	attempt := rr.attempt + 1
	deadline := s.now.Add(time.Duration(s.window()) * time.Second)
	req := &market.Request{
		Type:            lexicon.Request,
		Shape:           market.ShapeOf(spec.Shape),
		MaxPricePerHour: market.Price{Amount: spec.MaxPricePerHour.Amount, Currency: spec.MaxPricePerHour.Currency},
		BidDeadline:     market.Time(deadline),
		NoticeSeconds:   int64(spec.NoticeSeconds),
		Network:         s.network,
		ReplicaIndex:    int64(rr.index),
		CreatedAt:       market.Time(s.now),
	}
	rec, err := s.inv.Put(s.ctx, lexicon.Request, market.RequestKey(s.owner, rr.index, s.now), req)
	if err != nil {
		return err
	}
	rs.Attempt = attempt
	rs.Record = &marketv1alpha1.PublishedRecord{URI: rec.URI, CID: rec.CID}
	rs.BidDeadline = market.MetaTime(deadline)
	rs.Message = "collecting bids until " + market.Time(deadline)
	s.due(deadline)
	return nil
}

// acceptsOf returns the requester's accept records of the replica's
// requests, by request URI.
func (s *session) acceptsOf(rr *replicaRecords) map[string][]*ownAccept {
	out := map[string][]*ownAccept{}
	for _, rec := range s.inv.List(lexicon.Accept) {
		var acc market.Accept
		if market.Decode(lexicon.Accept, rec.Value, &acc) != nil {
			continue
		}
		for _, req := range rr.attempts {
			if acc.Request.URI == req.uri {
				_, _, rkey := market.SplitURI(rec.URI)
				out[req.uri] = append(out[req.uri], &ownAccept{uri: rec.URI, cid: rec.CID, rkey: rkey, accept: &acc})
			}
		}
	}
	return out
}

type ownAccept struct {
	uri, cid, rkey string
	accept         *market.Accept
}

// withdraw deletes the replica's open requests and accepts (nothing is
// leased).
func (s *session) withdraw(rr *replicaRecords, accepts map[string][]*ownAccept) error {
	var errs []error
	for _, rec := range rr.attempts {
		errs = append(errs, s.withdrawRequest(rec, accepts[rec.uri]))
	}
	return errors.Join(errs...)
}

// withdrawOpen deletes the replica's requests (and their accepts) that no
// live contract rests on.
func (s *session) withdrawOpen(rr *replicaRecords, accepts map[string][]*ownAccept) error {
	var errs []error
	for _, rec := range rr.attempts {
		if !s.restsOn(rec.uri) {
			errs = append(errs, s.withdrawRequest(rec, accepts[rec.uri]))
		}
	}
	return errors.Join(errs...)
}

// withdrawRequest deletes a request record and its accepts.
func (s *session) withdrawRequest(rec *ownRecord, accepts []*ownAccept) error {
	for _, acc := range accepts {
		if err := s.inv.Delete(s.ctx, lexicon.Accept, acc.rkey); err != nil {
			return err
		}
	}
	return s.inv.Delete(s.ctx, lexicon.Request, rec.rkey)
}

// judged is a bid as the requester judges it.
type judged struct {
	rec       *market.Rec
	state     marketv1alpha1.BidState
	message   string
	firstSeen time.Time
	name      string
}

// judge reads the bids on the current request and says what each one is
// worth, most acceptable first: acceptable ones by price (then by when
// they were first seen), the others after them.
func (s *session) judge(rr *replicaRecords, cur *ownRecord, deadline time.Time) []*judged {
	spec := s.mr.Spec
	// Bidders that declined an accept of this requester, or did not answer
	// one, are not taken again for a while (on any replica or request).
	avoid := map[string]*marketv1alpha1.Bid{}
	for _, b := range s.bids {
		if (b.Status.State == marketv1alpha1.BidDeclined || b.Status.State == marketv1alpha1.BidVoid) && s.now.Before(b.CreationTimestamp.Add(avoidFor)) {
			avoid[b.Spec.BidderDID] = b
		}
	}
	// Nor is a bidder that stopped a reclaimed VM before the notice it
	// owed, for as long after.
	early := map[string]time.Time{}
	for _, cc := range s.contracts {
		if cc.Status.Reason != string(deal.ReclaimedEarly) || cc.Status.Reclaim == nil {
			continue
		}
		// Until avoidFor after the notice it owed would have run out.
		until := cc.Status.Reclaim.Seen.Add(time.Duration(cc.Spec.NoticeSeconds)*time.Second + avoidFor)
		if s.now.Before(until) && until.After(early[cc.Spec.BidderDID]) {
			early[cc.Spec.BidderDID] = until
		}
	}
	var out []*judged
	for _, rec := range s.view.Children(cur.uri, lexicon.Bid) {
		if rec.DID == s.st.DID || rec.Bid == nil {
			continue
		}
		j := &judged{rec: rec, name: market.ChildName(s.mr.Name, rec.URI+"|"+rec.CID), firstSeen: rec.FirstSeen}
		prev := s.bids[j.name]
		if prev != nil && prev.Spec.FirstSeen != nil {
			j.firstSeen = prev.Spec.FirstSeen.Time
		}
		b := rec.Bid
		validUntil := market.ParseTime(b.ValidUntil)
		switch {
		case b.Request.CID != cur.cid:
			j.state, j.message = marketv1alpha1.BidInvalid, "the bid refers to another version of the request"
		case j.firstSeen.After(deadline):
			j.state, j.message = marketv1alpha1.BidLate, "first seen at "+market.Time(j.firstSeen)+", after the bid deadline"
		case b.Shape != nil && !market.Fits(*b.Shape, cur.request.Shape):
			j.state, j.message = marketv1alpha1.BidInvalid, "the bid offers a smaller VM than the request asks for"
		case b.PricePerHour.Currency != spec.MaxPricePerHour.Currency || b.PricePerHour.Amount > spec.MaxPricePerHour.Amount:
			j.state, j.message = marketv1alpha1.BidOverBudget, fmt.Sprintf("asks %d %s; the most this requester pays is %d %s",
				b.PricePerHour.Amount, b.PricePerHour.Currency, spec.MaxPricePerHour.Amount, spec.MaxPricePerHour.Currency)
		case len(spec.Policy.AllowedBidders) > 0 && !slices.Contains(spec.Policy.AllowedBidders, rec.DID):
			j.state, j.message = marketv1alpha1.BidNotAllowed, "the bidder is not in spec.policy.allowedBidders"
		case !market.Vouched(s.view, s.net.Spec.OperatorDID, s.id, rec.DID, marketv1alpha1.RoleBidder):
			j.state, j.message = marketv1alpha1.BidUnvouched, "neither the network's operator nor this requester's identity vouches for the bidder"
		case validUntil.IsZero() || !s.now.Before(validUntil):
			j.state, j.message = marketv1alpha1.BidExpired, "valid until "+b.ValidUntil
		default:
			j.state, j.message = marketv1alpha1.BidOpen, "may be accepted"
		}
		// What happened to a bid stays: a bidder that declined or did not
		// answer is not asked again on this request, nor for a while on
		// another.
		if prev != nil && j.state == marketv1alpha1.BidOpen {
			switch prev.Status.State {
			case marketv1alpha1.BidDeclined, marketv1alpha1.BidVoid, marketv1alpha1.BidLost:
				j.state, j.message = prev.Status.State, prev.Status.Message
			}
		}
		switch {
		case j.state != marketv1alpha1.BidOpen:
		case s.reclaiming(rec.DID):
			j.state, j.message = marketv1alpha1.BidNotAllowed, "this bidder reclaims a VM of this requester"
		case !early[rec.DID].IsZero():
			j.state, j.message = marketv1alpha1.BidNotAllowed, "this bidder stopped a reclaimed VM before its notice ran out; not taken again before "+market.Time(early[rec.DID])
		}
		if a := avoid[rec.DID]; a != nil && j.state == marketv1alpha1.BidOpen && a.Name != j.name {
			j.state = a.Status.State
			j.message = "this bidder declined or did not answer an accept at " + market.Time(a.CreationTimestamp.Time) + "; not taken again before " + market.Time(a.CreationTimestamp.Add(avoidFor))
		}
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

func first(bids []*judged, state marketv1alpha1.BidState) *judged {
	for _, b := range bids {
		if b.state == state {
			return b
		}
	}
	return nil
}

// recordBids keeps a Bid object for each of the (at most
// maxBidsPerRequest) best bids on the current request, with what became
// of it. It goes through every bid, whatever fails.
func (s *session) recordBids(rr *replicaRecords, cur *ownRecord, bids []*judged) error {
	limit := int(cmp.Or(s.mr.Spec.MaxBidsPerRequest, 20))
	var mu sync.Mutex
	var errs []error
	var g errgroup.Group
	g.SetLimit(kcpWriters)
	write := func(f func() error) {
		g.Go(func() error {
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	seen := map[string]bool{}
	for i, j := range bids {
		seen[j.name] = true
		if i < limit {
			b := s.bids[j.name]
			write(func() error { return s.recordBid(rr, j, b) })
		}
	}
	// A Bid whose record went or changed (a new version is a new Bid).
	for name, b := range s.bids {
		if b.Spec.Request.URI == cur.uri && !seen[name] && b.Status.State == marketv1alpha1.BidOpen {
			write(func() error {
				return s.bidState(b, marketv1alpha1.BidWithdrawn, "the bidder withdrew or changed this bid")
			})
		}
	}
	_ = g.Wait() // errors are in errs
	for _, b := range s.made {
		s.bids[b.Name] = b
	}
	s.made = nil
	return errors.Join(errs...)
}

// recordBid writes the Bid b (nil: not made yet) of a judged bid.
func (s *session) recordBid(rr *replicaRecords, j *judged, b *marketv1alpha1.Bid) error {
	if b == nil {
		fs := metav1.NewMicroTime(j.firstSeen)
		b = &marketv1alpha1.Bid{
			ObjectMeta: metav1.ObjectMeta{Name: j.name, Namespace: s.mr.Namespace},
			Spec: marketv1alpha1.BidSpec{
				Side:         marketv1alpha1.SideRequester,
				Request:      market.APIRef(j.rec.Bid.Request),
				Bid:          market.APIRef(j.rec.Ref()),
				RequesterDID: s.st.DID,
				BidderDID:    j.rec.DID,
				ReplicaIndex: rr.index,
				PricePerHour: marketv1alpha1.Price{Amount: j.rec.Bid.PricePerHour.Amount, Currency: j.rec.Bid.PricePerHour.Currency},
				ValidUntil:   market.MetaTime(market.ParseTime(j.rec.Bid.ValidUntil)),
				FirstSeen:    &fs,
			},
		}
		if j.rec.Bid.Shape != nil {
			shape := market.APIShape(*j.rec.Bid.Shape)
			b.Spec.Shape = &shape
		}
		if err := ssa.Child(s.ctx, s.c, b, s.mr, FieldManager); err != nil {
			return err
		}
		s.mu.Lock()
		s.made = append(s.made, b)
		s.mu.Unlock()
	}
	return s.bidState(b, j.state, j.message)
}

// bidState writes a Bid's state when it changed.
func (s *session) bidState(b *marketv1alpha1.Bid, state marketv1alpha1.BidState, msg string) error {
	want := marketv1alpha1.BidStatus{State: state, Message: msg}
	err := ssa.WriteStatus(s.ctx, s.c, b, &b.Status, &want, ssa.StatusOptions{Manager: FieldManager})
	if err == nil {
		b.Status = want
	}
	return err
}

// answered looks at an accept the requester published: the bidder's
// lease makes a contract; a decline, or no answer by confirmBy, voids it
// (the accept is deleted and another bid may be taken). It reports
// whether the replica is settled for this reconcile.
func (s *session) answered(rr *replicaRecords, cur *ownRecord, acc *ownAccept, bids []*judged, rs *marketv1alpha1.RequestStatus) (bool, error) {
	bid := s.view.Get(acc.accept.Bid.URI)
	bidderDID, _, _ := market.SplitURI(acc.accept.Bid.URI)
	name := market.ChildName(s.mr.Name, acc.accept.Bid.URI+"|"+acc.accept.Bid.CID)
	lease := s.leaseOf(acc.uri, acc.cid, bidderDID)
	confirmBy := market.ParseTime(acc.accept.ConfirmBy)
	obj := s.bids[name]
	switch {
	case lease != nil && (lease.Lease.State == deal.LeaseConfirmed || lease.Lease.State == deal.LeaseRunning):
		return true, s.contract(rr, cur, acc, lease, bids, rs)
	case lease != nil && lease.Lease.State == deal.LeaseDeclined:
		reason := string(cmp.Or(lease.Lease.Reason, "unspecified"))
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "Declined", "Accept", "bidder %s declined replica %d: %s", bidderDID, rr.index, reason)
		if obj != nil {
			if err := s.bidState(obj, marketv1alpha1.BidDeclined, "the bidder declined: "+reason); err != nil {
				return false, err
			}
		}
		markJudged(bids, name, marketv1alpha1.BidDeclined, "the bidder declined: "+reason)
	case bid == nil && s.r.absent.Gone(s.view, bidderDID, "bid|"+acc.accept.Bid.URI, s.now):
		// The bidder withdrew the bid it was accepted on: no lease will come.
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "Void", "Accept", "bidder %s withdrew the bid replica %d accepted", bidderDID, rr.index)
		if obj != nil {
			if err := s.bidState(obj, marketv1alpha1.BidVoid, "withdrawn by the bidder after it was accepted"); err != nil {
				return false, err
			}
		}
		markJudged(bids, name, marketv1alpha1.BidVoid, "withdrawn by the bidder after it was accepted")
	case !s.now.Before(confirmBy) && s.view.Complete() != nil:
		// No lease by confirmBy as far as the view goes; it is incomplete.
		s.due(s.now.Add(time.Second))
		return true, nil
	case !s.now.Before(confirmBy):
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "Void", "Accept", "bidder %s did not answer replica %d's accept by %s", bidderDID, rr.index, acc.accept.ConfirmBy)
		if obj != nil {
			if err := s.bidState(obj, marketv1alpha1.BidVoid, "no lease by "+acc.accept.ConfirmBy); err != nil {
				return false, err
			}
		}
		markJudged(bids, name, marketv1alpha1.BidVoid, "no lease by "+acc.accept.ConfirmBy)
	default:
		rs.State = marketv1alpha1.RequestAccepted
		rs.Accept = &marketv1alpha1.PublishedRecord{URI: acc.uri, CID: acc.cid}
		rs.ConfirmBy = market.MetaTime(confirmBy)
		rs.Message = fmt.Sprintf("accepted a bid of %s; waiting for its lease until %s", bidderDID, acc.accept.ConfirmBy)
		if bid == nil && s.view.Complete() == nil {
			rs.Message = fmt.Sprintf("accepted a bid of %s, which it has withdrawn; waiting until %s", bidderDID, acc.accept.ConfirmBy)
		}
		if obj != nil {
			if err := s.bidState(obj, marketv1alpha1.BidAccepted, "accepted; the bidder has until "+acc.accept.ConfirmBy+" to confirm"); err != nil {
				return true, err
			}
		}
		markJudged(bids, name, marketv1alpha1.BidAccepted, "accepted; the bidder has until "+acc.accept.ConfirmBy+" to confirm")
		s.due(confirmBy)
		return true, nil
	}
	// Declined or void: the accept goes, and another bid may be taken.
	return false, s.inv.Delete(s.ctx, lexicon.Accept, acc.rkey)
}

func markJudged(bids []*judged, name string, state marketv1alpha1.BidState, msg string) {
	for _, b := range bids {
		if b.name == name {
			b.state, b.message = state, msg
		}
	}
}

// leaseOf returns the bidder's lease answering the accept, if any. A
// lease in another repo than the bidder's, or one that answers another
// version of the accept, is forged or stale: ignored and counted.
func (s *session) leaseOf(acceptURI, acceptCID, bidderDID string) *market.Rec {
	var found *market.Rec
	for _, l := range s.view.Children(acceptURI, lexicon.Lease) {
		if l.DID != bidderDID || l.Lease == nil || l.Lease.Accept.CID != acceptCID {
			s.ignored[l.URI+"|"+l.CID] = true
			continue
		}
		found = l
	}
	return found
}

// accept publishes an accept of the best bid.
func (s *session) accept(rr *replicaRecords, cur *ownRecord, best *judged, bids []*judged, rs *marketv1alpha1.RequestStatus) error {
	confirmBy := s.now.Add(s.confirm())
	acc := &market.Accept{
		Type:      lexicon.Accept,
		Bid:       best.rec.Ref(),
		Request:   market.StrongRef{URI: cur.uri, CID: cur.cid},
		ConfirmBy: market.Time(confirmBy),
		CreatedAt: market.Time(s.now),
	}
	rec, err := s.inv.Put(s.ctx, lexicon.Accept, market.AcceptKey(s.owner, best.rec.URI), acc)
	if err != nil {
		return err
	}
	s.r.observeStep(market.StepDeadlineAccept, market.ParseTime(cur.request.BidDeadline))
	s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Accepted", "Accept", "replica %d: accepted the bid of %s at %d %s per hour",
		rr.index, best.rec.DID, best.rec.Bid.PricePerHour.Amount, best.rec.Bid.PricePerHour.Currency)
	best.state, best.message = marketv1alpha1.BidAccepted, "accepted; the bidder has until "+acc.ConfirmBy+" to confirm"
	rs.State = marketv1alpha1.RequestAccepted
	rs.Accept = &marketv1alpha1.PublishedRecord{URI: rec.URI, CID: rec.CID}
	rs.ConfirmBy = market.MetaTime(confirmBy)
	rs.Message = fmt.Sprintf("accepted a bid of %s; waiting for its lease until %s", best.rec.DID, acc.ConfirmBy)
	s.due(confirmBy)
	return s.recordBids(rr, cur, bids)
}

// contract makes the requester's ComputeContract once the bidder's lease
// confirms an accept, and marks the other bids of the request lost.
func (s *session) contract(rr *replicaRecords, cur *ownRecord, acc *ownAccept, lease *market.Rec, bids []*judged, rs *marketv1alpha1.RequestStatus) error {
	name := market.ChildName(s.mr.Name, acc.uri)
	bidName := market.ChildName(s.mr.Name, acc.accept.Bid.URI+"|"+acc.accept.Bid.CID)
	for _, b := range bids {
		switch {
		case b.name == bidName:
			b.state, b.message = marketv1alpha1.BidLeased, "leased: ComputeContract "+name
		case b.state == marketv1alpha1.BidOpen || b.state == marketv1alpha1.BidAccepted:
			b.state, b.message = marketv1alpha1.BidLost, "another bid was leased"
		}
	}
	bidderDID, _, _ := market.SplitURI(acc.accept.Bid.URI)
	cc := &marketv1alpha1.ComputeContract{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.mr.Namespace},
		Spec: marketv1alpha1.ComputeContractSpec{
			Side:          marketv1alpha1.SideRequester,
			RequesterDID:  s.st.DID,
			BidderDID:     bidderDID,
			ReplicaIndex:  rr.index,
			Shape:         s.mr.Spec.Shape,
			NoticeSeconds: int32(cur.request.NoticeSeconds),
			Request:       marketv1alpha1.RecordRef{URI: cur.uri, CID: cur.cid},
			Bid:           market.APIRef(acc.accept.Bid),
			Accept:        marketv1alpha1.RecordRef{URI: acc.uri, CID: acc.cid},
		},
	}
	if bid := s.view.Get(acc.accept.Bid.URI); bid != nil && bid.Bid != nil && bid.CID == acc.accept.Bid.CID {
		cc.Spec.PricePerHour = marketv1alpha1.Price{Amount: bid.Bid.PricePerHour.Amount, Currency: bid.Bid.PricePerHour.Currency}
		if bid.Bid.Shape != nil {
			cc.Spec.Shape = market.APIShape(*bid.Bid.Shape)
		}
	} else if b := s.bids[bidName]; b != nil {
		cc.Spec.PricePerHour = b.Spec.PricePerHour
		if b.Spec.Shape != nil {
			cc.Spec.Shape = *b.Spec.Shape
		}
	}
	if err := ssa.Child(s.ctx, s.c, cc, s.mr, FieldManager); err != nil {
		return err
	}
	s.contracts[name] = cc
	s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Contracted", "Lease", "replica %d: %s confirmed; ComputeContract %s", rr.index, bidderDID, name)
	_, err := s.contracted(rr, cc, map[string][]*ownAccept{cur.uri: {acc}}, true, s.release, rs)
	return err
}

// contractsOf returns the replica's live contracts, oldest first: more
// than one while the next VM of a reclaimed one is bought.
func (s *session) contractsOf(index int32) []*marketv1alpha1.ComputeContract {
	var out []*marketv1alpha1.ComputeContract
	for _, cc := range s.contracts {
		if cc.Spec.ReplicaIndex == index && deal.LiveContract(cc) {
			out = append(out, cc)
		}
	}
	// By when the request each rests on was made (its key says, to the
	// millisecond).
	stamp := func(cc *marketv1alpha1.ComputeContract) int64 {
		_, _, rkey := market.SplitURI(cc.Spec.Request.URI)
		_, at, _ := market.ParseRequestKey(s.owner, rkey)
		return at
	}
	slices.SortFunc(out, func(a, b *marketv1alpha1.ComputeContract) int {
		return cmp.Or(cmp.Compare(stamp(a), stamp(b)), a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func anyActive(ccs []*marketv1alpha1.ComputeContract) bool {
	return slices.ContainsFunc(ccs, func(cc *marketv1alpha1.ComputeContract) bool { return cc.Status.Phase == marketv1alpha1.ContractActive })
}

// restsOn reports whether a live contract rests on the request at uri.
func (s *session) restsOn(uri string) bool {
	for _, cc := range s.contracts {
		if deal.LiveContract(cc) && cc.Spec.Request.URI == uri {
			return true
		}
	}
	return false
}

// reclaiming reports whether the bidder (by DID) reclaims a live contract of
// this requester: its bids are not taken meanwhile.
func (s *session) reclaiming(did string) bool {
	for _, cc := range s.contracts {
		if deal.LiveContract(cc) && cc.Status.Reclaim != nil && cc.Spec.BidderDID == did {
			return true
		}
	}
	return false
}

// contracted follows a replica's contract: from the bidder's lease while
// the replica is wanted, through a release (with relReason) when it no
// longer is. When the deal is over (Completed or Failed) the requester's
// records of it are deleted and it reports finished.
func (s *session) contracted(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, accepts map[string][]*ownAccept, wanted bool, relReason deal.ReleaseReason, rs *marketv1alpha1.RequestStatus) (bool, error) {
	if _, _, akey := market.SplitURI(cc.Spec.Accept.URI); s.inv.Get(lexicon.Accept, akey) == nil {
		// The requester deleted the accept when the deal ended: a contract
		// that looks live is a cache behind that write; it is not judged
		// again.
		return true, nil
	}
	st := cc.Status.DeepCopy()
	st.ObservedGeneration = cc.Generation
	st.Records.Request, st.Records.Bid, st.Records.Accept = new(cc.Spec.Request), new(cc.Spec.Bid), new(cc.Spec.Accept)
	rs.State, rs.Contract = marketv1alpha1.RequestContracted, cc.Name
	rs.Record = &marketv1alpha1.PublishedRecord{URI: cc.Spec.Request.URI, CID: cc.Spec.Request.CID}
	rs.Accept = &marketv1alpha1.PublishedRecord{URI: cc.Spec.Accept.URI, CID: cc.Spec.Accept.CID}

	lease := s.leaseOf(cc.Spec.Accept.URI, cc.Spec.Accept.CID, cc.Spec.BidderDID)
	s.view.Refresh(cc.Spec.BidderDID)
	if lease != nil {
		st.Records.Lease = &marketv1alpha1.RecordRef{URI: lease.URI, CID: lease.CID}
	}
	leaseURI := ""
	if st.Records.Lease != nil {
		leaseURI = st.Records.Lease.URI
	}
	var release *ownRelease
	if leaseURI != "" {
		release = s.releaseOf(leaseURI)
	}
	if release != nil {
		st.Records.Release = &marketv1alpha1.RecordRef{URI: release.uri, CID: release.cid}
	}
	if leaseURI != "" {
		s.noteReclaim(rr, cc, st, leaseURI, lease)
	}

	// A lease counts as gone only once a listing of the bidder's repo
	// ended after it was found missing.
	var mountReason, mountMsg string
	leaseKey := "lease|" + cc.Spec.Accept.URI
	gone := lease == nil && s.r.absent.Gone(s.view, cc.Spec.BidderDID, leaseKey, s.now)
	if lease != nil {
		s.r.absent.Present(leaseKey)
	}
	// A mounted tenant that stops answering is given back after the
	// grace, and the replica goes back to the market.
	unresponsive := ""
	if wanted && release == nil && lease != nil && lease.Lease.State == deal.LeaseRunning && cc.Status.Phase == marketv1alpha1.ContractActive {
		tc := &computev1alpha1.TenantCluster{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Name: cc.Name}, tc); err == nil && tc.Status.Phase != computev1alpha1.PhaseReady {
			since := s.now
			if c := meta.FindStatusCondition(cc.Status.Conditions, marketv1alpha1.ConditionReady); c != nil && c.Reason == ReasonTenantUnresponsive {
				since = c.LastTransitionTime.Time
			}
			grace := time.Duration(cmp.Or(s.mr.Spec.UnresponsiveGraceSeconds, 300)) * time.Second
			if !s.now.Before(since.Add(grace)) {
				wanted, relReason = false, deal.ProviderUnresponsive
				s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "ProviderUnresponsive", "Release", "replica %d: the tenant of %s has not answered since %s; released", rr.index, cc.Name, market.Time(since))
			} else {
				unresponsive = "the tenant has not answered since " + market.Time(since) + "; it is released at " + market.Time(since.Add(grace)) + " unless it answers"
				s.due(since.Add(grace))
			}
		}
	}
	switch {
	case wanted && release == nil && unresponsive != "":
		st.Phase, mountMsg = marketv1alpha1.ContractActive, unresponsive
	case wanted && release == nil:
		switch {
		case gone:
			st.Phase, st.Reason = s.endedByBidder(cc, st, nil)
		case lease == nil:
			// not read yet: keep the phase
		case lease.Lease.State == deal.LeaseConfirmed:
			st.Phase = marketv1alpha1.ContractProvisioning
		case lease.Lease.State == deal.LeaseRunning:
			// Active only once the tenant is mounted.
			ready, reason, why, err := s.deliver(cc, lease)
			if err != nil {
				return false, err
			}
			st.Phase, mountReason, mountMsg = marketv1alpha1.ContractProvisioning, reason, why
			if ready {
				st.Phase = marketv1alpha1.ContractActive
			} else {
				s.due(s.now.Add(2 * time.Second))
			}
		case lease.Lease.State == deal.LeaseDeclined, lease.Lease.State == deal.LeaseCompleted:
			st.Phase, st.Reason = s.endedByBidder(cc, st, lease)
		}
		if st.Phase == "" {
			st.Phase = marketv1alpha1.ContractProvisioning
		}
	default:
		// Not wanted (or already released): the mount goes, and the VM
		// is given back.
		rs.State = marketv1alpha1.RequestReleasing
		if err := s.undeliver(cc); err != nil {
			return false, err
		}
		switch {
		case gone || (lease != nil && lease.Lease.State == deal.LeaseCompleted):
			if release != nil {
				st.Phase, st.Reason = marketv1alpha1.ContractCompleted, string(release.release.Reason)
			} else {
				st.Phase, st.Reason = s.endedByBidder(cc, st, lease)
			}
		case lease != nil && lease.Lease.State == deal.LeaseDeclined:
			st.Phase, st.Reason = s.endedByBidder(cc, st, lease)
		case lease == nil:
			st.Phase = marketv1alpha1.ContractReleasing
		case release == nil:
			// An export is asked for before the release, so that the
			// bidder's side finds it when it sees the release.
			if lease.Lease.State == deal.LeaseRunning && s.exportWanted(relReason) {
				ready, err := s.startExport(cc)
				if err != nil {
					return false, err
				}
				if !ready {
					st.Phase = marketv1alpha1.ContractReleasing
					s.due(s.now.Add(2 * time.Second))
					break
				}
			}
			rel := &market.Release{Type: lexicon.Release, Lease: lease.Ref(), Reason: relReason, CreatedAt: market.Time(s.now)}
			rec, err := s.inv.Put(s.ctx, lexicon.Release, market.ReleaseKey(s.owner, lease.URI), rel)
			if err != nil {
				return false, err
			}
			st.Records.Release = &marketv1alpha1.RecordRef{URI: rec.URI, CID: rec.CID}
			st.Phase, st.Reason = marketv1alpha1.ContractReleasing, string(relReason)
			s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Released", "Release", "replica %d: released %s (%s)", rr.index, cc.Name, relReason)
			s.due(s.now.Add(s.confirm()))
		default:
			// The bidder has as long to end the lease as it had to confirm
			// it (and as long as an export may take); after that the
			// contract is failed and the requester's records go.
			wait := s.confirm()
			if s.mr.Spec.StateSync.Mode == marketv1alpha1.StateSyncExport || s.deleting {
				if err := s.collectExport(cc); err != nil {
					return false, err
				}
				wait = max(wait, market.ExportWait+30*time.Second)
			}
			by := market.ParseTime(release.release.CreatedAt).Add(wait)
			if s.now.Before(by) {
				st.Phase, st.Reason = marketv1alpha1.ContractReleasing, string(release.release.Reason)
				s.due(by)
			} else {
				st.Phase, st.Reason = marketv1alpha1.ContractFailed, string(deal.BidderUnresponsive)
			}
		}
	}
	finished := !deal.LiveContract(&marketv1alpha1.ComputeContract{Status: *st})
	active := st.Phase == marketv1alpha1.ContractActive && cc.Status.Phase != marketv1alpha1.ContractActive
	if err := s.contractStatus(cc, st, mountReason, mountMsg, unresponsive != ""); err != nil {
		return false, err
	}
	if active {
		s.r.observeStep(market.StepLeaseActive, cc.CreationTimestamp.Time)
	}
	if !finished {
		rs.Message = fmt.Sprintf("ComputeContract %s is %s", cc.Name, st.Phase)
		if mountMsg != "" && st.Phase != marketv1alpha1.ContractActive {
			rs.Message += ": " + mountMsg
		}
		if st.Phase == marketv1alpha1.ContractReleasing || st.Phase == marketv1alpha1.ContractProvisioning {
			s.due(s.now.Add(30 * time.Second))
		}
		return false, nil
	}
	// Over: the mount and the requester's records of the deal go.
	errs := []error{s.undeliver(cc)}
	if release != nil {
		errs = append(errs, s.inv.Delete(s.ctx, lexicon.Release, release.rkey))
	}
	for _, req := range rr.attempts {
		if req.uri == cc.Spec.Request.URI {
			errs = append(errs, s.withdrawRequest(req, accepts[req.uri]))
		}
	}
	_, _, acceptKey := market.SplitURI(cc.Spec.Accept.URI)
	errs = append(errs, s.inv.Delete(s.ctx, lexicon.Accept, acceptKey))
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	rs.State, rs.Contract, rs.Accept, rs.Record = marketv1alpha1.RequestOpen, "", nil, nil
	rs.Message = fmt.Sprintf("ComputeContract %s ended: %s (%s)", cc.Name, st.Phase, st.Reason)
	return true, nil
}

// noticeSlack is how much earlier than the notice owed (counted from
// when the requester's side first saw the reclaim) a bidder may stop a
// reclaimed VM: the reclaim's way through the firehose, and clocks.
const noticeSlack = time.Minute

// noteReclaim reads the bidder's reclaim of the lease at leaseURI (read
// as lease, nil when it is not in the view) into st: only one in the
// bidder's repo counts. When the requester's side
// first sees it is kept (the notice owed is counted from then, by its own
// clock, also after a restart); a reclaim whose terminateAfter gives less
// than the contract's notice from then is ShortNotice.
func (s *session) noteReclaim(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, leaseURI string, lease *market.Rec) {
	var rec *market.Rec
	for _, r := range s.view.Children(leaseURI, lexicon.Reclaim) {
		if r.DID != cc.Spec.BidderDID || r.Reclaim == nil || market.ParseTime(r.Reclaim.TerminateAfter).IsZero() {
			s.ignored[r.URI+"|"+r.CID] = true
			continue
		}
		rec = r
	}
	if rec == nil {
		return
	}
	by := market.ParseTime(rec.Reclaim.TerminateAfter)
	// Seen is when the reclaim was first read, but never before the lease
	// it names was (a reclaim may be on the firehose before its lease);
	// kept from then on.
	first := st.Reclaim == nil
	seen := s.now
	switch {
	case !first:
		seen = st.Reclaim.Seen.Time
	case lease != nil:
		seen = rec.FirstSeen
		if lease.FirstSeen.After(seen) {
			seen = lease.FirstSeen
		}
		if seen.IsZero() {
			seen = s.now
		}
	}
	notice := time.Duration(cc.Spec.NoticeSeconds) * time.Second
	short := by.Before(seen.Add(notice - noticeSlack))
	st.Records.Reclaim = &marketv1alpha1.RecordRef{URI: rec.URI, CID: rec.CID}
	// Kept to the second, as status holds it (else every pass rewrites it).
	st.Reclaim = &marketv1alpha1.ContractReclaim{Reason: string(rec.Reclaim.Reason), TerminateAfter: *market.MetaTime(by), Seen: *market.MetaTime(seen), ShortNotice: short}
	if len(st.Reclaim.Reason) > 64 {
		st.Reclaim.Reason = st.Reclaim.Reason[:64]
	}
	if first {
		kind, why := corev1.EventTypeNormal, "buying the next VM meanwhile"
		if short {
			kind, why = corev1.EventTypeWarning, fmt.Sprintf("less than the %s of notice the request asked for", notice)
		}
		s.events.Eventf(s.mr, nil, kind, "Reclaimed", "Reclaim", "replica %d: bidder %s reclaims %s (%s) and stops it after %s: %s",
			rr.index, cc.Spec.BidderDID, cc.Name, knownReclaim(rec.Reclaim.Reason), market.Time(by), why)
	}
}

// knownReclaim is a reclaim's reason when it is one of the lexicon's known
// values (a bidder's free text is not repeated).
func knownReclaim(reason deal.ReclaimReason) string {
	if slices.Contains(deal.ReclaimReasons(), reason) {
		return string(reason)
	}
	return "other"
}

// endedByBidder judges a lease the bidder ended without a release:
// completed or declined (the bidder's reason), or gone (lease nil). Under
// a reclaim the requester's side was given, an end before the notice owed
// is Failed (reclaimed-early) whatever reason the bidder gives, a VM lost
// meanwhile included; a lease completed as reclaimed after it is
// Completed (reclaimed). Otherwise the contract failed.
func (s *session) endedByBidder(cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, lease *market.Rec) (marketv1alpha1.ContractPhase, string) {
	reason, at := deal.LeaseWithdrawn, s.now
	if lease != nil {
		reason, at = cmp.Or(deal.Of(lease.Lease.Reason), deal.EndedByBidder), cmp.Or(lease.FirstSeen, s.now)
		if lease.Lease.State == deal.LeaseDeclined {
			reason = cmp.Or(deal.Of(lease.Lease.Reason), deal.DeclinedNoReason)
		}
	}
	if st.Reclaim != nil {
		owed := st.Reclaim.Seen.Add(time.Duration(cc.Spec.NoticeSeconds) * time.Second)
		switch {
		case at.Before(owed.Add(-noticeSlack)):
			return marketv1alpha1.ContractFailed, string(deal.ReclaimedEarly)
		case lease != nil && lease.Lease.State == deal.LeaseCompleted && reason == deal.Of(deal.Reclaimed):
			return marketv1alpha1.ContractCompleted, string(deal.Reclaimed)
		}
	}
	return marketv1alpha1.ContractFailed, string(reason)
}

type ownRelease struct {
	uri, cid, rkey string
	release        *market.Release
}

// releaseOf returns the requester's release of a lease, if it made one.
func (s *session) releaseOf(leaseURI string) *ownRelease {
	rkey := market.ReleaseKey(s.owner, leaseURI)
	rec := s.inv.Get(lexicon.Release, rkey)
	if rec == nil {
		return nil
	}
	var rel market.Release
	if market.Decode(lexicon.Release, rec.Value, &rel) != nil {
		return nil
	}
	return &ownRelease{uri: rec.URI, cid: rec.CID, rkey: rkey, release: &rel}
}

// contractStatus writes a contract's status when it changed, with an
// Event when its phase did.
func (s *session) contractStatus(cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, mountReason, mount string, unresponsive bool) error {
	status, reason, msg := metav1.ConditionTrue, string(st.Phase), "the contract is "+string(st.Phase)
	switch st.Phase {
	case marketv1alpha1.ContractFailed:
		status, msg = metav1.ConditionFalse, "the contract failed: "+st.Reason
	case marketv1alpha1.ContractCompleted:
		status, msg = metav1.ConditionFalse, "the contract is over: "+st.Reason
	case marketv1alpha1.ContractProvisioning, marketv1alpha1.ContractPending:
		status, msg = metav1.ConditionFalse, "the bidder confirmed; the VM is not running yet"
		if mount != "" {
			msg = mount
		}
		reason = cmp.Or(mountReason, reason)
	case marketv1alpha1.ContractActive:
		msg = cmp.Or(mount, msg)
		switch {
		case unresponsive:
			status, reason = metav1.ConditionFalse, ReasonTenantUnresponsive
		case st.Reclaim != nil:
			reason = ReasonReclaimed
			msg = "the bidder reclaims the VM and stops it after " + market.Time(st.Reclaim.TerminateAfter.Time) + "; the next one is bought meanwhile"
		}
	case marketv1alpha1.ContractReleasing:
		status, msg = metav1.ConditionFalse, "released ("+st.Reason+"); waiting for the bidder to end the lease"
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: cc.Generation})
	err := ssa.WriteStatus(s.ctx, s.c, cc, &cc.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseChanged(cc.Status.Phase, st.Phase, marketv1alpha1.ContractFailed, "", msg),
		Recorder: s.events,
		Action:   "Reconcile",
	})
	if err == nil {
		cc.Status = *st
	}
	return err
}

// prune deletes what the requester no longer needs: Bids of requests it
// no longer holds beyond the newest keepSettledBids (unless a kept
// contract rests on them), and finished contracts beyond the newest
// keepFinished.
func (s *session) prune() error {
	current := map[string]bool{}
	for _, rec := range s.inv.List(lexicon.Request) {
		current[rec.URI] = true
	}
	var finished []*marketv1alpha1.ComputeContract
	kept := map[string]bool{}
	for _, cc := range s.contracts {
		if !deal.LiveContract(cc) {
			finished = append(finished, cc)
			continue
		}
		kept[cc.Spec.Bid.URI+"|"+cc.Spec.Bid.CID] = true
	}
	slices.SortFunc(finished, func(a, b *marketv1alpha1.ComputeContract) int {
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	var errs []error
	for i, cc := range finished {
		if i < keepFinished {
			kept[cc.Spec.Bid.URI+"|"+cc.Spec.Bid.CID] = true
			continue
		}
		errs = append(errs, deleteObject(s, cc))
		delete(s.contracts, cc.Name)
	}
	// Bids of requests the requester no longer holds are history: the
	// newest keepSettledBids stay.
	var settled []*marketv1alpha1.Bid
	for _, b := range s.bids {
		if !current[b.Spec.Request.URI] && !kept[b.Spec.Bid.URI+"|"+b.Spec.Bid.CID] {
			settled = append(settled, b)
		}
	}
	slices.SortFunc(settled, func(a, b *marketv1alpha1.Bid) int {
		return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	for i, b := range settled {
		if i < keepSettledBids {
			continue
		}
		errs = append(errs, deleteObject(s, b))
		delete(s.bids, b.Name)
	}
	return errors.Join(errs...)
}

func deleteObject(s *session, o client.Object) error {
	uid := o.GetUID()
	err := s.c.Delete(s.ctx, o, client.Preconditions{UID: &uid})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// retryWait is how long after the deadline of an empty round a replica
// asks again: the bid window, doubled with every attempt, at most
// maxRetry. An attempt below 1 (a status write that did not land) waits
// one window.
func retryWait(window int32, attempt int32) time.Duration {
	return min(time.Duration(window)*time.Second<<min(max(attempt-1, 0), 8), maxRetry)
}

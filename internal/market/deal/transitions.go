package deal

import (
	"fmt"
	"strings"
)

// TransitionID names one transition of a side's table.
type TransitionID string

// Transition is one row of a side's transition table: in state From,
// when On holds, the side makes the Writes and the deal is in To.
type Transition struct {
	ID     TransitionID
	From   string
	On     string
	Writes string
	To     string
}

// The bidder's transitions.
const (
	BidPlace            TransitionID = "bid.place"
	BidHold             TransitionID = "bid.hold"
	BidLost             TransitionID = "bid.lost"
	BidRequestEdited    TransitionID = "bid.request-edited"
	BidRequestWithdrawn TransitionID = "bid.request-withdrawn"
	BidExpired          TransitionID = "bid.expired"
	BidRecordGone       TransitionID = "bid.record-gone"
	AcceptConfirm       TransitionID = "accept.confirm"
	AcceptDecline       TransitionID = "accept.decline"
	LeaseProvision      TransitionID = "lease.provision"
	LeaseRun            TransitionID = "lease.running"
	LeaseVMLost         TransitionID = "lease.vm-lost"
	LeaseReclaim        TransitionID = "lease.reclaim"
	LeaseStopVM         TransitionID = "lease.stop-vm"
	LeaseComplete       TransitionID = "lease.complete"
	LeaseEnded          TransitionID = "lease.ended"
	LeaseSettle         TransitionID = "lease.settle"
	LeaseWait           TransitionID = "lease.wait"
)

// BidderTransitions is the bidder's side of the protocol, as
// DecideBidder takes it (docs/market.md shows it; a test checks that the
// two agree and that every row is taken by a test of DecideBidder).
func BidderTransitions() []Transition {
	return []Transition{
		{BidPlace, "request seen, no bid", "the requester is vouched for, the request is of the bidder's network, before its deadline (at most 10 min away), at a price and notice the bidder offers, an offer has free capacity and the requester holds fewer open bids than the cap", "bid record; Bid Open", "bid open"},
		{BidHold, "bid open", "no accept, the request unchanged, before validUntil (or the view is incomplete)", "Bid Open (capacity held)", "bid open"},
		{BidLost, "bid open", "another bid on the request was accepted and its bidder confirmed it", "bid deleted; Bid Lost", "bid over"},
		{BidRequestEdited, "bid open", "the request record now has another CID", "bid deleted; Bid Withdrawn", "bid over"},
		{BidRequestWithdrawn, "bid open", "the request is gone from the requester's repo (a listing that ended after it was found missing)", "bid deleted; Bid Withdrawn", "bid over"},
		{BidExpired, "bid open", "validUntil passed and the view is complete", "bid deleted; Bid Expired", "bid over"},
		{BidRecordGone, "Bid Open", "its bid record is gone from the bidder's repo", "Bid Withdrawn", "bid over"},
		{AcceptConfirm, "bid open", "the requester's accept (in its own repo, of this version of the bid and the request) came before confirmBy and validUntil, the bidder takes work and the offer has room", "lease confirmed; Bid Leased; ComputeContract Provisioning", "leased"},
		{AcceptDecline, "bid open", "an accept the bidder cannot take: suspended, expired, no-capacity", "lease declined (reason); Bid Declined", "lease over"},
		{LeaseProvision, "leased", "the VM is not running yet", "ComputeVM made; ComputeContract Provisioning (Active once running)", "leased"},
		{LeaseRun, "leased", "the VM runs and the lease does not say so (or names another CA, endpoint or service identity)", "lease running (caFingerprint, caBundle, endpoint, serviceId); ComputeContract Active", "running"},
		{LeaseVMLost, "leased", "the VM is Lost or Failed", "lease completed (vm-lost, driver-failed); ComputeContract Failed; ComputeVM deleted", "lease over"},
		{LeaseReclaim, "leased", "spec.reclaims names the contract and no reclaim is published", "reclaim record (terminateAfter = now + the request's notice)", "reclaiming"},
		{LeaseStopVM, "released, accept withdrawn, or reclaim notice over", "the VM still exists", "ComputeVM deleted; ComputeContract Releasing", "released"},
		{LeaseComplete, "released, accept withdrawn, or reclaim notice over", "the VM is gone", "lease completed (reclaimed when the notice ran out); ComputeContract Completed", "lease over"},
		{LeaseEnded, "lease over", "the ComputeContract is still live", "ComputeContract Completed (Failed when declined, or ended for vm-lost or driver-failed)", "lease over"},
		{LeaseSettle, "lease over", "the requester removed its accept (complete view), or 10 min passed", "reclaim, lease and bid deleted", "settled"},
		{LeaseWait, "lease over", "the requester's accept is still there", "nothing", "lease over"},
	}
}

// The requester's transitions (its buying rounds).
const (
	RequestWithdrawEarlier  TransitionID = "request.withdraw-earlier"
	RequestPublish          TransitionID = "request.publish"
	BidAcceptable           TransitionID = "bid.acceptable"
	BidOtherVersion         TransitionID = "bid.other-version"
	BidLate                 TransitionID = "bid.late"
	BidTooSmall             TransitionID = "bid.too-small"
	BidOverBudget           TransitionID = "bid.over-budget"
	BidNotAllowed           TransitionID = "bid.not-allowed"
	BidUnvouched            TransitionID = "bid.unvouched"
	BidJudgedExpired        TransitionID = "bid.judged-expired"
	BidOutcomeKept          TransitionID = "bid.outcome-kept"
	BidReclaiming           TransitionID = "bid.reclaiming"
	BidReclaimedEarly       TransitionID = "bid.reclaimed-early"
	BidAvoided              TransitionID = "bid.avoided"
	BidWithdrawnByBidder    TransitionID = "bid.withdrawn"
	RoundCollect            TransitionID = "round.collect"
	RoundReading            TransitionID = "round.reading"
	AcceptPublish           TransitionID = "accept.publish"
	RoundEmpty              TransitionID = "round.empty"
	RoundAgain              TransitionID = "round.again"
	AcceptWait              TransitionID = "accept.wait"
	AcceptDeclined          TransitionID = "accept.declined"
	AcceptBidWithdrawn      TransitionID = "accept.bid-withdrawn"
	AcceptUnanswered        TransitionID = "accept.unanswered"
	AcceptUnansweredReading TransitionID = "accept.unanswered-reading"
	ContractMake            TransitionID = "contract.make"
)

// RequesterTransitions is the requester's side of the protocol as
// DecideRequester takes it: a replica's buying round, from its request
// to the contract its lease makes (docs/market.md shows it; a test checks
// that the two agree and that every row is taken by a test of
// DecideRequester). What follows the contract (mount, release, reclaim)
// is ContractTransitions.
func RequesterTransitions() []Transition {
	return []Transition{
		{RequestWithdrawEarlier, "replica buying", "a request of an earlier attempt that no live contract rests on", "its accepts and the request deleted", "replica buying"},
		{RequestPublish, "replica buying, no request (or the newest one a live contract rests on)", "always", "request record (bidDeadline = now + the bid window); status.requests attempt + 1", "collecting bids"},
		{BidAcceptable, "collecting bids", "a bid on this version of the request, first seen by its deadline, of a VM at least as large, within budget, of an allowed and vouched bidder, before its validUntil", "Bid Open", "bid judged"},
		{BidOtherVersion, "collecting bids", "the bid names another CID of the request", "Bid Invalid", "bid judged"},
		{BidLate, "collecting bids", "the bid was first seen after the bid deadline", "Bid Late", "bid judged"},
		{BidTooSmall, "collecting bids", "the bid's shape is smaller than the request's", "Bid Invalid", "bid judged"},
		{BidOverBudget, "collecting bids", "another currency, or a price over spec.maxPricePerHour", "Bid OverBudget", "bid judged"},
		{BidNotAllowed, "collecting bids", "spec.policy.allowedBidders does not name the bidder", "Bid NotAllowed", "bid judged"},
		{BidUnvouched, "collecting bids", "neither the network's operator nor the requester's identity vouches for the bidder", "Bid Unvouched", "bid judged"},
		{BidJudgedExpired, "collecting bids", "the bid's validUntil is missing or passed", "Bid Expired", "bid judged"},
		{BidOutcomeKept, "collecting bids", "the Bid was Declined, Void or Lost before", "the Bid keeps its state", "bid judged"},
		{BidReclaiming, "collecting bids", "the bidder reclaims a live contract of this requester", "Bid NotAllowed", "bid judged"},
		{BidReclaimedEarly, "collecting bids", "the bidder stopped a reclaimed VM of this requester before its notice ran out (until 10 min after it would have)", "Bid NotAllowed", "bid judged"},
		{BidAvoided, "collecting bids", "the bidder declined or did not answer an accept of this requester less than 10 min ago", "Bid Declined or Void", "bid judged"},
		{BidWithdrawnByBidder, "Bid Open", "its bid record is gone from the view or changed", "Bid Withdrawn", "bid over"},
		{RoundCollect, "collecting bids", "before the bid deadline", "Bids (the best spec.maxBidsPerRequest)", "collecting bids"},
		{RoundReading, "collecting bids", "the deadline passed and the view is incomplete", "Bids", "collecting bids"},
		{AcceptPublish, "collecting bids", "the deadline passed, the view is complete and a bid is acceptable", "accept record of the cheapest (then first seen) acceptable bid (confirmBy = now + spec.confirmSeconds); then the Bids, it Accepted", "accepted"},
		{RoundEmpty, "collecting bids", "the deadline passed with no acceptable bid, before the retry wait (the window, doubled per attempt, at most 5 min) ran out", "Bids; status.requests nextAttempt", "collecting bids"},
		{RoundAgain, "collecting bids", "no acceptable bid and the retry wait ran out, or the Bid of an accepted bidder of this request is Declined or Void (its accept gone)", "the request deleted; a new request (request.publish)", "collecting bids"},
		{AcceptWait, "accepted", "no lease answers the accept, before confirmBy", "Bid Accepted", "accepted"},
		{AcceptDeclined, "accepted", "the bidder's lease (in its repo, answering this CID of the accept) declined", "Bid Declined (the bidder avoided); once the Bid says so, the accept deleted (another bid in a later pass, never two accepts open)", "collecting bids"},
		{AcceptBidWithdrawn, "accepted", "the accepted bid is gone from the bidder's repo (a listing that ended after it was found missing)", "Bid Void; once the Bid says so, the accept deleted", "collecting bids"},
		{AcceptUnanswered, "accepted", "confirmBy passed with no lease and the view is complete", "Bid Void (the bidder avoided); once the Bid says so, the accept deleted", "collecting bids"},
		{AcceptUnansweredReading, "accepted", "confirmBy passed with no lease and the view is incomplete", "nothing (look again in 1 s)", "accepted"},
		{ContractMake, "accepted", "the bidder's lease (in its repo, answering this CID of the accept) is confirmed or running", "ComputeContract (spec from the request, the accept and the bid); Bid Leased, the others Lost", "contracted"},
	}
}

// Markdown renders a transition table as a Markdown table.
func Markdown(table []Transition) string {
	var b strings.Builder
	b.WriteString("| transition | from | on | writes | to |\n|---|---|---|---|---|\n")
	for _, t := range table {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", t.ID, t.From, t.On, t.Writes, t.To)
	}
	return b.String()
}

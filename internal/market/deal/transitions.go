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
	LeaseExport         TransitionID = "lease.export"
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
		{LeaseRun, "leased", "the VM runs and the lease does not say so (or names another CA)", "lease running (caFingerprint); ComputeContract Active", "running"},
		{LeaseVMLost, "leased", "the VM is Lost or Failed", "lease completed (vm-lost, driver-failed); ComputeContract Failed; ComputeVM deleted", "lease over"},
		{LeaseReclaim, "leased", "spec.reclaims names the contract and no reclaim is published", "reclaim record (terminateAfter = now + the request's notice)", "reclaiming"},
		{LeaseExport, "released", "the requester's side exports the tenant (a StateSync export, neither failed nor older than ExportWait)", "ComputeContract Releasing", "released"},
		{LeaseStopVM, "released, accept withdrawn, or reclaim notice over", "the VM still exists", "ComputeVM deleted; ComputeContract Releasing", "released"},
		{LeaseComplete, "released, accept withdrawn, or reclaim notice over", "the VM is gone", "lease completed (reclaimed when the notice ran out); ComputeContract Completed", "lease over"},
		{LeaseEnded, "lease over", "the ComputeContract is still live", "ComputeContract Completed (Failed when declined)", "lease over"},
		{LeaseSettle, "lease over", "the requester removed its accept (complete view), or 10 min passed", "reclaim, lease and bid deleted", "settled"},
		{LeaseWait, "lease over", "the requester's accept is still there", "nothing", "lease over"},
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

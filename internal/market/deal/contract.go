package deal

import (
	"cmp"
	"time"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market"
)

// The requester's transitions of a contract, from the lease that made it
// to its end.
const (
	ContractWaitLease           TransitionID = "contract.wait-lease"
	ContractProvisioning        TransitionID = "contract.provisioning"
	ContractMount               TransitionID = "contract.mount"
	ContractTenantUnresponsive  TransitionID = "contract.tenant-unresponsive"
	ContractTenantGivenUp       TransitionID = "contract.tenant-given-up"
	ContractEndedByBidder       TransitionID = "contract.ended-by-bidder"
	ContractReleaseWaitLease    TransitionID = "contract.release-wait-lease"
	ContractExport              TransitionID = "contract.export"
	ContractRelease             TransitionID = "contract.release"
	ContractAwaitEnd            TransitionID = "contract.await-end"
	ContractBidderUnresponsive  TransitionID = "contract.bidder-unresponsive"
	ContractReleasedAndComplete TransitionID = "contract.completed"
	ContractOver                TransitionID = "contract.over"
)

// ContractTransitions is the requester's side of a contract as
// DecideContract takes it (docs/market.md shows it; a test checks that
// the two agree and that every row is taken by a test of
// DecideContract). "wanted" is the replica still wanting the contract;
// "released" is the requester's release record of its lease. A contract
// whose accept is gone from the requester's repo is not judged at all:
// the requester deleted the accept when the deal ended, and the contract
// is a cache behind that write.
func ContractTransitions() []Transition {
	return []Transition{
		{ContractWaitLease, "wanted, not released", "the lease is not in the view yet (or in a state this side does not know)", "ComputeContract keeps its phase (Provisioning when new)", "contracted"},
		{ContractProvisioning, "wanted, not released", "the lease is confirmed", "ComputeContract Provisioning", "contracted"},
		{ContractMount, "wanted, not released", "the lease runs and the tenant answers (or is not mounted yet)", "TenantCluster and its Secret (the VM's own, its CA pinned by the lease); ComputeContract Provisioning, Active once mounted", "contracted"},
		{ContractTenantUnresponsive, "Active, wanted, not released", "the lease runs, the mounted tenant does not answer, within spec.unresponsiveGraceSeconds of when it first did not", "ComputeContract Active, Ready False (TenantUnresponsive)", "contracted"},
		{ContractTenantGivenUp, "Active, wanted, not released", "the tenant has not answered for spec.unresponsiveGraceSeconds", "Event ProviderUnresponsive; the contract is no longer wanted (provider-unresponsive, no export)", "not wanted"},
		{ContractEndedByBidder, "contracted", "the lease is declined, completed without the requester's release, or gone (a listing that ended after it was found missing)", "ComputeContract Failed (the lease's reason; reclaimed-early when before the reclaim notice owed), Completed (reclaimed) when completed as reclaimed after it", "over"},
		{ContractReleaseWaitLease, "not wanted, not released", "the lease is not in the view", "mount deleted; ComputeContract Releasing", "not wanted"},
		{ContractExport, "not wanted, not released", "the lease runs and spec.stateSync.mode is Export (not when deleting, not provider-unresponsive)", "mount deleted; the requester's side exports the tenant with its own identity into a snapshot in its workspace; the release waits until it is kept, or the export failed (then an Event)", "not wanted"},
		{ContractRelease, "not wanted, not released", "the lease is in the view (its export, if one is wanted, kept or failed)", "mount deleted; release record (the reason); ComputeContract Releasing; look again after spec.confirmSeconds", "released"},
		{ContractAwaitEnd, "released", "the lease is not ended, before the release's createdAt + spec.confirmSeconds", "ComputeContract Releasing", "released"},
		{ContractBidderUnresponsive, "released", "the lease is not ended by then", "ComputeContract Failed (bidder-unresponsive)", "over"},
		{ContractReleasedAndComplete, "released", "the lease is completed or gone", "ComputeContract Completed (the release's reason)", "over"},
		{ContractOver, "over", "the ComputeContract is Completed or Failed", "mount deleted; the requester's release, request and accept deleted; status.requests back to Open", "settled"},
	}
}

// NoticeSlack is how much earlier than the notice owed (counted from
// when the requester's side first saw the reclaim) a bidder may stop a
// reclaimed VM: the reclaim's way through the firehose, and clocks.
const NoticeSlack = time.Minute

// ContractFacts is what the requester's side knows of one of its
// contracts when it judges it: the records, and what its own objects
// say.
type ContractFacts struct {
	// Phase is the contract's phase now.
	Phase marketv1alpha1.ContractPhase
	// Wanted: the replica still wants the contract; ReleaseReason says
	// why when it does not.
	Wanted        bool
	ReleaseReason ReleaseReason
	// Lease is the bidder's lease (nil when it is not in the view);
	// LeaseGone that it was missing from a listing of the bidder's repo
	// that ended after it was found missing.
	Lease     *market.Rec
	LeaseGone bool
	// Release is the requester's release of the lease (nil: none).
	Release *market.Release
	// Reclaim is the bidder's reclaim notice as the contract's status
	// keeps it (nil: none), Notice what the request asked for.
	Reclaim *marketv1alpha1.ContractReclaim
	Notice  time.Duration
	// TenantAnswers: the mounted tenant answers (or is not mounted);
	// UnresponsiveSince is when the contract first said it did not (zero:
	// it has not said so), Grace how long it may not answer.
	TenantAnswers     bool
	UnresponsiveSince time.Time
	Grace             time.Duration
	// Confirm is how long the bidder has to end a released lease (as
	// long as it had to confirm it). Exported: the request wants the
	// tenant's state exported before the release (not while the
	// requester is deleted).
	Confirm  time.Duration
	Exported bool
}

// ContractDecision is what DecideContract decides for one contract: the
// transitions taken, the phase and reason to write, what the controller
// does (each flag one step of it), and when to look again.
type ContractDecision struct {
	Transitions []TransitionID
	// Phase and Reason are the contract's (Phase "": keep it).
	Phase  marketv1alpha1.ContractPhase
	Reason string
	// Mount: deliver the tenant (Active once it is mounted). Unmount:
	// the mount goes.
	Mount, Unmount bool
	// Unresponsive is the message while the tenant does not answer
	// within the grace; Since when it first did not.
	Unresponsive string
	Since        time.Time
	// Export: export the tenant before the release, which is published
	// only once the snapshot is kept (or the export failed). Publish:
	// publish the release with ReleaseReason.
	Export, Publish bool
	ReleaseReason   ReleaseReason
	// Over: the deal is over; the requester's records of it go.
	Over bool
	// Due is when to look again (zero: on the next event).
	Due time.Time
}

func (d *ContractDecision) take(id TransitionID) { d.Transitions = append(d.Transitions, id) }

func (d *ContractDecision) due(at time.Time) { d.Due = earliest(d.Due, at) }

// DecideContract judges one contract of the requester: from the bidder's
// lease while the replica wants it, through the requester's release when
// it no longer does, to the end of the deal. No I/O: the controller loads
// f and carries the decision out.
func DecideContract(f ContractFacts, now time.Time) ContractDecision {
	var d ContractDecision
	wanted, reason := f.Wanted, f.ReleaseReason
	if wanted && f.Release == nil && f.tenantSilent() {
		since := cmp.Or(f.UnresponsiveSince, now)
		by := since.Add(f.Grace)
		if now.Before(by) {
			d.take(ContractTenantUnresponsive)
			d.Phase, d.Since = marketv1alpha1.ContractActive, since
			d.Unresponsive = "the tenant has not answered since " + market.Time(since) + "; it is released at " + market.Time(by) + " unless it answers"
			d.due(by)
			return d
		}
		d.take(ContractTenantGivenUp)
		d.Since = since
		wanted, reason = false, ProviderUnresponsive
	}
	if wanted && f.Release == nil {
		f.follow(&d, now)
	} else {
		d.Unmount = true
		f.release(&d, reason, now)
	}
	switch d.Phase {
	case marketv1alpha1.ContractCompleted, marketv1alpha1.ContractFailed:
		d.take(ContractOver)
		d.Over = true
	case marketv1alpha1.ContractReleasing, marketv1alpha1.ContractProvisioning:
		// A mount says for itself when to look again: it is Active once
		// the tenant is mounted.
		if !d.Mount {
			d.due(now.Add(30 * time.Second))
		}
	}
	return d
}

// tenantSilent: the contract is Active on a running lease and its mounted
// tenant does not answer.
func (f *ContractFacts) tenantSilent() bool {
	return f.Lease != nil && f.Lease.Lease.State == LeaseRunning && f.Phase == marketv1alpha1.ContractActive && !f.TenantAnswers
}

// follow judges a wanted contract the requester has not released, from
// the bidder's lease.
func (f *ContractFacts) follow(d *ContractDecision, now time.Time) {
	switch {
	case f.LeaseGone:
		d.take(ContractEndedByBidder)
		d.Phase, d.Reason = f.endedByBidder(nil, now)
	case f.Lease == nil:
		d.take(ContractWaitLease)
	case f.Lease.Lease.State == LeaseConfirmed:
		d.take(ContractProvisioning)
		d.Phase = marketv1alpha1.ContractProvisioning
	case f.Lease.Lease.State == LeaseRunning:
		d.take(ContractMount)
		d.Phase, d.Mount = marketv1alpha1.ContractProvisioning, true
	case f.Lease.Lease.State == LeaseDeclined, f.Lease.Lease.State == LeaseCompleted:
		d.take(ContractEndedByBidder)
		d.Phase, d.Reason = f.endedByBidder(f.Lease, now)
	default:
		d.take(ContractWaitLease)
	}
	if d.Phase == "" {
		d.Phase = cmp.Or(f.Phase, marketv1alpha1.ContractProvisioning)
	}
}

// release judges a contract the replica no longer wants (for reason) or
// the requester already released.
func (f *ContractFacts) release(d *ContractDecision, reason ReleaseReason, now time.Time) {
	lease := f.Lease
	switch {
	case f.LeaseGone || (lease != nil && lease.Lease.State == LeaseCompleted):
		if f.Release != nil {
			d.take(ContractReleasedAndComplete)
			d.Phase, d.Reason = marketv1alpha1.ContractCompleted, string(f.Release.Reason)
		} else {
			d.take(ContractEndedByBidder)
			d.Phase, d.Reason = f.endedByBidder(lease, now)
		}
	case lease != nil && lease.Lease.State == LeaseDeclined:
		d.take(ContractEndedByBidder)
		d.Phase, d.Reason = f.endedByBidder(lease, now)
	case lease == nil:
		d.take(ContractReleaseWaitLease)
		d.Phase = marketv1alpha1.ContractReleasing
	case f.Release == nil:
		if lease.Lease.State == LeaseRunning && f.Exported && reason != ProviderUnresponsive {
			d.take(ContractExport)
			d.Export = true
		}
		d.take(ContractRelease)
		d.Publish, d.ReleaseReason = true, reason
		d.Phase, d.Reason = marketv1alpha1.ContractReleasing, string(reason)
		d.due(now.Add(f.Confirm))
	default:
		by := market.ParseTime(f.Release.CreatedAt).Add(f.Confirm)
		if now.Before(by) {
			d.take(ContractAwaitEnd)
			d.Phase, d.Reason = marketv1alpha1.ContractReleasing, string(f.Release.Reason)
			d.due(by)
		} else {
			d.take(ContractBidderUnresponsive)
			d.Phase, d.Reason = marketv1alpha1.ContractFailed, string(BidderUnresponsive)
		}
	}
}

// endedByBidder judges a lease the bidder ended without a release:
// completed or declined (the bidder's reason), or gone (lease nil). Under
// a reclaim the requester's side was given, an end before the notice owed
// is Failed (reclaimed-early) whatever reason the bidder gives, a VM lost
// meanwhile included; a lease completed as reclaimed after it is
// Completed (reclaimed). Otherwise the contract failed.
func (f *ContractFacts) endedByBidder(lease *market.Rec, now time.Time) (marketv1alpha1.ContractPhase, string) {
	reason, at := LeaseWithdrawn, now
	if lease != nil {
		reason, at = cmp.Or(Of(lease.Lease.Reason), EndedByBidder), cmp.Or(lease.FirstSeen, now)
		if lease.Lease.State == LeaseDeclined {
			reason = cmp.Or(Of(lease.Lease.Reason), DeclinedNoReason)
		}
	}
	if f.Reclaim != nil {
		owed := f.Reclaim.Seen.Add(f.Notice)
		switch {
		case at.Before(owed.Add(-NoticeSlack)):
			return marketv1alpha1.ContractFailed, string(ReclaimedEarly)
		case lease != nil && lease.Lease.State == LeaseCompleted && reason == Of(Reclaimed):
			return marketv1alpha1.ContractCompleted, string(Reclaimed)
		}
	}
	return marketv1alpha1.ContractFailed, string(reason)
}

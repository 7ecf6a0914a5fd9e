// Package deal is the market's protocol as a pure package: the
// vocabulary of its records (typed, declared once here next to the
// lexicons' knownValues, which a test checks both ways), the transitions
// each side makes (one table per side, as data, that docs/market.md is
// checked against) and, per side, a decision function from what the
// records and the kcp objects say to the writes to make. It does no I/O.
package deal

import (
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market"
)

// LeaseState is a lease record's state (lease.json, state).
type LeaseState = market.LeaseState

// Lease states.
const (
	// LeaseConfirmed: the bidder takes the VM.
	LeaseConfirmed LeaseState = "confirmed"
	// LeaseDeclined: it does not (the reason says why).
	LeaseDeclined LeaseState = "declined"
	// LeaseRunning: the VM runs.
	LeaseRunning LeaseState = "running"
	// LeaseCompleted: the bidder ended the lease.
	LeaseCompleted LeaseState = "completed"
)

// LeaseStates are the lease states, as lease.json knows them.
func LeaseStates() []LeaseState {
	return []LeaseState{LeaseConfirmed, LeaseDeclined, LeaseRunning, LeaseCompleted}
}

// Live reports whether a lease in state s holds a VM.
func Live(s LeaseState) bool { return s == LeaseConfirmed || s == LeaseRunning }

// LeaseReason is why a bidder declined an accept or ended a lease that
// was not released (lease.json, reason).
type LeaseReason = market.LeaseReason

// Lease reasons: the bidder's.
const (
	// NoCapacity: the offer the bid was made from is full.
	NoCapacity LeaseReason = "no-capacity"
	// Expired: the accept came after its confirmBy or the bid's
	// validUntil.
	Expired LeaseReason = "expired"
	// Suspended: the bidder takes no new work.
	Suspended LeaseReason = "suspended"
	// Invalid: the accept is not one the bidder can answer.
	Invalid LeaseReason = "invalid"
	// DriverFailed: the VM could not be run.
	DriverFailed LeaseReason = "driver-failed"
	// VMLost: the VM ran and is gone.
	VMLost LeaseReason = "vm-lost"
	// Reclaimed: the bidder took the VM back once its notice ran out.
	Reclaimed LeaseReason = "reclaimed"
)

// LeaseReasons are the lease reasons, as lease.json knows them.
func LeaseReasons() []LeaseReason {
	return []LeaseReason{NoCapacity, Expired, Suspended, Invalid, DriverFailed, VMLost, Reclaimed}
}

// ReleaseReason is why a requester releases a VM (release.json, reason).
type ReleaseReason = market.ReleaseReason

// Release reasons: the requester's.
const (
	// ReplicasLowered: the replica is no longer wanted.
	ReplicasLowered ReleaseReason = "replicas-lowered"
	// RequesterDeleted: the MarketRequester is being deleted.
	RequesterDeleted ReleaseReason = "requester-deleted"
	// ReleaseSuspended: the requester is suspended.
	ReleaseSuspended ReleaseReason = "suspended"
	// ContractFailed: the contract failed.
	ContractFailed ReleaseReason = "contract-failed"
	// ReleaseExpired: the contract ran out.
	ReleaseExpired ReleaseReason = "expired"
	// ProviderUnresponsive: the tenant did not answer for the
	// requester's grace.
	ProviderUnresponsive ReleaseReason = "provider-unresponsive"
	// ReleaseReclaimed: the bidder reclaimed the VM and the requester's
	// next one runs.
	ReleaseReclaimed ReleaseReason = "reclaimed"
)

// ReleaseReasons are the release reasons, as release.json knows them.
func ReleaseReasons() []ReleaseReason {
	return []ReleaseReason{ReplicasLowered, RequesterDeleted, ReleaseSuspended, ContractFailed, ReleaseExpired, ProviderUnresponsive, ReleaseReclaimed}
}

// ReclaimReason is why a bidder takes a leased VM back (reclaim.json,
// reason): the API's type, whose enum is the same list.
type ReclaimReason = marketv1alpha1.ReclaimReason

// Reclaim reasons.
const (
	ReclaimMaintenance   = marketv1alpha1.ReclaimMaintenance
	ReclaimCapacity      = marketv1alpha1.ReclaimCapacity
	ReclaimBidderLeaving = marketv1alpha1.ReclaimBidderLeaving
)

// ReclaimReasons are the reclaim reasons, as reclaim.json knows them.
func ReclaimReasons() []ReclaimReason {
	return []ReclaimReason{ReclaimMaintenance, ReclaimCapacity, ReclaimBidderLeaving}
}

// Phase is a ComputeContract's phase (the API's type).
type Phase = marketv1alpha1.ContractPhase

// State is a Bid's state (the API's type).
type State = marketv1alpha1.BidState

// ContractReason is a ComputeContract's status.reason: a record's reason
// (a lease's or a release's), or one of these, which no record carries.
type ContractReason string

// Contract reasons no record carries.
const (
	// AcceptWithdrawn: the requester withdrew the accept of a live lease
	// (the bidder's side).
	AcceptWithdrawn ContractReason = "accept-withdrawn"
	// ReclaimedEarly: the bidder ended a reclaimed lease before the
	// notice it owed (the requester's side).
	ReclaimedEarly ContractReason = "reclaimed-early"
	// BidderUnresponsive: the bidder did not end a released lease in time
	// (the requester's side).
	BidderUnresponsive ContractReason = "bidder-unresponsive"
	// LeaseWithdrawn: the bidder's lease record is gone (the requester's
	// side).
	LeaseWithdrawn ContractReason = "lease-withdrawn"
	// EndedByBidder: the bidder ended the lease and gave no reason.
	EndedByBidder ContractReason = "ended-by-bidder"
	// DeclinedNoReason: the bidder declined and gave no reason.
	DeclinedNoReason ContractReason = "declined"
)

// Of is the contract reason a record's reason gives.
func Of[R LeaseReason | ReleaseReason | ReclaimReason](r R) ContractReason { return ContractReason(r) }

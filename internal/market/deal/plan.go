package deal

import (
	"time"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market"
)

// View is what a decision reads of the other side's records: a
// follower's view of its network (market.Reader), read only. Asking for
// a repo to be listed again is part of the Plan.
type View interface {
	Complete() error
	Get(uri string) *market.Rec
	Children(uri, collection string) []*market.Rec
	Requests() []*market.Rec
	Vouches(voucher, subject, role string) bool
	Listed(did string) time.Time
}

// Missing is what the controller remembers between passes of the
// records found missing from the view (market.Absences): since when key
// was found missing, if it was.
type Missing interface {
	Since(key string) (time.Time, bool)
}

// Plan is what a decision asks for, in order: record writes first (those
// of one repo go in one applyWrites commit), then the kcp writes whose
// record write succeeded (Needs), one status per object.
type Plan struct {
	// Records are the record writes and deletions.
	Records []RecordOp
	// Bids are the Bid objects to make and their status, by name.
	Bids map[string]*BidOp
	// Contracts are the ComputeContracts to make and their status, by
	// name.
	Contracts map[string]*ContractOp
	// VMs are the ComputeVMs to make or delete.
	VMs []VMOp
	// Deletes are finished objects to delete.
	Deletes []Delete
	// Events are the Events to record.
	Events []Event
	// Look is what to list again and what to remember as missing.
	Look Look
	// Requeue is when to look again (zero: the resync).
	Requeue time.Time
	// Steps are the transitions taken, in order (tests and logs).
	Steps []Step
	// Requests are the requester's status.requests entries of the
	// replicas it buys for, by index order.
	Requests []RequestOp
	// Counts are the bidder's capacity counts once the plan is done.
	Counts Counts
	// Ignored are the forged or stale records found (URI|CID).
	Ignored map[string]bool
}

// Step is one transition taken about one record.
type Step struct {
	Transition TransitionID
	// Subject is the at-URI of the record it is about.
	Subject string
}

// RecordOp makes the record Collection/RKey of the participant's repo
// equal Value (nil: absent). Then runs after it succeeded (a reclaim is
// deleted before its lease). Undo is applied to the counts when it fails.
type RecordOp struct {
	Collection, RKey string
	Value            any
	Then             *RecordOp
	Undo             Undo
	// MarketStep is the market step the write ends (market.Steps(); ""
	// for none), begun at Since: the executor observes it once the write
	// succeeded (knotless_market_step_seconds).
	MarketStep string
	Since      time.Time
}

// Undo is what a failed record write gives back: the capacity a
// decision counted that the record would take or free.
type Undo struct {
	Offer          int
	Used, Reserved int32
}

// None is a Needs that needs no record write.
const None = -1

// BidOp makes the Bid object Name (when Create is set) and sets its
// status. Needs is the index of the record write it follows (None): its
// result's CID goes into the refs that name its URI.
type BidOp struct {
	Name   string
	Create *marketv1alpha1.BidSpec
	Status marketv1alpha1.BidStatus
	Needs  int
}

// ContractOp makes the ComputeContract Name (when Create is set) and
// writes Status (when it differs from the object's). Needs is as for
// BidOp.
type ContractOp struct {
	Name   string
	Create *marketv1alpha1.ComputeContractSpec
	Status marketv1alpha1.ComputeContractStatus
	Needs  int
}

// VMOp makes the ComputeVM Name of the contract of the same name
// (Create) or deletes it (Delete).
type VMOp struct {
	Name   string
	Create *computev1alpha1.ComputeVMSpec
	Delete *computev1alpha1.ComputeVM
	Needs  int
}

// Delete is a finished Bid or ComputeContract to delete.
type Delete struct {
	Bid      *marketv1alpha1.Bid
	Contract *marketv1alpha1.ComputeContract
}

// Event is an Event about the participant (Contract "") or one of its
// contracts.
type Event struct {
	Contract                   string
	Type, Reason, Action, Note string
	Needs                      int
}

// Look says which repos to list again: List at once (a record was found
// missing: its absence is proved by a listing that ends after now),
// Refresh when due; Note are keys found missing now, Forget keys found
// present again or proved gone.
type Look struct {
	List, Refresh []string
	Note, Forget  []string
}

// Counts are a bidder's capacity counts, per offer: VMs leased (Used) and
// held by open bids (Reserved); Unknown counts live leases whose offer is
// not known (they count against every offer).
type Counts struct {
	Used, Reserved []int32
	Unknown        int32
}

func (p *Plan) record(op RecordOp) int {
	p.Records = append(p.Records, op)
	return len(p.Records) - 1
}

func (p *Plan) step(id TransitionID, subject string) {
	p.Steps = append(p.Steps, Step{Transition: id, Subject: subject})
}

func (p *Plan) due(at time.Time) { p.Requeue = earliest(p.Requeue, at) }

// earliest is the earlier of two times to look again, zero being none.
func earliest(cur, at time.Time) time.Time {
	if !at.IsZero() && (cur.IsZero() || at.Before(cur)) {
		return at
	}
	return cur
}

func (p *Plan) event(contract, typ, reason, action, note string, needs int) {
	p.Events = append(p.Events, Event{Contract: contract, Type: typ, Reason: reason, Action: action, Note: note, Needs: needs})
}

// Transitions returns the transitions the plan took, in order.
func (p *Plan) Transitions() []TransitionID {
	out := make([]TransitionID, len(p.Steps))
	for i, s := range p.Steps {
		out[i] = s.Transition
	}
	return out
}

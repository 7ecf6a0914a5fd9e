/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Side says which party of the market an object belongs to.
// +kubebuilder:validation:Enum=Requester;Bidder
type Side string

// Sides.
const (
	SideRequester Side = "Requester"
	SideBidder    Side = "Bidder"
)

// RecordRef is a strong reference to a record: its at-URI and the CID of
// the version meant.
type RecordRef struct {
	// URI is the record's at-URI.
	// +kubebuilder:validation:MaxLength=8192
	URI string `json:"uri"`
	// CID of the version meant.
	// +kubebuilder:validation:MaxLength=256
	CID string `json:"cid"`
}

// BidSpec records a bid record as one side saw it. It is set once, by the
// controller that owns the Bid, and never changes.
type BidSpec struct {
	// Side is whose view this is: the requester's (owned by its
	// MarketRequester) or the bidder's (owned by its MarketBidder).
	Side Side `json:"side"`
	// Request is the request record the bid answers.
	Request RecordRef `json:"request"`
	// Bid is the bid record.
	Bid RecordRef `json:"bid"`
	// RequesterDID is the author of the request.
	RequesterDID string `json:"requesterDID"`
	// BidderDID is the author of the bid.
	BidderDID string `json:"bidderDID"`
	// ReplicaIndex is the requester's replica the request is for.
	// +optional
	ReplicaIndex int32 `json:"replicaIndex,omitempty"`
	// PricePerHour the bidder asks.
	PricePerHour Price `json:"pricePerHour"`
	// Shape the bidder offers (at least the request's).
	// +optional
	Shape *Shape `json:"shape,omitempty"`
	// ValidUntil is when the bid expires, as the bid record says.
	// +optional
	ValidUntil *metav1.Time `json:"validUntil,omitempty"`
	// FirstSeen is when the requester first saw this version of the bid,
	// by its own clock: a bid first seen after the request's deadline is
	// late, whatever its createdAt says. Unset on the bidder's side.
	// +optional
	FirstSeen *metav1.MicroTime `json:"firstSeen,omitempty"`
}

// BidState is what became of a bid.
// +kubebuilder:validation:Enum=Open;Accepted;Leased;Lost;Late;Expired;OverBudget;Unvouched;NotAllowed;Invalid;Declined;Void;Withdrawn
type BidState string

// Bid states.
const (
	// BidOpen: the bid may still be accepted.
	BidOpen BidState = "Open"
	// BidAccepted: the requester accepted it; the bidder has not answered.
	BidAccepted BidState = "Accepted"
	// BidLeased: the bidder confirmed; a contract exists.
	BidLeased BidState = "Leased"
	// BidLost: another bid was accepted.
	BidLost BidState = "Lost"
	// BidLate: first seen after the bid window closed (by the reader's
	// clock).
	BidLate BidState = "Late"
	// BidExpired: its validUntil passed before it could be accepted.
	BidExpired BidState = "Expired"
	// BidOverBudget: above the requester's maximum price or in another
	// currency.
	BidOverBudget BidState = "OverBudget"
	// BidUnvouched: neither the requester's identity nor the network's
	// operator vouches for the bidder.
	BidUnvouched BidState = "Unvouched"
	// BidNotAllowed: the bidder is not in the requester's allowed list.
	BidNotAllowed BidState = "NotAllowed"
	// BidInvalid: the bid refers to another version of the request.
	BidInvalid BidState = "Invalid"
	// BidDeclined: the bidder declined the accept (its lease says why).
	BidDeclined BidState = "Declined"
	// BidVoid: the bidder did not answer the accept by its confirmBy.
	BidVoid BidState = "Void"
	// BidWithdrawn: the request it answered was edited, released or
	// deleted; the bid record was removed.
	BidWithdrawn BidState = "Withdrawn"
)

// BidStatus is written only by the controller that owns the Bid, in the
// same apply as the Bid's spec.
type BidStatus struct {
	// State of the bid.
	// +optional
	State BidState `json:"state,omitempty"`
	// Message explains the state.
	// +optional
	Message string `json:"message,omitempty"`
	// Conditions: Ready, True once the bid is Leased (the deal it offered
	// was made), otherwise False with the state as its reason, so that
	// kubectl wait --for=condition=Ready works on Bids as on every kind.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Bid is one bid record of the market as one side sees it. The requester
// keeps one per bid it saw (owned by its MarketRequester); the bidder
// keeps one per bid it made (owned by its MarketBidder). The two sides'
// Bids are different objects with different writers.
//
// A Bid has no status subresource: only its side's controller writes it,
// and it writes the whole object (spec once, with the state it has) in
// one apply, so that a bid costs one write when it is seen and one each
// time its state changes (docs/market.md, What bounds the market's
// speed).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=knotless;market
// +kubebuilder:printcolumn:name="Side",type=string,JSONPath=`.spec.side`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Price",type=integer,JSONPath=`.spec.pricePerHour.amount`
// +kubebuilder:printcolumn:name="Bidder",type=string,JSONPath=`.spec.bidderDID`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Bid struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a Bid records what was seen and never changes"
	Spec   BidSpec   `json:"spec"`
	Status BidStatus `json:"status,omitempty"`
}

// BidList is a list of Bids.
//
// +kubebuilder:object:root=true
type BidList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Bid `json:"items"`
}

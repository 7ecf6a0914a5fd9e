/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Price is an amount per hour: an integer (no floats in ATProto records)
// in a currency or unit the market agrees on, e.g. 25 "USD-cents".
type Price struct {
	// Amount per hour.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	Amount int64 `json:"amount"`
	// Currency or unit of Amount.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9._-]*$`
	Currency string `json:"currency"`
}

// Offer is one VM shape a bidder sells.
type Offer struct {
	// Name of the shape, e.g. "small".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// CPUMillis is the shape's CPU in thousandths of a core.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024000
	CPUMillis int64 `json:"cpuMillis"`
	// MemoryMiB is the shape's memory.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777216
	MemoryMiB int64 `json:"memoryMiB"`
	// Capacity is how many VMs of this shape the bidder runs at once.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Capacity int32 `json:"capacity"`
	// PricePerHour of one VM of this shape.
	PricePerHour Price `json:"pricePerHour"`
}

// Driver is how a bidder runs VMs.
// +kubebuilder:validation:Enum=process;kind
type Driver string

// Drivers.
const (
	// DriverProcess runs each VM as a tenant apiserver process next to
	// the bidder's agent.
	DriverProcess Driver = "process"
	// DriverKind runs each VM as a single-node Kubernetes cluster (kind,
	// in a docker container held to the shape) next to the bidder's
	// agent: tenants run pods.
	DriverKind Driver = "kind"
)

// ReclaimReason is why a bidder takes a leased VM back (the reclaim
// record's reason).
// +kubebuilder:validation:Enum=maintenance;capacity;bidder-leaving
type ReclaimReason string

// Reclaim reasons.
const (
	ReclaimMaintenance   ReclaimReason = "maintenance"
	ReclaimCapacity      ReclaimReason = "capacity"
	ReclaimBidderLeaving ReclaimReason = "bidder-leaving"
)

// Reclaim names a contract the bidder takes back after notice.
type Reclaim struct {
	// Contract is the name of one of the bidder's ComputeContracts in
	// this namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Contract string `json:"contract"`
	// Reason is published in the reclaim record.
	// +kubebuilder:default=maintenance
	// +optional
	Reason ReclaimReason `json:"reason,omitempty"`
}

// MarketBidderSpec is written only by the user.
type MarketBidderSpec struct {
	// IdentityRef is the MarketIdentity (same namespace) the bidder
	// publishes as.
	IdentityRef LocalRef `json:"identityRef"`
	// NetworkRef is the MarketNetwork (same workspace) the bidder sells in.
	NetworkRef ClusterRef `json:"networkRef"`
	// Offers are the shapes the bidder sells.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	Offers []Offer `json:"offers"`
	// Driver runs the bidder's VMs.
	// +kubebuilder:default=process
	// +optional
	Driver Driver `json:"driver,omitempty"`
	// Suspend stops the bidder from taking new requests: its presence says
	// so, it makes no new bids and declines accepts. What it already runs
	// is still served and released.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// BidValiditySeconds is how long after a request's bid deadline the
	// bidder's bid stays valid (its validUntil): the time the requester
	// has to accept it. The bid's capacity is reserved until then.
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=60
	// +optional
	BidValiditySeconds int32 `json:"bidValiditySeconds,omitempty"`
	// MaxOpenBidsPerRequester caps the open bids (each holding capacity)
	// on the requests of one requester DID, so that one requester cannot
	// hold all of the bidder's capacity with requests it never accepts.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=10
	// +optional
	MaxOpenBidsPerRequester int32 `json:"maxOpenBidsPerRequester,omitempty"`
	// MaxNoticeSeconds is the most notice the bidder promises before it
	// takes a VM back: it does not bid on requests that ask for more.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2592000
	// +kubebuilder:default=86400
	// +optional
	MaxNoticeSeconds *int32 `json:"maxNoticeSeconds,omitempty"`
	// Reclaims are live contracts the bidder takes back. For each, it
	// publishes a reclaim record whose terminateAfter is the notice the
	// request asked for (the contract's spec.noticeSeconds) away, keeps
	// the VM running until then, then stops it and ends the lease
	// (reason reclaimed). A published reclaim stands: removing its entry
	// does not call it off. Entries naming contracts that are not live are
	// ignored.
	// +kubebuilder:validation:MaxItems=1000
	// +listType=map
	// +listMapKey=contract
	// +optional
	Reclaims []Reclaim `json:"reclaims,omitempty"`
}

// MarketBidderStatus is written only by the marketbidder controller.
type MarketBidderStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the bidder.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// DID the bidder publishes as.
	// +optional
	DID string `json:"did,omitempty"`
	// PresenceURI is the at-URI of the bidder's presence record, once
	// published.
	// +optional
	PresenceURI string `json:"presenceURI,omitempty"`
	// OpenBids is how many of the bidder's bids may still be accepted
	// (each holds capacity).
	// +optional
	OpenBids int32 `json:"openBids"`
	// Leased is how many VMs the bidder has confirmed leases for.
	// +optional
	Leased int32 `json:"leased"`
	// IgnoredRecords counts the records concerning this bidder that it
	// ignored as forged or inconsistent (an accept in a repo that is not
	// the requester's, one that names another version of the bid), as
	// the network's records stand now.
	// +optional
	IgnoredRecords int64 `json:"ignoredRecords"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MarketBidder sells compute in a market: the shapes, prices and driver
// it offers, published as its presence.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=mbidder
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="DID",type=string,JSONPath=`.status.did`
// +kubebuilder:printcolumn:name="Suspend",type=boolean,JSONPath=`.spec.suspend`
// +kubebuilder:printcolumn:name="Bids",type=integer,JSONPath=`.status.openBids`
// +kubebuilder:printcolumn:name="Leased",type=integer,JSONPath=`.status.leased`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MarketBidder struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MarketBidderSpec   `json:"spec"`
	Status MarketBidderStatus `json:"status,omitempty"`
}

// MarketBidderList is a list of MarketBidders.
//
// +kubebuilder:object:root=true
type MarketBidderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MarketBidder `json:"items"`
}

/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ContractPhase is where a ComputeContract stands.
// +kubebuilder:validation:Enum=Pending;Provisioning;Active;Releasing;Completed;Failed
type ContractPhase string

// Contract phases.
const (
	// ContractPending: the bidder took the accept and has not published
	// its lease yet.
	ContractPending ContractPhase = "Pending"
	// ContractProvisioning: the lease is confirmed; the VM is being made.
	ContractProvisioning ContractPhase = "Provisioning"
	// ContractActive: the VM runs.
	ContractActive ContractPhase = "Active"
	// ContractReleasing: the requester released the VM; the bidder has
	// not finished.
	ContractReleasing ContractPhase = "Releasing"
	// ContractCompleted: released and finished on both sides.
	ContractCompleted ContractPhase = "Completed"
	// ContractFailed: the contract ended without a release (status.reason
	// says why).
	ContractFailed ContractPhase = "Failed"
)

// The TenantAccess condition of a requester's contract: whether the
// MarketRequester's spec.tenantAccess is applied into the tenant.
const (
	ConditionTenantAccess  = "TenantAccess"
	ReasonAccessApplied    = "Applied"
	ReasonAccessNotApplied = "NotApplied"
)

// ComputeContractSpec is the agreement, set once by the controller that
// owns the contract and never changed.
type ComputeContractSpec struct {
	// Side is whose contract this is: the requester's (owned by its
	// MarketRequester) or the bidder's (owned by its MarketBidder).
	Side Side `json:"side"`
	// RequesterDID is the requester's repo.
	RequesterDID string `json:"requesterDID"`
	// BidderDID is the bidder's repo.
	BidderDID string `json:"bidderDID"`
	// ReplicaIndex is the requester's replica the VM is for.
	// +optional
	ReplicaIndex int32 `json:"replicaIndex,omitempty"`
	// Shape of the VM.
	Shape Shape `json:"shape"`
	// PricePerHour agreed.
	PricePerHour Price `json:"pricePerHour"`
	// NoticeSeconds the bidder gives before taking the VM back.
	// +optional
	NoticeSeconds int32 `json:"noticeSeconds,omitempty"`
	// Request, Bid and Accept are the records the contract rests on.
	Request RecordRef `json:"request"`
	Bid     RecordRef `json:"bid"`
	Accept  RecordRef `json:"accept"`
}

// ContractRecords are the records of a contract's chain as last read.
type ContractRecords struct {
	// Request is the requester's request record.
	// +optional
	Request *RecordRef `json:"request,omitempty"`
	// Bid is the bidder's bid record.
	// +optional
	Bid *RecordRef `json:"bid,omitempty"`
	// Accept is the requester's accept record.
	// +optional
	Accept *RecordRef `json:"accept,omitempty"`
	// Lease is the bidder's lease record (its current version).
	// +optional
	Lease *RecordRef `json:"lease,omitempty"`
	// Release is the requester's release record, once published.
	// +optional
	Release *RecordRef `json:"release,omitempty"`
	// Reclaim is the bidder's reclaim record, once published.
	// +optional
	Reclaim *RecordRef `json:"reclaim,omitempty"`
}

// ContractReclaim is the bidder's notice that it takes the VM back, as
// this side judged it.
type ContractReclaim struct {
	// Reason is the reclaim record's reason.
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// TerminateAfter is when the bidder stops the VM (the record's
	// terminateAfter).
	TerminateAfter metav1.Time `json:"terminateAfter"`
	// Seen is when this side first knew of the reclaim, by its own clock
	// (the bidder's side: when it published it). The notice owed is
	// counted from it.
	Seen metav1.Time `json:"seen"`
	// ShortNotice is set when terminateAfter gives less notice, counted
	// from Seen, than spec.noticeSeconds.
	// +optional
	ShortNotice bool `json:"shortNotice,omitempty"`
}

// ComputeContractStatus is written only by the controller that owns the
// contract.
type ComputeContractStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase of the contract.
	// +optional
	Phase ContractPhase `json:"phase,omitempty"`
	// Reason is the reason code of a release or a failure, as the records
	// carry it (for example replicas-lowered or no-capacity).
	// +optional
	Reason string `json:"reason,omitempty"`
	// Records are the URIs and CIDs of every record of the contract's
	// chain: the evidence both sides hold.
	// +optional
	Records ContractRecords `json:"records,omitempty"`
	// AccessApplied names the tenant access (the MarketRequester's
	// spec.tenantAccess) last applied into the tenant, as a hash: the
	// requester's side applies it again when it differs. Requester side
	// only.
	// +optional
	AccessApplied string `json:"accessApplied,omitempty"`
	// Reclaim is set once the bidder gave notice that it takes the VM
	// back.
	// +optional
	Reclaim *ContractReclaim `json:"reclaim,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ComputeContract is an agreed lease of one VM, held by each side: the
// requester's (owned by its MarketRequester) and the bidder's (owned by
// its MarketBidder) are different objects, each written by its own
// controller from the records of the other side.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=cc
// +kubebuilder:printcolumn:name="Side",type=string,JSONPath=`.spec.side`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Price",type=integer,JSONPath=`.spec.pricePerHour.amount`
// +kubebuilder:printcolumn:name="Bidder",type=string,JSONPath=`.spec.bidderDID`
// +kubebuilder:printcolumn:name="Requester",type=string,JSONPath=`.spec.requesterDID`,priority=1
// +kubebuilder:printcolumn:name="Reclaimed-By",type=string,JSONPath=`.status.reclaim.terminateAfter`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ComputeContract struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a ComputeContract's agreement never changes"
	Spec   ComputeContractSpec   `json:"spec"`
	Status ComputeContractStatus `json:"status,omitempty"`
}

// ComputeContractList is a list of ComputeContracts.
//
// +kubebuilder:object:root=true
type ComputeContractList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ComputeContract `json:"items"`
}

/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Role is what a participant does in a market.
// +kubebuilder:validation:Enum=bidder;requester;operator
type Role string

// Roles.
const (
	RoleBidder    Role = "bidder"
	RoleRequester Role = "requester"
	RoleOperator  Role = "operator"
)

// Association is a participant this identity vouches for.
type Association struct {
	// DID of the participant.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`
	DID string `json:"did"`
	// Roles the participant is vouched for.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=3
	// +listType=set
	Roles []Role `json:"roles"`
}

// MarketIdentitySpec is written only by the user.
type MarketIdentitySpec struct {
	// RepoRef is the AtprotoRepo (same namespace) whose account is this
	// participant: its DID is the participant's, and its records are
	// published there.
	RepoRef LocalRef `json:"repoRef"`
	// NetworkRef is the MarketNetwork (same workspace) this identity takes
	// part in.
	NetworkRef ClusterRef `json:"networkRef"`
	// ApprovedAssociations are the participants this identity vouches
	// for, each published as one dev.knotless.market.association record
	// (rkey: the participant's DID). Records of DIDs no longer listed are
	// deleted.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=did
	ApprovedAssociations []Association `json:"approvedAssociations,omitempty"`
}

// Voucher is an association record of the network's operator that names
// this identity, as read from the network's firehoses.
type Voucher struct {
	// DID of the voucher (the network's operator).
	DID string `json:"did"`
	// Roles it vouches this identity for.
	// +listType=set
	Roles []Role `json:"roles"`
	// URI of the association record.
	URI string `json:"uri"`
	// CID of the association record.
	CID string `json:"cid"`
}

// MarketIdentityStatus is written only by the marketidentity controller.
// Everything in it is rebuilt from spec and from records after a restart
// (seed defect D21). Its lists have no omitempty: the controller writes
// status with a merge patch, where an empty list must be sent to clear it.
type MarketIdentityStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the identity.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// DID of the identity, from its AtprotoRepo.
	// +optional
	DID string `json:"did,omitempty"`
	// Associations are the published association records, read back.
	// +optional
	// +listType=map
	// +listMapKey=uri
	Associations []PublishedRecord `json:"associations"`
	// VouchedBy lists the operator's association records that name this
	// identity.
	// +optional
	// +listType=map
	// +listMapKey=uri
	VouchedBy []Voucher `json:"vouchedBy"`
	// InvalidRecords counts market records read from the firehoses for
	// this identity that did not match their lexicon and were ignored.
	// +optional
	InvalidRecords int64 `json:"invalidRecords"`
	// Conditions: Ready, Published, Vouched.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MarketIdentity is a participant of a market: a DID (of an AtprotoRepo)
// and the participants it vouches for.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=mid
// +kubebuilder:printcolumn:name="DID",type=string,JSONPath=`.status.did`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Vouched",type=string,JSONPath=`.status.conditions[?(@.type=="Vouched")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MarketIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MarketIdentitySpec   `json:"spec"`
	Status MarketIdentityStatus `json:"status,omitempty"`
}

// MarketIdentityList is a list of MarketIdentities.
//
// +kubebuilder:object:root=true
type MarketIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MarketIdentity `json:"items"`
}

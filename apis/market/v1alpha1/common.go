/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

// Phase is the one-word summary of a market object's state.
// +kubebuilder:validation:Enum=Pending;Ready;Suspended;Failed;Deleting
type Phase string

// Phases of market objects.
const (
	// PhasePending: a reference or the PDS is not ready yet; it resolves
	// without a spec change.
	PhasePending Phase = "Pending"
	// PhaseReady: everything the object describes holds.
	PhaseReady Phase = "Ready"
	// PhaseSuspended: the bidder takes no new requests (what it runs is
	// still served and released).
	PhaseSuspended Phase = "Suspended"
	// PhaseFailed: the spec cannot work as written; it needs an edit.
	PhaseFailed Phase = "Failed"
	// PhaseDeleting: the object's records are being removed from its PDS.
	PhaseDeleting Phase = "Deleting"
)

// Condition types and reasons of market objects.
const (
	// ConditionReady summarises the object.
	ConditionReady = "Ready"
	// ConditionPublished: the object's records on the PDS equal its spec
	// (read back after every write).
	ConditionPublished = "Published"
	// ConditionVouched: an association record of the network's operator
	// names this identity.
	ConditionVouched = "Vouched"

	ReasonReady         = "Ready"
	ReasonPublished     = "Published"
	ReasonInvalidSpec   = "InvalidSpec"
	ReasonNotFound      = "NotFound"
	ReasonNotReady      = "NotReady"
	ReasonInvalidRecord = "InvalidRecord"
	ReasonSuspended     = "Suspended"
	ReasonVouched       = "Vouched"
	ReasonNotVouched    = "NotVouched"
	ReasonNoOperator    = "NoOperator"
	ReasonConnecting    = "Connecting"
	// ReasonSourceUnreachable: a firehose of the network, or the
	// operator's PDS, could not be read.
	ReasonSourceUnreachable = "SourceUnreachable"
	// ReasonAddressNotAllowed: the operator's address policy refuses a
	// firehose of the network or the operator's PDS.
	ReasonAddressNotAllowed = "AddressNotAllowed"
	// ReasonListingTooLarge: a listing of a firehose of the network, or of
	// the operator's PDS, passed the provider's listing limits; it is
	// tried again later.
	ReasonListingTooLarge = "ListingTooLarge"
	// ReasonPDSNotInNetwork: the identity's repo is on a PDS the network
	// does not list in spec.pdsHosts.
	ReasonPDSNotInNetwork = "PDSNotInNetwork"
)

// LocalRef names an object of a known kind in the same namespace of the
// same workspace. References never cross namespaces or workspaces.
type LocalRef struct {
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// ClusterRef names a cluster-scoped object of the same workspace.
type ClusterRef struct {
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// PublishedRecord is a record as its PDS reported it after the last write
// or read-back.
type PublishedRecord struct {
	// URI is the record's at-URI.
	URI string `json:"uri"`
	// CID of the record's current version.
	CID string `json:"cid"`
	// Rev of the repo commit that wrote it; empty when knotless found the
	// record already equal and wrote nothing.
	// +optional
	Rev string `json:"rev,omitempty"`
}

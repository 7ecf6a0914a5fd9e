/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
)

// Shape is the size of one VM.
type Shape struct {
	// Name of the shape, e.g. "small"; bidders match offers by CPU and
	// memory, not by name.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$`
	// +optional
	Name string `json:"name,omitempty"`
	// CPUMillis is the VM's CPU in thousandths of a core.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024000
	CPUMillis int64 `json:"cpuMillis"`
	// MemoryMiB is the VM's memory.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777216
	MemoryMiB int64 `json:"memoryMiB"`
}

// SelectionPolicy says which bids a requester may accept.
type SelectionPolicy struct {
	// AllowedBidders, if not empty, are the only bidder DIDs whose bids
	// may be accepted (they must still be vouched for).
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]+$`
	// +kubebuilder:validation:items:MaxLength=2048
	// +optional
	AllowedBidders []string `json:"allowedBidders,omitempty"`
}

// AccessRole is what a DID may do on a tenant.
// +kubebuilder:validation:Enum=view;edit;admin
type AccessRole string

// Access roles.
const (
	// AccessView: read every resource.
	AccessView AccessRole = "view"
	// AccessEdit: read and write every resource (not impersonate, bind
	// or escalate).
	AccessEdit AccessRole = "edit"
	// AccessAdmin: everything.
	AccessAdmin AccessRole = "admin"
)

// TenantAccess gives a DID a role on the requester's tenants.
type TenantAccess struct {
	// DID is the ATProto identity.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^did:(plc|web):[a-zA-Z0-9._:%-]+$`
	DID string `json:"did"`
	// Role on the tenant.
	Role AccessRole `json:"role"`
}

// MarketRequesterSpec is written only by the user (or, as a Component
// template, by the component controller).
type MarketRequesterSpec struct {
	// IdentityRef is the MarketIdentity (same namespace) the requester
	// publishes as.
	IdentityRef LocalRef `json:"identityRef"`
	// NetworkRef is the MarketNetwork (same workspace) the requester buys
	// in.
	NetworkRef ClusterRef `json:"networkRef"`
	// Shape of each VM.
	Shape Shape `json:"shape"`
	// Replicas is how many VMs the requester wants. Lowering it releases
	// the contracts of the highest replica indexes.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=1
	// +optional
	Replicas int32 `json:"replicas"`
	// MaxPricePerHour is the most the requester pays for one VM; bids
	// above it, or in another currency, are never accepted.
	MaxPricePerHour Price `json:"maxPricePerHour"`
	// BidWindowSeconds is how long a request collects bids before the
	// requester accepts one. Bids first seen after the window are late.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=10
	// +optional
	BidWindowSeconds int32 `json:"bidWindowSeconds,omitempty"`
	// ConfirmSeconds is how long the winning bidder has to answer an
	// accept with a lease record; later, the accept is void and the next
	// bid is taken.
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=300
	// +optional
	ConfirmSeconds int32 `json:"confirmSeconds,omitempty"`
	// NoticeSeconds is the notice a bidder must give before it takes a
	// running VM back.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2592000
	// +kubebuilder:default=3600
	// +optional
	NoticeSeconds int32 `json:"noticeSeconds,omitempty"`
	// MaxBidsPerRequest caps the bids kept per request (the lowest
	// prices are kept).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=20
	// +optional
	MaxBidsPerRequest int32 `json:"maxBidsPerRequest,omitempty"`
	// Policy says which bids may be accepted: always only bids of bidders
	// the requester's identity or the network's operator vouches for
	// (association records with the bidder role); of those, the lowest
	// price wins.
	// +optional
	Policy SelectionPolicy `json:"policy,omitempty"`
	// Suspend stops the requester from making new requests; what it holds
	// is released.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// UnresponsiveGraceSeconds is how long a mounted tenant may not answer
	// (the TenantCluster's probe) before its VM is released as
	// provider-unresponsive and another is bought.
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=300
	// +optional
	UnresponsiveGraceSeconds int32 `json:"unresponsiveGraceSeconds,omitempty"`
	// TenantAdmins are the kcp users and groups that administer the
	// tenants the requester gets (each is mounted into this workspace as
	// a TenantCluster; requests reach the tenant as the kcp user who made
	// them). The requester's side binds them (no system: name) on each
	// tenant with its own identity; they never reach the bidder.
	// +optional
	TenantAdmins computev1alpha1.TenantAdmins `json:"tenantAdmins,omitempty"`
	// TenantAccess are ATProto identities given a role on the tenants the
	// requester gets: the requester's side applies them into each tenant
	// as RBAC, reaching the tenant with its own identity (a service-auth
	// token from its PDS); a DID reaches the tenant with a token from its
	// own PDS (kubectl knotless). The requester's DID is every tenant's
	// admin.
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=did
	// +optional
	TenantAccess []TenantAccess `json:"tenantAccess,omitempty"`
	// StateSync says what becomes of a tenant's objects when its contract
	// is released.
	// +optional
	StateSync StateSyncPolicy `json:"stateSync,omitempty"`
	// RestoreFrom names a snapshot of this requester (the name of the
	// contract whose tenant was exported; its chunks are the Secrets
	// labelled market.knotless.dev/snapshot=<name>): every new contract's
	// tenant gets the snapshot's objects before the contract is Active.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
	// +optional
	RestoreFrom string `json:"restoreFrom,omitempty"`
}

// StateSyncMode says whether a released tenant is exported.
// +kubebuilder:validation:Enum=None;Export
type StateSyncMode string

// State sync modes.
const (
	StateSyncNone   StateSyncMode = "None"
	StateSyncExport StateSyncMode = "Export"
)

// StateSyncPolicy says what is exported of a tenant when the requester
// releases it.
type StateSyncPolicy struct {
	// Mode: Export exports the tenant's namespaces and Resources before
	// its VM is terminated on a release by the requester (lower replicas
	// or suspend; not when the MarketRequester is deleted, nor when the
	// tenant did not answer). The snapshot is kept in this workspace as
	// Secrets owned by the MarketRequester.
	// +kubebuilder:default=None
	// +optional
	Mode StateSyncMode `json:"mode,omitempty"`
	// Resources are the kinds exported besides namespaces (Secrets only
	// when listed). Objects that a controller owns (ownerReferences),
	// service account tokens and the kube-root-ca.crt ConfigMaps are
	// never exported.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Resources []computev1alpha1.GroupResource `json:"resources,omitempty"`
}

// RequestState is where one replica's request stands.
// +kubebuilder:validation:Enum=Open;Accepted;Contracted;Releasing
type RequestState string

// Request states.
const (
	// RequestOpen: the request collects bids, or waits to ask again after
	// a round without an acceptable bid.
	RequestOpen RequestState = "Open"
	// RequestAccepted: a bid was accepted; the bidder has not answered.
	RequestAccepted RequestState = "Accepted"
	// RequestContracted: the bidder confirmed; a ComputeContract exists.
	RequestContracted RequestState = "Contracted"
	// RequestReleasing: the replica is no longer wanted; its contract is
	// being released.
	RequestReleasing RequestState = "Releasing"
)

// RequestStatus is one replica's request as the requester sees it.
type RequestStatus struct {
	// Index of the replica.
	Index int32 `json:"index"`
	// Attempt counts the requests made for this replica (from 1); a new
	// attempt replaces a request that found no acceptable bid or whose
	// bidder declined.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// Record is the request record.
	// +optional
	Record *PublishedRecord `json:"record,omitempty"`
	// BidDeadline is when the request stops collecting bids.
	// +optional
	BidDeadline *metav1.Time `json:"bidDeadline,omitempty"`
	// State of the request.
	State RequestState `json:"state"`
	// Bids is how many bids were seen for the current request.
	// +optional
	Bids int32 `json:"bids,omitempty"`
	// Acceptable is how many of them could be accepted.
	// +optional
	Acceptable int32 `json:"acceptable,omitempty"`
	// Accept is the accept record of the bid taken.
	// +optional
	Accept *PublishedRecord `json:"accept,omitempty"`
	// ConfirmBy is when the accepted bidder must have answered.
	// +optional
	ConfirmBy *metav1.Time `json:"confirmBy,omitempty"`
	// NextAttempt is when a request without an acceptable bid is made
	// again (the wait doubles with every empty round, up to 5 minutes).
	// +optional
	NextAttempt *metav1.Time `json:"nextAttempt,omitempty"`
	// Contract is the name of the replica's ComputeContract.
	// +optional
	Contract string `json:"contract,omitempty"`
	// Message says what the request waits for.
	// +optional
	Message string `json:"message,omitempty"`
}

// MarketRequesterStatus is written only by the marketrequester
// controller.
type MarketRequesterStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the requester: Ready when every replica has a
	// contract.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// DID the requester publishes as.
	// +optional
	DID string `json:"did,omitempty"`
	// Contracted is how many replicas have a live contract.
	// +optional
	Contracted int32 `json:"contracted"`
	// Requests, one per replica index that has one.
	// +optional
	// +listType=map
	// +listMapKey=index
	Requests []RequestStatus `json:"requests"`
	// IgnoredRecords counts records read for this requester that were
	// ignored as forged or inconsistent (an accept or lease in the wrong
	// repo, a reference to another CID).
	// +optional
	IgnoredRecords int64 `json:"ignoredRecords"`
	// Conditions: Ready (every replica has a contract), Suspended.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition reasons of a MarketRequester's Ready condition (besides the
// market's common ones).
const (
	// ReasonContracted: every replica has a live contract.
	ReasonContracted = "Contracted"
	// ReasonBidding: a request collects bids until its deadline.
	ReasonBidding = "Bidding"
	// ReasonNoBids: a request found no acceptable bid; it is made again
	// later.
	ReasonNoBids = "NoBids"
	// ReasonAccepting: a bid was accepted; the bidder has not answered.
	ReasonAccepting = "Accepting"
	// ReasonProvisioning: contracts exist; a VM is not running yet.
	ReasonProvisioning = "Provisioning"
	// ReasonReleasing: contracts are being released.
	ReasonReleasing = "Releasing"
	// ReasonReadingMarket: the network's firehoses are being read; no
	// decision is taken on an incomplete view.
	ReasonReadingMarket = "ReadingMarket"
)

// MarketRequester buys VMs in a market: it publishes one request record
// per VM it still needs, accepts the cheapest vouched bid after the bid
// window, and holds a ComputeContract per VM leased.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=mreq
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Contracted",type=integer,JSONPath=`.status.contracted`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MarketRequester struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MarketRequesterSpec   `json:"spec"`
	Status MarketRequesterStatus `json:"status,omitempty"`
}

// SuspendRequested implements suspend.Requester.
func (m *MarketRequester) SuspendRequested() bool { return m.Spec.Suspend }

// MarketRequesterList is a list of MarketRequesters.
//
// +kubebuilder:object:root=true
type MarketRequesterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MarketRequester `json:"items"`
}

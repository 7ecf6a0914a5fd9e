/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Conditions and reasons of a Gateway.
const (
	// ConditionPublished: the association record of the hostname is in
	// the requester's repo as the spec says.
	ConditionPublished = "Published"
	// ConditionReady: a request for the hostname through the bidder's
	// gateway reached a ready endpoint of the Service.
	ConditionReady = "Ready"

	// ReasonPublished: the association record is in the repo.
	ReasonPublished = "Published"
	// ReasonServing: a request through the gateway was answered by the
	// Service.
	ReasonServing = "Serving"
	// ReasonContractNotFound: the contract is not a requester's contract
	// of this namespace.
	ReasonContractNotFound = "ContractNotFound"
	// ReasonContractNotActive: the contract is not Active (not yet, or it
	// ended): no record is published.
	ReasonContractNotActive = "ContractNotActive"
	// ReasonTenantNotReady: the contract's tenant is not mounted yet.
	ReasonTenantNotReady = "TenantNotReady"
	// ReasonNoGateway: the bidder's lease names no gateway: its agent
	// serves none.
	ReasonNoGateway = "NoGateway"
	// ReasonIdentityNotReady: the requester's MarketIdentity or its repo
	// is not Ready, so nothing can be published.
	ReasonIdentityNotReady = "IdentityNotReady"
	// ReasonHostnameTaken: another Gateway of this workspace claims the
	// hostname (the older one keeps it).
	ReasonHostnameTaken = "HostnameTaken"
	// ReasonPublishFailed: the requester's PDS did not take the record.
	ReasonPublishFailed = "PublishFailed"
	// ReasonGatewayUnreachable: the bidder's gateway did not answer.
	ReasonGatewayUnreachable = "GatewayUnreachable"
	// ReasonWaiting: the gateway answered but does not serve the
	// hostname yet (it has not read the record, or refused it).
	ReasonWaiting = "Waiting"
	// ReasonDeleting: the record is being deleted.
	ReasonDeleting = "Deleting"
)

// Upstream refusals of the bidder's gateway, reported as the Ready
// reason: the gateway serves the hostname but could not reach a ready
// endpoint of the Service.
const (
	ReasonServiceNotFound   = "ServiceNotFound"
	ReasonPortNotFound      = "PortNotFound"
	ReasonNoReadyEndpoint   = "NoReadyEndpoint"
	ReasonTenantUnreachable = "TenantUnreachable"
	ReasonUpstreamFailed    = "UpstreamUnreachable"
)

// ContractRef names a ComputeContract of the Gateway's namespace.
type ContractRef struct {
	// Name of the ComputeContract (the requester's side).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ServiceRef is a Service of the tenant and one of its ports.
type ServiceRef struct {
	// Namespace of the Service in the tenant.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`
	// Name of the Service.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Port is the Service's port (spec.ports[].port, not the target
	// port).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// GatewaySpec is the hostname wanted and where it goes.
type GatewaySpec struct {
	// ContractRef is the requester's contract whose tenant runs the
	// Service. It cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="contractRef cannot change"
	ContractRef ContractRef `json:"contractRef"`
	// Service is where the hostname goes.
	Service ServiceRef `json:"service"`
	// Hostname is the DNS name served: lowercase, without a port or a
	// trailing dot. The bidder serves it only if its gateway's
	// certificate covers it. It cannot change (it is the record's key).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="hostname cannot change"
	Hostname string `json:"hostname"`
}

// RecordRef is a record's at-URI and the CID of the version meant.
type RecordRef struct {
	// URI is the record's at-URI.
	URI string `json:"uri"`
	// CID of the version meant.
	CID string `json:"cid"`
}

// GatewayStatus is what was published and whether it is served.
type GatewayStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// URL is where the Service is reached: https://<hostname>/ (with the
	// gateway's port when it is not 443).
	// +optional
	URL string `json:"url,omitempty"`
	// Address is the bidder's gateway (host:port, from its lease): the
	// hostname's DNS records must lead there.
	// +optional
	Address string `json:"address,omitempty"`
	// Association is the association record published in the
	// requester's repo.
	// +optional
	Association *RecordRef `json:"association,omitempty"`
	// Conditions: Published, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Gateway serves a Service of the requester's tenant on a public
// hostname. knotless publishes in the requester's repo an association
// record of the hostname (dev.knotless.gateway.association: the public
// proof that the hostname belongs to the requester's DID); the agent of
// the bidder running the tenant reads it and serves the hostname on its
// gateway (TLS, HTTP/1.1 and HTTP/2, upgrades), forwarding to the
// Service's ready endpoints, and answers /.well-known/atproto-did with
// the requester's DID.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;gateway,shortName=kgw
// +kubebuilder:printcolumn:name="Hostname",type=string,JSONPath=`.spec.hostname`
// +kubebuilder:printcolumn:name="Contract",type=string,JSONPath=`.spec.contractRef.name`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Gateway struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GatewaySpec   `json:"spec"`
	Status GatewayStatus `json:"status,omitempty"`
}

// GatewayList is a list of Gateways.
//
// +kubebuilder:object:root=true
type GatewayList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Gateway `json:"items"`
}

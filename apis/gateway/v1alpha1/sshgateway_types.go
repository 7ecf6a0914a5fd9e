/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SshGatewaySpec is which namespaces of a tenant SSH sessions may reach.
type SshGatewaySpec struct {
	// ContractRef is the requester's contract whose tenant is reached.
	// It cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="contractRef cannot change"
	ContractRef ContractRef `json:"contractRef"`
	// Namespaces of the tenant whose pods sessions may reach. Who may
	// open a session is the tenant's own RBAC: the DIDs it lets create
	// pods/exec there.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespaces []string `json:"namespaces"`
}

// SshGatewayStatus is what was published and where sessions go.
type SshGatewayStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Address is the bidder's SSH gateway (host:port, from its lease).
	// +optional
	Address string `json:"address,omitempty"`
	// HostKey is the SSH gateway's host key fingerprint (SHA256:..., from
	// the lease): check it when ssh first asks.
	// +optional
	HostKey string `json:"hostKey,omitempty"`
	// Tenant is the tenant's name at the SSH gateway (the record key of
	// its lease), which a session names.
	// +optional
	Tenant string `json:"tenant,omitempty"`
	// Command is how a session is opened: ssh -p <port> <handle-or-did>@<host> -- <tenant>/<namespace>/<pod> [command].
	// +optional
	Command string `json:"command,omitempty"`
	// Record is the dev.knotless.gateway.ssh record published in the
	// requester's repo.
	// +optional
	Record *RecordRef `json:"record,omitempty"`
	// Conditions: Published, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SshGateway lets SSH sessions into pods of some namespaces of the
// requester's tenant, through the SSH gateway of the bidder running it:
// knotless publishes a dev.knotless.gateway.ssh record in the
// requester's repo, and the bidder's agent lets in a session of a DID
// whose published keys (dev.knotless.gateway.sshKeys, in its own repo)
// hold the session's key, as an exec into the named pod, if the
// tenant's RBAC lets that DID create pods/exec there.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;gateway,shortName=ksshgw
// +kubebuilder:printcolumn:name="Contract",type=string,JSONPath=`.spec.contractRef.name`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="HostKey",type=string,JSONPath=`.status.hostKey`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SshGateway struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SshGatewaySpec   `json:"spec"`
	Status SshGatewayStatus `json:"status,omitempty"`
}

// SshGatewayList is a list of SshGateways.
//
// +kubebuilder:object:root=true
type SshGatewayList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SshGateway `json:"items"`
}

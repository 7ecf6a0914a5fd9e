/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// VMPhase is where a ComputeVM stands.
// +kubebuilder:validation:Enum=Pending;Provisioning;Running;Terminating;Terminated;Lost;Failed
type VMPhase string

// ComputeVM phases.
const (
	// VMPending: no agent has taken the VM up yet.
	VMPending VMPhase = "Pending"
	// VMProvisioning: the driver is starting the VM.
	VMProvisioning VMPhase = "Provisioning"
	// VMRunning: the VM runs and its tenant apiserver answers.
	VMRunning VMPhase = "Running"
	// VMTerminating: the VM is being stopped (the ComputeVM is deleted).
	VMTerminating VMPhase = "Terminating"
	// VMTerminated: the VM was stopped.
	VMTerminated VMPhase = "Terminated"
	// VMLost: the VM's process or machine is gone (status.reason says
	// how); the agent never starts it again by itself.
	VMLost VMPhase = "Lost"
	// VMFailed: the driver could not start the VM.
	VMFailed VMPhase = "Failed"
)

// Condition types and reasons of ComputeVM.
const (
	ConditionRunning = "Running"

	ReasonStarting      = "Starting"
	ReasonProcessGone   = "ProcessGone"
	ReasonDriverFailed  = "DriverFailed"
	ReasonUnknownDriver = "UnknownDriver"
)

// ComputeVMSpec is set by the bidder's provider (knotless-marketbidder)
// when it makes the VM for a contract, and never changed.
type ComputeVMSpec struct {
	// ContractName is the bidder's ComputeContract (same namespace) the VM
	// is for; it is also the VM's controller owner.
	// +kubebuilder:validation:MaxLength=253
	ContractName string `json:"contractName"`
	// Driver runs the VM (the agent's driver of that name).
	// +kubebuilder:validation:Enum=process;kind
	Driver string `json:"driver"`
	// CPUMillis is the VM's CPU in thousandths of a core.
	// +kubebuilder:validation:Minimum=1
	CPUMillis int64 `json:"cpuMillis"`
	// MemoryMiB is the VM's memory.
	// +kubebuilder:validation:Minimum=1
	MemoryMiB int64 `json:"memoryMiB"`
	// Admins are the requester's kcp users and groups that administer the
	// tenant (the mount forwards each request as the kcp user who made it).
	// +optional
	Admins TenantAdmins `json:"admins,omitempty"`
	// AdminDIDs are ATProto identities with every right on the tenant
	// (the requester's, from the accept record): a caller who presents a
	// service-auth token its PDS issued for the tenant (status.serviceID)
	// is the user named by its DID there.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]+$`
	// +listType=set
	// +optional
	AdminDIDs []string `json:"adminDIDs,omitempty"`
	// ServiceDID is the DID whose service the tenant is (the bidder's):
	// the tenant accepts ATProto service-auth tokens for this DID with a
	// fragment naming the VM (status.serviceID). Without it the tenant
	// accepts none.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ServiceDID string `json:"serviceDID,omitempty"`
}

// TenantAdmins are kcp users and groups that get every right on a tenant
// apiserver.
type TenantAdmins struct {
	// Users by name.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Users []string `json:"users,omitempty"`
	// Groups by name (system: groups are not forwarded by the mount).
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Groups []string `json:"groups,omitempty"`
}

// ComputeVMStatus is written only by the knotless-agent that runs the VM
// (field manager knotless-agent). Fields that are cleared (a lost VM has
// no endpoint) are always sent: the status is replaced whole.
type ComputeVMStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase of the VM.
	// +optional
	Phase VMPhase `json:"phase,omitempty"`
	// Reason says why the VM is Lost or Failed.
	// +optional
	Reason string `json:"reason"`
	// Endpoint is the URL of the VM's tenant apiserver (https).
	// +optional
	Endpoint string `json:"endpoint"`
	// CABundle is the PEM of the CA that signs the tenant apiserver's
	// serving certificate.
	// +optional
	CABundle string `json:"caBundle"`
	// CAFingerprint is "sha256:" and the lowercase hex SHA-256 of the DER
	// of every certificate of caBundle, in order: what the lease record
	// carries.
	// +optional
	CAFingerprint string `json:"caFingerprint"`
	// ServiceID is the tenant's service identity, the audience of the
	// service-auth tokens it accepts (spec.serviceDID and a fragment
	// naming the VM); what the lease record carries.
	// +optional
	ServiceID string `json:"serviceID,omitempty"`
	// Gateway is the public address (host:port) of the agent's gateway,
	// which serves the tenant's Services on the requester's hostnames;
	// what the lease record carries. Empty: the agent runs no gateway for
	// this VM's driver.
	// +optional
	// +kubebuilder:validation:MaxLength=261
	Gateway string `json:"gateway,omitempty"`
	// SSHAddress is the public address (host:port) of the agent's SSH
	// gateway, which lets sessions into the tenant's pods; what the lease
	// record carries. Empty: the agent runs none for this VM's driver.
	// +optional
	// +kubebuilder:validation:MaxLength=261
	SSHAddress string `json:"sshAddress,omitempty"`
	// SSHHostKey is the SSH gateway's host key fingerprint (SHA256:...),
	// for known_hosts; what the lease record carries.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SSHHostKey string `json:"sshHostKey,omitempty"`
	// CredentialSecret names the Secret (owned by the VM, key token) with
	// the credential the mount uses on the tenant: an identity made on the
	// tenant for this, that may impersonate and do nothing else.
	// +optional
	CredentialSecret string `json:"credentialSecret,omitempty"`
	// Enforced is the shape the running VM is held to, as the agent read
	// it back from the VM (only drivers that enforce a shape set it: kind);
	// null when the VM does not run.
	// +optional
	// +nullable
	Enforced *EnforcedShape `json:"enforced"`
	// Conditions: Running.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// EnforcedShape is what holds a VM to its shape: the limits of its
// machine and what its node offers pods.
type EnforcedShape struct {
	// LimitCPUMillis and LimitMemoryMiB are the limits of the VM's
	// machine (kind: its node container's docker CPU quota and memory).
	LimitCPUMillis int64 `json:"limitCPUMillis"`
	LimitMemoryMiB int64 `json:"limitMemoryMiB"`
	// AllocatableCPUMillis and AllocatableMemoryMiB are the node's
	// allocatable, what its pods may request (the VM's own control plane
	// included).
	AllocatableCPUMillis int64 `json:"allocatableCPUMillis"`
	AllocatableMemoryMiB int64 `json:"allocatableMemoryMiB"`
}

// ComputeVM is a VM with a tenant apiserver that a bidder runs for a
// contract. knotless-agent, next to the bidder's machines, runs it with a
// driver; the provider makes it from the bidder's ComputeContract and
// reads its endpoint, CA and credential to hand to the requester.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=cvm
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ComputeVM struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a ComputeVM's spec never changes"
	Spec   ComputeVMSpec   `json:"spec"`
	Status ComputeVMStatus `json:"status,omitempty"`
}

// ComputeVMList is a list of ComputeVMs.
//
// +kubebuilder:object:root=true
type ComputeVMList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ComputeVM `json:"items"`
}

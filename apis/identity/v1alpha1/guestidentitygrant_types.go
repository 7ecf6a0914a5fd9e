/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits and defaults of a GuestIdentityGrant's token lifetime (seconds).
// kcp takes no TokenRequest shorter than MinTokenDuration; tokens live
// at most MaxTokenDuration.
const (
	DefaultTokenDuration = 60 * 60
	MinTokenDuration     = 10 * 60
	MaxTokenDuration     = 60 * 60
)

// Reasons of a GuestIdentityGrant.
const (
	// ReasonGranted: the guest's Secret holds a current token.
	ReasonGranted = "Granted"
	// ReasonNotAdmitted: the grant's spec was not checked by knotless's
	// admission webhook (made before it was installed, or its
	// spec.admissionStamp was changed behind it); apply the spec again to
	// have it checked.
	ReasonNotAdmitted = "NotAdmitted"
	// ReasonGuestNotFound: the guest's namespace or ServiceAccount does
	// not exist in the tenant; looked at again every minute.
	ReasonGuestNotFound = "GuestNotFound"
	// ReasonNameTaken: a ServiceAccount, Role or RoleBinding of the
	// grant's name (knotless-guest-<uid>) exists in the namespace that
	// knotless did not make for it; nothing is granted.
	ReasonNameTaken = "NameTaken"
	// ReasonNotEnabled: this installation of knotless serves no
	// GuestIdentityGrants (its provider has no --guest-kcp-server).
	ReasonNotEnabled = "NotEnabled"
)

// Guest is a ServiceAccount of the tenant.
type Guest struct {
	// Namespace of the tenant the guest runs in; the Secret is written
	// there.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// ServiceAccount is the guest's ServiceAccount in that namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ServiceAccount string `json:"serviceAccount"`
}

// GuestIdentityGrantSpec is what a guest may do in this workspace.
type GuestIdentityGrantSpec struct {
	// ContractRef is the requester's contract whose tenant runs the guest.
	// It cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="contractRef cannot change"
	ContractRef ContractRef `json:"contractRef"`
	// Guest is the workload in the tenant that gets the identity. It
	// cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="guest cannot change"
	Guest Guest `json:"guest"`
	// Rules are what the guest may do in this namespace of the workspace
	// (a Role knotless makes). Exactly one of rules and clusterRole.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Rules []rbacv1.PolicyRule `json:"rules,omitempty"`
	// ClusterRole is a ClusterRole of this workspace bound to the guest in
	// this namespace (a RoleBinding). Exactly one of rules and
	// clusterRole.
	// +optional
	ClusterRole string `json:"clusterRole,omitempty"`
	// Duration is the life of each token: at least 10m, at most 1h;
	// default 1h. A new token replaces it when a third of it is left.
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
	// SecretName is the Secret knotless writes in the guest's namespace in
	// the tenant: kubeconfig, token, ca.crt, server and namespace. It
	// cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="secretName cannot change"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
	// AdmissionStamp is written by knotless's admission webhook on every
	// create and update it admits, having checked the rest of the spec
	// against its author's rights: a MAC of the workspace, namespace,
	// name and spec. Whatever else is written here is replaced; a grant
	// without a valid stamp is not served (NotAdmitted).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	AdmissionStamp string `json:"admissionStamp,omitempty"`
}

// GuestIdentityGrantStatus is what was granted.
type GuestIdentityGrantStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ServiceAccount is the kcp ServiceAccount of this namespace that is
	// the guest's identity in the workspace.
	// +optional
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// ExpirationTime is when the current token expires.
	// +optional
	ExpirationTime *metav1.Time `json:"expirationTime,omitempty"`
	// RenewalTime is when a new token replaces it.
	// +optional
	RenewalTime *metav1.Time `json:"renewalTime,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GuestIdentityGrant gives a workload running in the requester's tenant
// (the guest) an identity in the requester's kcp workspace: a kcp
// ServiceAccount bound to the rules asked, whose short-lived tokens
// knotless writes, with a kubeconfig through kcp-front-proxy, into a
// Secret of the guest's namespace in the tenant. A grant cannot give more
// than its author holds: knotless's admission webhook has kcp check the
// Role and RoleBinding it stands for as the author.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;identity,shortName=guest
// +kubebuilder:printcolumn:name="Contract",type=string,JSONPath=`.spec.contractRef.name`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.guest.namespace`
// +kubebuilder:printcolumn:name="ServiceAccount",type=string,JSONPath=`.spec.guest.serviceAccount`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GuestIdentityGrant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GuestIdentityGrantSpec   `json:"spec"`
	Status GuestIdentityGrantStatus `json:"status,omitempty"`
}

// GuestIdentityGrantList is a list of GuestIdentityGrants.
//
// +kubebuilder:object:root=true
type GuestIdentityGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestIdentityGrant `json:"items"`
}

/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Limits and defaults of a ClusterClientCertificate's lifetime. A
// Kubernetes signer takes no shorter lifetime than MinDuration (a
// CertificateSigningRequest's spec.expirationSeconds); a certificate
// cannot be revoked, so knotless issues none longer than MaxDuration.
const (
	DefaultDuration = 24 * 60 * 60 // seconds
	MinDuration     = 10 * 60
	MaxDuration     = 7 * 24 * 60 * 60
)

// Condition types and reasons of a ClusterClientCertificate.
const (
	// ConditionReady: the Secret holds a certificate the tenant issued
	// for the spec, and it is not due for renewal.
	ConditionReady = "Ready"

	// ReasonIssued: the Secret holds a current certificate.
	ReasonIssued = "Issued"
	// ReasonInvalidSpec: the spec cannot be issued as it is (the message
	// says which field and why); nothing is done until it changes.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonContractNotFound: spec.contractRef names no ComputeContract of
	// the namespace.
	ReasonContractNotFound = "ContractNotFound"
	// ReasonTenantNotReady: the contract is not Active, or its tenant is
	// not mounted yet; issued once it is.
	ReasonTenantNotReady = "TenantNotReady"
	// ReasonTenantRefused: the tenant did not take the request (the
	// provider's log says why); tried again after a backoff.
	ReasonTenantRefused = "TenantRefused"
	// ReasonUnsupported: the tenant signs no client certificates: it does
	// not serve the certificates API, or it left the request unsigned.
	ReasonUnsupported = "Unsupported"
	// ReasonSecretNameTaken: a Secret of spec.secretName exists that this
	// ClusterClientCertificate did not make; it is never overwritten.
	ReasonSecretNameTaken = "SecretNameTaken"
	// ReasonDeleting: the certificate's binding on the tenant and its
	// Secret are being removed.
	ReasonDeleting = "Deleting"
)

// ContractRef names a ComputeContract of the requester's side in the
// same namespace.
type ContractRef struct {
	// Name of the ComputeContract.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// ClusterClientCertificateSpec is the certificate wanted.
type ClusterClientCertificateSpec struct {
	// ContractRef is the requester's contract whose tenant issues the
	// certificate. The contract must be Active and its tenant mounted.
	// It cannot change: a certificate for another tenant is another
	// ClusterClientCertificate.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="contractRef cannot change"
	ContractRef ContractRef `json:"contractRef"`
	// User is the certificate's user name on the tenant (its subject's
	// common name): a DID or a name inside the tenant. The requester's
	// own DID, names with '#' and names starting with "system:",
	// "kubeadm" or "knotless" are refused.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	User string `json:"user"`
	// Groups are the certificate's groups on the tenant (its subject's
	// organizations). Groups starting with "system:" (system:masters is
	// above RBAC), "kubeadm" or "knotless" are refused.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Groups []string `json:"groups,omitempty"`
	// ClusterRole, when set, is bound to User on the tenant (a
	// ClusterRoleBinding knotless makes and deletes with this object),
	// for example view or edit. Unset, the user has what the tenant's own
	// RBAC already gives it.
	// +optional
	ClusterRole string `json:"clusterRole,omitempty"`
	// Duration is the certificate's lifetime: at least 10m, at most 168h
	// (7 days); default 24h.
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
	// RenewBefore is how long before the certificate expires a new one
	// (with a new key) is issued: at least 30s less than the duration;
	// default a third of it.
	// +optional
	RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
	// SecretName is the Secret of this namespace that knotless writes:
	// tls.crt, tls.key, ca.crt and kubeconfig. It is owned by this object
	// and cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="secretName cannot change"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
}

// ClusterClientCertificateStatus is what was issued.
type ClusterClientCertificateStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// NotBefore and NotAfter bound the current certificate's validity.
	// +optional
	NotBefore *metav1.Time `json:"notBefore,omitempty"`
	// +optional
	NotAfter *metav1.Time `json:"notAfter,omitempty"`
	// RenewalTime is when a new certificate will be issued.
	// +optional
	RenewalTime *metav1.Time `json:"renewalTime,omitempty"`
	// Issued identifies the current certificate: the SHA-256 of its DER
	// and of the spec it was issued for ("sha256:<hex>").
	// +optional
	Issued string `json:"issued,omitempty"`
	// Binding is the ClusterRoleBinding made on the tenant, when
	// spec.clusterRole is set.
	// +optional
	Binding string `json:"binding,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ClusterClientCertificate is a client certificate for the apiserver of a
// requester's own tenant, issued by that cluster's CA through its
// certificates API (a CertificateSigningRequest for
// kubernetes.io/kube-apiserver-client), for tools and people that cannot
// run an exec credential plugin. Its key is made by knotless and kept in
// the Secret only; it is renewed with a new key before it expires.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;identity,shortName=ccert
// +kubebuilder:printcolumn:name="Contract",type=string,JSONPath=`.spec.contractRef.name`
// +kubebuilder:printcolumn:name="User",type=string,JSONPath=`.spec.user`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Not-After",type=date,JSONPath=`.status.notAfter`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterClientCertificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterClientCertificateSpec   `json:"spec"`
	Status ClusterClientCertificateStatus `json:"status,omitempty"`
}

// ClusterClientCertificateList is a list of ClusterClientCertificates.
//
// +kubebuilder:object:root=true
type ClusterClientCertificateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterClientCertificate `json:"items"`
}

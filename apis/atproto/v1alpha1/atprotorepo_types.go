package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types and reasons of the atproto kinds.
const (
	ConditionReady  = "Ready"
	ConditionSynced = "Synced"

	ReasonReady                = "Ready"
	ReasonSynced               = "Synced"
	ReasonAuthenticationFailed = "AuthenticationFailed"
	ReasonPDSUnreachable       = "PDSUnreachable"
	ReasonCredentialNotFound   = "CredentialNotFound"
	ReasonCABundleNotFound     = "CABundleNotFound"
	ReasonVaultUnavailable     = "VaultUnavailable"
	ReasonRateLimited          = "RateLimited"
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonRepoNotReady         = "RepoNotReady"
	ReasonWriteFailed          = "WriteFailed"
	// ReasonInsecureURL: spec.pds.url is plain http to a host the operator
	// did not allow for it; credentials go only over https (R19).
	ReasonInsecureURL = "InsecureURL"
	// ReasonAddressNotAllowed: the PDS's address is one knotless may not
	// reach (loopback, private, link-local, metadata or reserved, R18).
	ReasonAddressNotAllowed = "AddressNotAllowed"
	// ReasonPDSRedirected: the PDS answered with a redirect, which is
	// never followed (R18).
	ReasonPDSRedirected = "PDSRedirected"
	// ReasonDIDMismatch: the DID the PDS logged in as has no DID document,
	// or its document names another PDS host than spec.pds.url or another
	// handle than the PDS's session (R20).
	ReasonDIDMismatch = "DIDMismatch"
	// ReasonDIDUnresolvable: the account's DID document could not be read
	// (the PLC directory or the did:web host did not answer with one).
	ReasonDIDUnresolvable = "DIDUnresolvable"
	// ReasonResponseTooLarge: the PDS, or the account's DID document, sent
	// more than knotless reads of that answer (R21).
	ReasonResponseTooLarge = "ResponseTooLarge"
)

// PDS says where a repo lives.
type PDS struct {
	// URL of the PDS, http(s)://host[:port] without a path, for example
	// https://pds.example.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^/?#@\s]+/?$`
	URL string `json:"url"`
	// CABundle, if set, is the PEM bundle that verifies the PDS's TLS
	// certificate instead of the system roots.
	// +optional
	CABundle *ObjectKeyRef `json:"caBundle,omitempty"`
}

// Credential says how knotless logs in to the account. Exactly one of
// secretKeyRef and vault is set; the referenced value is an app password.
// +kubebuilder:validation:XValidation:rule="has(self.secretKeyRef) != has(self.vault)",message="set exactly one of secretKeyRef and vault"
type Credential struct {
	// Identifier of the account: its handle, DID or email.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]|([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?|[^@\s]+@[^@\s]+)$`
	Identifier string `json:"identifier"`
	// SecretKeyRef is a key of a Secret in this workspace holding the app
	// password.
	// +optional
	SecretKeyRef *SecretKeyRef `json:"secretKeyRef,omitempty"`
	// Vault is a KV v2 key holding the app password.
	// +optional
	Vault *VaultKeyRef `json:"vault,omitempty"`
}

// AtprotoRepoSpec is written only by the user.
type AtprotoRepoSpec struct {
	// PDS is where the repo lives.
	PDS PDS `json:"pds"`
	// Credential is how knotless logs in to the account.
	Credential Credential `json:"credential"`
}

// AtprotoRepoStatus is written only by the atprotorepo controller.
type AtprotoRepoStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// DID of the account, as the PDS reported it.
	// +optional
	DID string `json:"did,omitempty"`
	// Handle of the account, as the PDS reported it.
	// +optional
	Handle string `json:"handle,omitempty"`
	// Rev is the repo's latest commit revision, as the PDS reported it.
	// +optional
	Rev string `json:"rev,omitempty"`
	// Conditions: Ready (logged in to the PDS), and Suspended while an
	// owner suspends the repo.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AtprotoRepo is an ATProto account and its repo on a PDS.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=atprotorepos,categories=knotless,shortName=arepo
// +kubebuilder:printcolumn:name="DID",type=string,JSONPath=`.status.did`
// +kubebuilder:printcolumn:name="Handle",type=string,JSONPath=`.status.handle`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRepo struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AtprotoRepoSpec   `json:"spec"`
	Status AtprotoRepoStatus `json:"status,omitempty"`
}

// AtprotoRepoList is a list of AtprotoRepos.
//
// +kubebuilder:object:root=true
type AtprotoRepoList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AtprotoRepo `json:"items"`
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phases of a TenantCluster: the values kcp's workspace mounts read from
// status.phase (only Ready makes the mounted workspace routable).
const (
	// PhaseInitializing: the spec or a referenced object is not usable yet.
	PhaseInitializing = "Initializing"
	// PhaseConnecting: the references resolve; the tenant has not answered
	// a probe through the mount proxy yet.
	PhaseConnecting = "Connecting"
	// PhaseReady: the last probe through the mount proxy succeeded.
	PhaseReady = "Ready"
	// PhaseUnknown: the last probe failed, or the mount proxy could not be
	// asked.
	PhaseUnknown = "Unknown"
)

// Condition types and reasons of TenantCluster.
const (
	// ConditionReady: the tenant answered the last probe through the mount
	// proxy.
	ConditionReady = "Ready"
	// ConditionMounted: the child workspace that mounts this TenantCluster
	// exists.
	ConditionMounted = "Mounted"

	ReasonReady              = "Ready"
	ReasonMounted            = "Mounted"
	ReasonInvalidSpec        = "InvalidSpec"
	ReasonCredentialNotFound = "CredentialNotFound"
	ReasonCABundleNotFound   = "CABundleNotFound"
	// ReasonCABundleNotBound: spec.caBundle is not the CA bundle bound in
	// the credential Secret (MountCredentialCAKey), or that Secret binds
	// none and spec.caBundle is not read from a Secret bound to spec.url.
	ReasonCABundleNotBound         = "CABundleNotBound"
	ReasonRevoked                  = "Revoked"
	ReasonRegistering              = "Registering"
	ReasonTenantUnreachable        = "TenantUnreachable"
	ReasonTenantCertificateInvalid = "TenantCertificateInvalid"
	ReasonCredentialRejected       = "CredentialRejected"
	ReasonTenantError              = "TenantError"
	// ReasonTenantRedirect: the tenant answered the probe with a redirect,
	// which knotless never follows nor passes on.
	ReasonTenantRedirect = "TenantRedirect"
	// ReasonAddressNotAllowed: the tenant's address is refused by the
	// operator's address policy (link-local, metadata, kcp's or the mount
	// proxy's own address, or a private range the operator did not allow).
	ReasonAddressNotAllowed     = "AddressNotAllowed"
	ReasonMountProxyUnavailable = "MountProxyUnavailable"
	ReasonConflict              = "Conflict"
)

// LabelMountCredential marks a Secret as a TenantCluster's credential or
// CA bundle: its value is the name of the one TenantCluster that may use
// it. A Secret without it (or labelled for another TenantCluster) is
// never read as a mount credential, so a user who may create
// TenantClusters but not read Secrets cannot have the mount proxy send
// someone else's token to a server of their choosing (R22).
const LabelMountCredential = "compute.knotless.dev/mount-credential"

// MountCredentialURLKey is the data key of a mount credential Secret
// (LabelMountCredential) that holds the one tenant URL it is for, written
// by whoever writes the Secret. A TenantCluster reads the Secret only if
// its spec.url is exactly that string, so whoever may update or re-create
// the labelled TenantCluster still cannot point the Secret's token at a
// server of their choosing (R22).
const MountCredentialURLKey = "url"

// MountCredentialCAKey is the data key of a mount credential Secret that
// holds the PEM CA bundle which verifies the tenant at its URL, written
// by whoever writes the Secret beside the token and the URL. The CA that
// verifies the tenant is this one: spec.caBundle must hold the same
// certificates (or name this key), so whoever may update the
// TenantCluster but not the Secret cannot swap in a CA of their own and
// have the token sent to a server that CA verifies (R22). A Secret
// without it (written before it existed) is used only with a
// spec.caBundle read from a Secret that is itself bound to spec.url.
const MountCredentialCAKey = "ca.crt"

// MountCredentialUsersKey and MountCredentialGroupsKey are the data keys
// of a market contract's mount credential (kept in the provider's
// workspace, spec.credential.market) that name, a line each, the only
// kcp users and groups the mount proxy asserts on the tenant
// (spec.tenantAdmins of the MarketRequester): a caller who is none of
// those users is refused, only the caller's groups named there are
// asserted, and no extra is.
const (
	MountCredentialUsersKey  = "impersonate-users"
	MountCredentialGroupsKey = "impersonate-groups"
)

// KeyRef names one key of a ConfigMap or Secret in a namespace of the
// TenantCluster's own workspace (a workspace can only use its own objects).
// The CA bundle and the credential must be in the same namespace; a Secret
// must be labelled compute.knotless.dev/mount-credential=<the
// TenantCluster's name> and hold the key url equal to spec.url.
type KeyRef struct {
	// Kind is ConfigMap or Secret.
	// +kubebuilder:validation:Enum=ConfigMap;Secret
	Kind string `json:"kind"`
	// Namespace of the object.
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the object's data.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// SecretRef names a Secret in a namespace of the TenantCluster's workspace:
// the CA bundle's namespace. The Secret must be labelled
// compute.knotless.dev/mount-credential=<the TenantCluster's name> and
// hold the key url with exactly the TenantCluster's spec.url.
type SecretRef struct {
	// Namespace of the Secret.
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// TenantCredential is what the mount proxy authenticates with on the
// tenant apiserver. The Secret holds either a client certificate
// (tls.crt and tls.key, as a kubernetes.io/tls Secret) or a bearer token
// (token). The credential must be allowed to impersonate: the proxy
// forwards every request as the kcp user who made it.
type TenantCredential struct {
	SecretRef SecretRef `json:"secretRef"`
	// Market says the credential is not in this workspace: it is the one
	// the provider keeps in its own workspace for this TenantCluster, the
	// mount of a market contract (the requester's identity on the
	// tenant, which no user of this workspace can read). The Secret
	// secretRef names then holds no credential, only the tenant's URL
	// and CA bundle, and both must be the ones the provider's credential
	// is bound to. Only a market contract's mount has such a credential:
	// a TenantCluster a user makes with it is refused
	// (CredentialNotFound).
	// +optional
	Market bool `json:"market,omitempty"`
}

// TenantClusterSpec is written only by the user (or the market
// controllers).
type TenantClusterSpec struct {
	// URL of the tenant apiserver, https only.
	// +kubebuilder:validation:Pattern=`^https://[^/?#]+(/[^?#]*)?$`
	URL string `json:"url"`
	// CABundle is the PEM bundle that verifies the tenant's serving
	// certificate; nothing else does (the system roots are not used).
	CABundle KeyRef `json:"caBundle"`
	// Credential the mount proxy uses on the tenant.
	Credential TenantCredential `json:"credential"`
	// Workspace is the name of the child workspace that mounts this
	// tenant; it defaults to the TenantCluster's name.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Workspace string `json:"workspace,omitempty"`
}

// TenantClusterStatus is written only by the tenantcluster controller.
type TenantClusterStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is Initializing, Connecting, Ready or Unknown; kcp makes the
	// mounted workspace routable only while it is Ready.
	// +optional
	// +kubebuilder:validation:Enum=Initializing;Connecting;Ready;Unknown
	Phase string `json:"phase,omitempty"`
	// URL is where kcp sends the mounted workspace's requests: the mount
	// proxy's path for this tenant, /tenants/<logical cluster>/<name>.
	// +optional
	URL string `json:"URL,omitempty"`
	// TenantVersion is the tenant's gitVersion, from the last successful
	// probe.
	// +optional
	TenantVersion string `json:"tenantVersion,omitempty"`
	// Conditions: Ready (the last probe through the mount proxy) and
	// Mounted (the child workspace exists).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TenantCluster is a tenant apiserver mounted into kcp: knotless probes it
// through the mount proxy and creates a child workspace whose spec.mount
// refers to it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=tenantclusters,scope=Cluster,categories=knotless,shortName=tc
// +kubebuilder:metadata:annotations="experimental.tenancy.kcp.io/is-mount=true"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.URL`,priority=1
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.tenantVersion`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TenantCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantClusterSpec   `json:"spec"`
	Status TenantClusterStatus `json:"status,omitempty"`
}

// TenantClusterList is a list of TenantClusters.
//
// +kubebuilder:object:root=true
type TenantClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantCluster `json:"items"`
}

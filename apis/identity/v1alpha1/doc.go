// Package v1alpha1 contains the identity.knotless.dev API: identities on a
// requester's own tenant that knotless issues through the tenant's own
// APIs (ClusterClientCertificate).
//
// +kubebuilder:object:generate=true
// +groupName=identity.knotless.dev
package v1alpha1

// Package v1alpha1 contains the compute.knotless.dev API: tenant
// apiservers mounted into kcp (TenantCluster).
//
// +kubebuilder:object:generate=true
// +groupName=compute.knotless.dev
package v1alpha1

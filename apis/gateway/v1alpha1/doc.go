// Package v1alpha1 contains the gateway.knotless.dev API: a Service of a
// requester's tenant served on a public hostname by the gateway of the
// bidder running the tenant (Gateway).
//
// +kubebuilder:object:generate=true
// +groupName=gateway.knotless.dev
package v1alpha1

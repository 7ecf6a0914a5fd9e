// Package v1alpha1 contains the atproto.knotless.dev API: ATProto repos
// (accounts on a PDS) and the records knotless keeps in them.
//
// +kubebuilder:object:generate=true
// +groupName=atproto.knotless.dev
package v1alpha1

// Package v1alpha1 contains the apps.knotless.dev API: Application, the
// root of an application team's declared state.
//
// +kubebuilder:object:generate=true
// +groupName=apps.knotless.dev
package v1alpha1

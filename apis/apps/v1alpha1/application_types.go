package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ApplicationPhase is the coarse state of an Application.
// +kubebuilder:validation:Enum=Pending;Progressing;Ready;Suspended;Failed;Deleting
type ApplicationPhase string

const (
	ApplicationPending     ApplicationPhase = "Pending"
	ApplicationProgressing ApplicationPhase = "Progressing"
	ApplicationReady       ApplicationPhase = "Ready"
	ApplicationSuspended   ApplicationPhase = "Suspended"
	ApplicationFailed      ApplicationPhase = "Failed"
	ApplicationDeleting    ApplicationPhase = "Deleting"
)

// ConditionReady is the condition type every knotless kind reports.
const ConditionReady = "Ready"

// ApplicationSpec is written only by the application team.
type ApplicationSpec struct {
	// Suspend stops the application from creating or changing anything.
	// Release and clean-up of what already runs continue.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// Description is a short human text shown in listings.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Description string `json:"description,omitempty"`
}

// ApplicationStatus is written by the application controller only
// (field manager "knotless-application").
type ApplicationStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase summarises the conditions.
	// +optional
	Phase ApplicationPhase `json:"phase,omitempty"`

	// Conditions: Ready, with a CamelCase reason and a human message.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Application is the root of an application in a socialweb-application
// workspace.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=knotless
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Application struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ApplicationSpec   `json:"spec,omitempty"`
	Status ApplicationStatus `json:"status,omitempty"`
}

// ApplicationList is a list of Applications.
//
// +kubebuilder:object:root=true
type ApplicationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Application `json:"items"`
}

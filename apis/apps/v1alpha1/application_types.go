package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
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

// Condition reasons of Application and Component.
const (
	ReasonReady               = "Ready"
	ReasonProgressing         = "Progressing"
	ReasonSuspended           = "Suspended"
	ReasonFailed              = "Failed"
	ReasonDeleting            = "Deleting"
	ReasonInvalidSpec         = "InvalidSpec"
	ReasonApplicationNotFound = "ApplicationNotFound"
	ReasonOwnerCycle          = "OwnerCycle"
	ReasonConflict            = "Conflict"
)

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

	// Components are the parts of the application. Each becomes a
	// Component of the same name, owned by the Application, which owns
	// one child object made from the template.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Components []ApplicationComponent `json:"components,omitempty"`
}

// ApplicationComponent is one entry of Application spec.components.
type ApplicationComponent struct {
	// Name of the Component and of its child object (a DNS-1123 label,
	// unique in the namespace).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Template of the child object.
	Template ComponentTemplate `json:"template"`
}

// ComponentTemplate describes the one child object of a Component. Exactly
// one field is set.
//
// +kubebuilder:validation:XValidation:rule="[has(self.atprotoRepo), has(self.atprotoRecord), has(self.marketRequester)].filter(x, x).size() == 1",message="set exactly one of atprotoRepo, atprotoRecord and marketRequester"
type ComponentTemplate struct {
	// AtprotoRepo is the spec of an AtprotoRepo.
	// +optional
	AtprotoRepo *atprotov1alpha1.AtprotoRepoSpec `json:"atprotoRepo,omitempty"`
	// AtprotoRecord is the spec of an AtprotoRecord.
	// +optional
	AtprotoRecord *atprotov1alpha1.AtprotoRecordSpec `json:"atprotoRecord,omitempty"`
	// MarketRequester is the spec of a MarketRequester: the application
	// buys its VMs in a market, and its suspend releases them.
	// +optional
	MarketRequester *marketv1alpha1.MarketRequesterSpec `json:"marketRequester,omitempty"`
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

	// Market is reserved for the market controller, its only writer
	// (field manager "knotless-market"); the application controller never
	// writes it.
	// +optional
	Market *ApplicationMarketStatus `json:"market,omitempty"`
}

// ApplicationMarketStatus is the market controller's view of the
// application's compute purchases.
type ApplicationMarketStatus struct {
	// ObservedGeneration is the Application generation the market
	// controller acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase of the purchase (set by the market controller).
	// +optional
	Phase string `json:"phase,omitempty"`
	// Message is a short human text.
	// +optional
	Message string `json:"message,omitempty"`
}

// Application is the root of an application in a socialweb-application
// workspace.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=knotless,shortName=kapp
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
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

// ComponentPhase is the coarse state of a Component.
// +kubebuilder:validation:Enum=Pending;Progressing;Ready;Suspended;Failed;Deleting
type ComponentPhase string

const (
	ComponentPending     ComponentPhase = "Pending"
	ComponentProgressing ComponentPhase = "Progressing"
	ComponentReady       ComponentPhase = "Ready"
	ComponentSuspended   ComponentPhase = "Suspended"
	ComponentFailed      ComponentPhase = "Failed"
	ComponentDeleting    ComponentPhase = "Deleting"
)

// ComponentSpec is written by the application controller from the
// Application's spec.components, except Suspend, which is the user's.
type ComponentSpec struct {
	// Suspend suspends this component only. It can only add to the
	// Application's suspend: a component never runs while its Application
	// is suspended (effective suspend = Application suspend OR this).
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// Template of the child object, named like the Component.
	Template ComponentTemplate `json:"template"`
}

// ChildRef names a Component's child object (same namespace).
type ChildRef struct {
	// APIVersion of the child.
	APIVersion string `json:"apiVersion"`
	// Kind of the child.
	Kind string `json:"kind"`
	// Name of the child (the Component's name).
	Name string `json:"name"`
}

// ComponentStatus is written by the component controller only (field
// manager "knotless-component").
type ComponentStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the conditions.
	// +optional
	Phase ComponentPhase `json:"phase,omitempty"`
	// Child is the object the component owns.
	// +optional
	Child *ChildRef `json:"child,omitempty"`
	// Conditions: Ready mirrors the child's readiness.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Component is one part of an Application (its owner). It owns exactly one
// child object made from its template and mirrors that child's readiness.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=knotless,shortName=kcomp
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.status.child.kind`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Component struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ComponentSpec   `json:"spec,omitempty"`
	Status ComponentStatus `json:"status,omitempty"`
}

// ComponentList is a list of Components.
//
// +kubebuilder:object:root=true
type ComponentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Component `json:"items"`
}

// SuspendRequested reports spec.suspend (internal/suspend.Requester).
func (a *Application) SuspendRequested() bool { return a.Spec.Suspend }

// SuspendRequested reports spec.suspend (internal/suspend.Requester).
func (c *Component) SuspendRequested() bool { return c.Spec.Suspend }
